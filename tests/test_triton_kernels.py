"""The Triton norm + SiLU kernels equal the torch fallbacks, stay accurate for large means and address
tensors past 2^31 elements.

CI has no GPU, so the kernels run in Triton's interpreter (TRITON_INTERPRET=1, NumPy on the CPU),
in a subprocess because the interpreter is chosen when Triton is first imported (and because a
wrapped 32-bit address kills the process). On CUDA the same comparisons run natively, including
inside the model.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.reference import REPO, assert_exact

triton = pytest.importorskip("triton", reason="Triton is not installed (requirements-dev.txt installs it)")


def interpreted(code: str, timeout: float = 600) -> str:
    """Run `code` with the Triton interpreter; its last printed line. The caller's PYTHONPATH stays behind the
    repository (another Triton than the environment's: tests/test_triton_targets.py's docstring says how)."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                            cwd=REPO, timeout=timeout)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    return result.stdout.strip().splitlines()[-1]


PARITY = """
    import torch
    from vae.kernels import norm_act, triton_norm

    def err(got, want):  # the difference relative to max(1, max |want|), as every exactness bound
        return ((got - want).abs().max() / max(1.0, want.abs().max().item())).item()

    torch.manual_seed(0)
    worst = 0.0
    for shape, groups in [((1, 8, 3, 5, 7), 4), ((2, 6, 2, 9, 4), 3)]:
        x = torch.randn(shape) * 3 + 1.5
        weight, bias = torch.randn(shape[1]), torch.randn(shape[1])
        mean, var = triton_norm.group_norm_moments(x, groups)
        ref_mean, ref_var = norm_act.group_norm_moments(x, groups)
        worst = max(worst, err(mean, ref_mean), err(var, ref_var))
        # write into a strided view, as the causal convs' input buffers are
        buf = torch.zeros(shape[0], shape[1], shape[2] + 2, shape[3] + 1, shape[4] + 1)
        view = buf[:, :, 2:, :shape[3], :shape[4]]
        b, c, t = shape[:3]
        rstd = torch.rsqrt(ref_var + 1e-6)
        centre = ref_mean.repeat_interleave(c // groups, dim=1)
        scale = rstd.repeat_interleave(c // groups, dim=1) * weight.view(1, c, 1)
        triton_norm.center_scale_act(x, centre, scale, bias.view(1, c, 1).expand(b, c, t), True, view)
        expected = norm_act.group_norm_act(x, groups, weight, bias, 1e-6)
        worst = max(worst, err(view, expected))
        assert buf[:, :, :2].abs().max() == 0 and buf[..., -1].abs().max() == 0, "wrote outside the view"
        gamma = torch.randn(shape[1], 1, 1, 1)
        out = torch.empty_like(x)
        triton_norm.rms_norm_act(x[:, :, :, 1:, :], gamma, 1e-12, True, out[:, :, :, 1:, :])
        worst = max(worst, err(out[:, :, :, 1:], norm_act.rms_norm_act(x[:, :, :, 1:], gamma)))
    print(worst)
"""


def test_kernels_match_torch_in_the_interpreter():
    assert float(interpreted(PARITY)) < 1e-4


# The channels-last kernels ([pixels, channels] tiles) on tile views of NDHWC frames, writing into a
# strided view of an NDHWC buffer; channel counts that are not powers of 2 (Wan's 96, 384) included.
CHANNELS_LAST_PARITY = """
    import torch
    from vae.kernels import norm_act, triton_norm

    def err(got, want):  # the difference relative to max(1, max |want|), as every exactness bound
        return ((got - want).abs().max() / max(1.0, want.abs().max().item())).item()

    torch.manual_seed(0)
    worst = 0.0
    for (b, c, t, h, w), groups, dtype in [((1, 8, 3, 5, 7), 4, torch.float32), ((2, 12, 2, 9, 4), 3, torch.float32),
                                           ((1, 96, 2, 6, 5), 32, torch.bfloat16)]:
        frame = (torch.randn(b, c, t, h + 2, w + 3) * 3 + 1.5).to(dtype).contiguous(memory_format=torch.channels_last_3d)
        x = frame[..., 1:1 + h, 2:2 + w]  # a tile view: channels innermost, rows strided
        assert x.stride(1) == 1
        planes = x.contiguous()
        tol = 1.0 if dtype == torch.float32 else 1e-3  # bf16 output: its rounding, relative to 1e-4
        mean, var = triton_norm.group_norm_moments(x, groups)
        ref_mean, ref_var = norm_act.torch_group_moments(planes.double(), groups)
        worst = max(worst, err(mean, ref_mean), err(var, ref_var))
        weight, bias = torch.randn(c), torch.randn(c)
        rstd = torch.rsqrt(ref_var.float() + 1e-6)
        centre = ref_mean.float().repeat_interleave(c // groups, dim=1)
        scale = rstd.repeat_interleave(c // groups, dim=1) * weight.view(1, c, 1)
        buf = torch.zeros(b, c, t + 2, h + 1, w + 1, dtype=dtype).contiguous(memory_format=torch.channels_last_3d)
        view = buf[:, :, 2:, :h, :w]
        triton_norm.center_scale_act(x, centre, scale, bias.view(1, c, 1).expand(b, c, t), True, view)
        expected = norm_act.group_norm_act(planes, groups, weight, bias, 1e-6)
        worst = max(worst, err(view.float(), expected.float()) * tol)
        assert buf[:, :, :2].abs().max() == 0 and buf[..., -1].abs().max() == 0, "wrote outside the view"
        gamma = torch.randn(c, 1, 1, 1)
        out = torch.zeros_like(frame)
        triton_norm.rms_norm_act(x, gamma, 1e-12, True, out[..., 1:1 + h, 2:2 + w])
        got = out[..., 1:1 + h, 2:2 + w].float()
        worst = max(worst, err(got, norm_act.rms_norm_act(planes, gamma).float()) * tol)
        assert out[..., :1, :].abs().max() == 0, "wrote outside the view"
    print(worst)
"""


