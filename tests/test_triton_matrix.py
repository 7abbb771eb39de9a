"""The Triton norm kernels against the norms' definitions in float64, on the inputs the parity tests
(tests/test_triton_kernels.py) do not meet: 1, 5 and 65 channels per group, 520 channels (a channels-last
tile of 1024 channels), no frames at all (T = 0), an output in the other memory layout than the input,
fp16, and NaN in the input (the output NaN exactly where torch's is).

In Triton's interpreter (a subprocess, as there). A bf16 input is written to a float32 output: the
interpreter truncates float32 to bf16 where the GPU rounds to nearest, so the kernels' arithmetic is
checked here and the GPU's rounding in the code compiled for it (tests/test_triton_targets.py). An fp16
output is rounded to nearest here as on the GPU: within half a unit in the last place of the definition
(the first-use check's bounds, `kernel_check.TOLERANCE`).
"""
import json

import pytest

triton = pytest.importorskip("triton", reason="Triton is not installed (requirements-dev.txt installs it)")
from tests.test_triton_kernels import interpreted  # noqa: E402 (needs Triton)

MATRIX = """
    import json, math
    import torch
    import torch.nn.functional as F
    from vae.kernels import norm_act, triton_norm
    from vae.kernels.kernel_check import STATS_TOLERANCE, TOLERANCE
    from vae.kernels.activation_layout import FORMATS

    # ((B, C, T, H, W), groups, input layouts): 1, 5, 65 channels per group; 520 channels, 65 per group, in
    # tiles of 4 pixels x 1024 channels (the channels-last kernels' only: the channel-plane kernels do not
    # tile channels, and channels-last 65 per group take seconds in the interpreter); no frames
    CASES = {"1 per group": ((1, 4, 2, 5, 6), 4, ("ncdhw", "ndhwc")), "5 per group": ((2, 10, 1, 7, 3), 2, ("ncdhw", "ndhwc")),
             "65 per group": ((1, 130, 1, 3, 4), 2, ("ncdhw",)), "520 channels": ((1, 520, 1, 3, 3), 8, ("ndhwc",)),
             "T = 0": ((1, 8, 0, 4, 4), 2, ("ncdhw", "ndhwc"))}
    # (input dtype, output dtype, output in the input's layout, a NaN in the input): one per case and input
    # layout, in turn, so that each layout meets both (the interpreter takes seconds per run from 65 channels)
    RUNS = [(torch.float16, torch.float16, True, False), (torch.bfloat16, torch.float32, False, True)]
    g = torch.Generator().manual_seed(0)

    def error(got, want):
        '''max |got - want| / max(1, |want|), infinite where one is NaN and the other is not.'''
        if not torch.equal(got.isnan(), want.isnan()):
            return math.inf
        keep = ~want.isnan()
        if not keep.any():
            return 0.0
        got, want = got.double()[keep], want.double()[keep]
        return ((got - want).abs() / want.abs().clamp_min(1)).max().item()

    def group_norm(x, groups, weight, bias):  # SiLU(GroupNorm) per frame in float64; mean, var B,G,T
        b, c, t, h, w = x.shape
        grouped = x.double().reshape(b, groups, c // groups, t, h * w)
        mean, var = grouped.mean((2, 4)), grouped.var((2, 4), unbiased=False)
        y = (grouped - mean[:, :, None, :, None]) / (var[:, :, None, :, None] + 1e-6).sqrt()
        y = y.reshape(x.shape) * weight.double().view(1, c, 1, 1, 1) + bias.double().view(1, c, 1, 1, 1)
        return F.silu(y), mean, var

    def rms_norm(x, gamma):  # SiLU(x / max(||x||, eps) * sqrt(C) * gamma) over channels, float64
        x64 = x.double()
        y = x64 / x64.norm(dim=1, keepdim=True).clamp_min(1e-12) * math.sqrt(x.shape[1]) * gamma.double().view(1, -1, 1, 1, 1)
        return F.silu(y)

    worst, empty = {}, {}
    for i, (case, (shape, groups, layouts)) in enumerate(CASES.items()):
        b, c, t = shape[:3]
        for j, layout in enumerate(layouts):
            dtype, out_dtype, same_layout, nan = RUNS[(i + j) % len(RUNS)]
            x = (torch.randn(shape, generator=g) * 2 + 1).to(dtype).contiguous(memory_format=FORMATS[layout])
            if nan and x.numel():
                x[0, c // 2, 0, 1, 1] = math.nan  # its group's statistics and its pixel's RMS norm
            out_layout = layout if same_layout else ("ndhwc" if layout == "ncdhw" else "ncdhw")
            out = lambda: torch.full(shape, 7.0, dtype=out_dtype).contiguous(memory_format=FORMATS[out_layout])
            weight, bias = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
            gamma = torch.rand(c, 1, 1, 1, generator=g) + 0.5
            want, want_mean, want_var = group_norm(x, groups, weight, bias)
            mean, var = triton_norm.group_norm_moments(x, groups)
            terms = triton_norm.apply_terms(mean, torch.rsqrt(var + 1e-6), weight, bias)
            gn = triton_norm.center_scale_act(x, *terms, True, out())
            rms = triton_norm.rms_norm_act(x, gamma, 1e-12, True, out())
            name = f"{case} {layout} -> {out_layout} {str(dtype)[6:]} -> {str(out_dtype)[6:]}" + (" NaN" if nan else "")
            worst[name] = max(error(mean, want_mean) / STATS_TOLERANCE, error(var, want_var) / STATS_TOLERANCE,
                              error(gn, want) / TOLERANCE[out_dtype], error(rms, rms_norm(x, gamma)) / TOLERANCE[out_dtype])
            if not t:  # nothing to compute, nothing written, as torch's path
                torch_mean, _ = norm_act.group_norm_moments(x, groups)
                empty[name] = [list(mean.shape), list(torch_mean.shape), list(gn.shape), list(rms.shape)]
    print(json.dumps({"worst": worst, "empty": empty}))
"""


@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_kernels_equal_the_definitions_across_channels_layouts_dtypes_and_nan():
    result = json.loads(interpreted(MATRIX))
    failed = {name: worst for name, worst in result["worst"].items() if not worst <= 1}
    assert len(result["worst"]) == 8 and not failed, failed  # in units of each output's bound
    assert result["empty"] and all(shapes == [[1, 2, 0], [1, 2, 0], [1, 8, 0, 4, 4], [1, 8, 0, 4, 4]]
                                   for shapes in result["empty"].values()), result["empty"]
