"""The Triton norm + SiLU kernels equal the torch fallbacks.

CI has no GPU, so the kernels run in Triton's interpreter (TRITON_INTERPRET=1, NumPy on the CPU),
in a subprocess because the interpreter is chosen when Triton is first imported. On CUDA the same
comparison runs natively, including inside the model.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.reference import REPO

triton = pytest.importorskip("triton", reason="Triton is not installed (requirements-dev.txt installs it)")

INTERPRETED = textwrap.dedent("""
    import torch
    from optimizations import norm_act, triton_norm

    torch.manual_seed(0)
    worst = 0.0
    for shape, groups in [((1, 8, 3, 5, 7), 4), ((2, 6, 2, 9, 4), 3)]:
        x = torch.randn(shape) * 3 + 1.5
        weight, bias = torch.randn(shape[1]), torch.randn(shape[1])
        mean, var = triton_norm.group_norm_moments(x, groups)
        ref_mean, ref_var = norm_act.group_norm_moments(x, groups)
        worst = max(worst, (mean - ref_mean).abs().max().item(), (var - ref_var).abs().max().item())
        # write into a strided view, as the causal convs' input buffers are
        buf = torch.zeros(shape[0], shape[1], shape[2] + 2, shape[3] + 1, shape[4] + 1)
        view = buf[:, :, 2:, :shape[3], :shape[4]]
        rstd = torch.rsqrt(ref_var + 1e-6)
        b, c, t = shape[:3]
        scale = (rstd.view(b, groups, 1, t) * weight.view(1, groups, c // groups, 1)).reshape(b, c, t)
        shift = (bias.view(1, groups, c // groups, 1) - ref_mean.view(b, groups, 1, t) * scale.view(b, groups, c // groups, t)).reshape(b, c, t)
        triton_norm.scale_shift_act(x, scale, shift, True, view)
        expected = norm_act.group_norm_act(x, groups, weight, bias, 1e-6)
        worst = max(worst, (view - expected).abs().max().item())
        assert buf[:, :, :2].abs().max() == 0 and buf[..., -1].abs().max() == 0, "wrote outside the view"
        gamma = torch.randn(shape[1], 1, 1, 1)
        out = torch.empty_like(x)
        triton_norm.rms_norm_act(x[:, :, :, 1:, :], gamma, 1e-12, True, out[:, :, :, 1:, :])
        worst = max(worst, (out[:, :, :, 1:] - norm_act.rms_norm_act(x[:, :, :, 1:], gamma)).abs().max().item())
    print(worst)
""")


def test_kernels_match_torch_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", INTERPRETED], capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(result.stdout.strip().splitlines()[-1]) < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["seedvr2", "wan21"])
def test_triton_path_matches_torch_in_the_model_on_cuda(family):
    from optimizations import Optimizations
    from tests.reference import load_tiny

    model = load_tiny(family, device="cuda", dtype=torch.bfloat16)
    z = torch.randn(1, model.latent_channels, 3, 8, 8, device="cuda")
    model.opts = Optimizations().with_(triton_norm=False)
    expected = model.decode(z).float()
    model.opts = Optimizations()
    torch.testing.assert_close(model.decode(z).float(), expected, atol=5e-2, rtol=5e-2)