def test_channels_last_kernels_match_torch_in_the_interpreter():
    assert float(interpreted(CHANNELS_LAST_PARITY)) < 1e-4


# Statistics and normalised output against float64 for means far above the spread (std 1). The
# statistics must hold 1e-5 relative error; the output cannot beat the float32 rounding of the mean
# itself (ulp(mean) / std), so it is held to one float32 ulp of max(mean, 8).
LARGE_MEANS = """
    import math, torch
    import torch.nn.functional as F
    from vae.kernels import norm_act
    USE_TRITON = {use_triton}
    LAYOUT = torch.{memory_format}
    if USE_TRITON:
        from vae.kernels import triton_norm

    g = torch.Generator().manual_seed(0)
    worst_stats, worst_out = 0.0, 0.0
    for centre in (0.0, 1e2, 1e3, 1e4):
        b, c, t, h, w, groups = 1, 8, 2, 33, 40, 2  # 1320 pixels: two partial blocks per frame
        x = (torch.randn(b, c, t, h, w, generator=g) + centre).contiguous(memory_format=LAYOUT)
        x64 = x.double()
        grouped = x64.reshape(b, groups, c // groups, t, h * w)
        ref_mean, ref_var = grouped.mean(dim=(2, 4)), grouped.var(dim=(2, 4), unbiased=False)
        if USE_TRITON:
            mean, var = triton_norm.group_norm_moments(x, groups)
        else:
            mean, var = norm_act.group_norm_moments(x, groups)
        worst_stats = max(worst_stats, ((var.double() - ref_var).abs() / ref_var).max().item(),
                          ((mean.double() - ref_mean).abs() / ref_mean.abs().clamp_min(1)).max().item())
        weight, bias = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
        if not USE_TRITON:
            y = norm_act.group_norm_act(x, groups, weight, bias, 1e-6, act=False)
        else:
            rstd = torch.rsqrt(var + 1e-6)
            k = c // groups
            y = triton_norm.center_scale_act(x, mean.repeat_interleave(k, 1), rstd.repeat_interleave(k, 1) * weight.view(1, c, 1),
                                             bias.view(1, c, 1).expand(b, c, t), False, torch.empty_like(x))
        ref = F.group_norm(x64.transpose(1, 2).reshape(b * t, c, h, w), groups, weight.double(), bias.double(), 1e-6)
        ref = ref.reshape(b, t, c, h, w).transpose(1, 2)
        allowance = 2.0 ** (math.frexp(max(centre, 8.0))[1] - 24)  # one float32 ulp of the mean (outputs reach ~8)
        worst_out = max(worst_out, (y.double() - ref).abs().max().item() / allowance)
    print(worst_stats, worst_out)
"""


@pytest.mark.parametrize("memory_format", ["contiguous_format", "channels_last_3d"])
@pytest.mark.parametrize("kernels", ["triton", "torch"])
def test_group_norm_is_accurate_for_large_means(kernels, memory_format):
    """Both layouts (NDHWC: the channels-last kernels, several tiles per block and two blocks per frame)."""
    code = LARGE_MEANS.replace("{use_triton}", str(kernels == "triton")).replace("{memory_format}", memory_format)
    if kernels == "triton":
        stats, out = (float(v) for v in interpreted(code).split())
    else:
        namespace = {}
        exec(compile(textwrap.dedent(code).replace("print(worst_stats, worst_out)", "result = (worst_stats, worst_out)"),
                     "large_means", "exec"), namespace)
        stats, out = namespace["result"]
    assert stats <= 1e-5, f"{kernels}: statistics off by {stats:.2e} relative"
    assert out <= 1.0, f"{kernels}: output off by {out:.2f} float32 ulps of the mean (allowed 1)"


# A 4-channel bf16 view whose channel stride is 2^30 elements: its last channel starts 6 GiB into the
# storage, past what int32 offsets reach. The storage is allocated but only the touched pages become
# resident (a few KiB). 32-bit address arithmetic reads wrapped addresses (a crash or garbage).
HUGE_STRIDES = """
    import torch
    from vae.kernels import norm_act, triton_norm

    def err(got, want):  # the difference relative to max(1, max |want|), as every exactness bound
        return ((got - want).abs().max() / max(1.0, want.abs().max().item())).item()

    stride = 2 ** 30
    storage = torch.empty(3 * stride + 16, dtype=torch.bfloat16)
    x = storage.as_strided((1, 4, 1, 4, 4), (4 * stride, stride, 16, 4, 1))
    g = torch.Generator().manual_seed(0)
    x.copy_(torch.randn(1, 4, 1, 4, 4, generator=g))
    small = x.contiguous()
    mean, var = triton_norm.group_norm_moments(x, 2)
    ref_mean, ref_var = norm_act.group_norm_moments(small, 2)
    worst = max(err(mean, ref_mean), err(var, ref_var))
    ones = torch.ones(1, 4, 1)
    y = triton_norm.center_scale_act(x, ref_mean.repeat_interleave(2, 1), torch.rsqrt(ref_var + 1e-6).repeat_interleave(2, 1),
                                     0 * ones, True, torch.empty_like(small))
    worst = max(worst, err(y.float(), norm_act.group_norm_act(small, 2, ones.flatten(), 0 * ones.flatten(), 1e-6).float()))
    gamma = torch.rand(4, 1, 1, 1, generator=g)
    r = triton_norm.rms_norm_act(x, gamma, 1e-12, True, torch.empty_like(small))
    worst = max(worst, err(r.float(), norm_act.rms_norm_act(small, gamma).float()))
    print(worst)
"""


def test_kernels_address_past_2_31_elements_in_the_interpreter():
    assert float(interpreted(HUGE_STRIDES)) < 2e-2  # bf16 outputs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernels_address_past_2_31_elements_on_cuda():
    """A real bf16 activation past 2^31 elements (4.3 GB), as SeedVR2 decodes at 1080p make."""
    from vae.kernels import norm_act

    free, _ = torch.cuda.mem_get_info()
    if free < 14 * 2**30:
        pytest.skip("needs ~14 GiB of free GPU memory")
    x = torch.randn(1, 64, 2, 4096, 4200, device="cuda", dtype=torch.bfloat16)
    assert x.numel() > 2 ** 31
    weight, bias = torch.rand(64, device="cuda") + 0.5, torch.randn(64, device="cuda")
    y = norm_act.group_norm_act(x, 16, weight, bias, 1e-6, triton=True)
    for i in range(x.shape[2]):  # the torch path one frame at a time as the reference
        ref = norm_act.group_norm_act(x[:, :, i:i + 1], 16, weight, bias, 1e-6, triton=False)
        assert_exact(y[:, :, i:i + 1].float(), ref.float(), atol=2e-2, rtol=2e-2)
    del y
    gamma = torch.rand(64, 1, 1, 1, device="cuda")
    r = norm_act.rms_norm_act(x, gamma, triton=True)
    assert_exact(r[:, :, -1:].float(), norm_act.rms_norm_act(x[:, :, -1:], gamma).float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["seedvr2", "wan21"])
def test_triton_path_matches_torch_in_the_model_on_cuda(family):
    """fp32: the Triton and torch norms agree to float32 rounding. bf16: both are compared with the
    fp32 decode, and the Triton path may not be further from it than the torch path (bf16 rounding of
    two different kernels differs element by element, so they are not compared with each other)."""
    import vae
    from vae.kernels import BackendFlags, Optimizations, backend, kernel_check
    from tests.reference import load_tiny

    for dtype in (torch.float32, torch.bfloat16):
        failed = [v for v in kernel_check.verdicts(kernel_check.device_name("cuda"), dtype).values() if not v.passed]
        assert not failed, f"Triton kernels failed their first-use check on this GPU: {failed}"
    z = torch.randn(1, 16, 3, 8, 8, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    decoded = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = load_tiny(family, device="cuda", dtype=dtype)
        for triton_on in (False, True):
            opts = Optimizations().with_(triton_norm=triton_on)
            with backend.applied(BackendFlags(tf32=False)):  # TF32 would round the fp32 comparison to 1e-3
                decoded[dtype, triton_on] = vae.decode(model, z.to(dtype), opts=opts).float()
    assert_exact(decoded[torch.float32, True], decoded[torch.float32, False], atol=1e-4, rtol=1e-4)
    reference = decoded[torch.float32, False]
    error = {t: (decoded[torch.bfloat16, t] - reference).norm() / reference.norm() for t in (False, True)}
    assert error[True] <= 1.25 * error[False] + 1e-4, error
