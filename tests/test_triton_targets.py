"""The Triton kernels as the GPUs users run would compile and launch them, checked on this CPU machine
(tests/gpu_targets.py): compiled for sm_75 to sm_120 and gfx942 down to the cubin / hsaco, with the code
that matters asserted (results rounded to nearest in bf16 and fp16, every max keeping NaN where dropping it
would change a result: gpu_targets.NAN_DROPPING_MAX_IS_HARMLESS), and their launch grids at production sizes
(the norms' activations, LTX-2.5's neighbourhood attention) within the GPUs' limits, with no 32-bit index
arithmetic that wraps.

Each kernel x dtype x target takes 1-15 s to compile here (the whole matrix several minutes), so CI
compiles a covering set: every kernel, every target and every dtype once, and each kind of conversion and
max the targets emit; `python -m bench.triton_targets` compiles all of it. For another Triton than the
environment's (torch's CUDA wheels pin one: `triton==3.7.1` for torch 2.13), install it aside and put it
first on the path: `pip install --target DIR triton==3.7.1`, then `PYTHONPATH=DIR pytest ...` (the
interpreter tests' subprocesses keep that path too).
"""
import importlib
import pkgutil

import pytest
import torch

from vae import kernels
from vae.kernels import kernel_check

triton = pytest.importorskip("triton", reason="Triton is not installed (requirements-dev.txt installs it)")
from tests import gpu_targets  # noqa: E402 (needs Triton)
from tests.gpu_targets import GRID_LIMITS, KERNELS, TARGETS  # noqa: E402

pytestmark = pytest.mark.skipif(kernel_check.INTERPRETED, reason="TRITON_INTERPRET=1: the kernels are interpreted, "
                                                                  "nothing is compiled")

# Activations the kernels meet in real decodes (B,C,T,H,W): a decoder's last layers at 1080p and 4K (128
# channels), SeedVR2's 512-channel layers at full resolution, and 4096 channels, where a channels-last
# program holds one pixel; temporal chunks of 21 and 5 frames.
PRODUCTION = {"1080p, 128 channels": (1, 128, 21, 1080, 1920), "1080p, 512 channels": (1, 512, 21, 1080, 1920),
              "4K, 128 channels": (1, 128, 21, 2160, 3840), "4K, 512 channels": (1, 512, 5, 2160, 3840),
              "1080p, 4096 channels": (1, 4096, 5, 1080, 1920)}
# Each kernel on one target in one dtype (its output's, or its input's for the statistics), covering every
# target and dtype and what each emits: bf16 rounded by hand (sm_75, gfx942) and by cvt.rn (sm_90), fp16
# by cvt.rn (sm_80), NaN-keeping maxes emulated (sm_75, gfx942) and native (sm_100, sm_120).
# The neighbourhood-attention kernel (about 1 s a compile) on every target, each of its dot products once: bf16
# on the tensor cores (mma.sync from sm_80, MFMA on gfx942) and without them (sm_75 has no bf16 MMA), fp16,
# fp32 in full float32.
COVERING = [("_rms_act_kernel", "sm_75", torch.bfloat16), ("_rms_act_cl_kernel", "gfx942", torch.bfloat16),
            ("_center_scale_act_kernel", "sm_80", torch.float16), ("_center_scale_act_cl_kernel", "sm_90", torch.bfloat16),
            ("_gn_partial_kernel", "sm_100", torch.float32), ("_gn_partial_cl_kernel", "sm_120", torch.float16),
            ("_na3d_kernel", "sm_75", torch.bfloat16), ("_na3d_kernel", "sm_80", torch.float16),
            ("_na3d_kernel", "sm_90", torch.bfloat16), ("_na3d_kernel", "sm_100", torch.float32),
            ("_na3d_kernel", "sm_120", torch.bfloat16), ("_na3d_kernel", "gfx942", torch.bfloat16)]
LAYOUT = {name: "ndhwc" if "_cl_" in name else "ncdhw" for name in KERNELS if name != "_na3d_kernel"}
# LTX-2.5's neighbourhood attention (B,T,H,W,heads,D; windows): stage 5 (4 heads of 64, windows 11^3) on the
# patchified pixels of 121 frames at 720p and 1080p, stage 1 (32 heads) on the latents of 121 frames at 720p
# (16 frames and the 2 trailing copies, 23 x 40).
NA_PRODUCTION = {"stage 5, 720p": ((1, 121, 180, 320, 4, 64), (11, 11, 11)),
                 "stage 5, 1080p": ((1, 121, 270, 480, 4, 64), (11, 11, 11)),
                 "stage 1, 720p": ((1, 18, 23, 40, 32, 64), (3, 7, 7))}


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """Compile into a cache of this session's own (the user's Triton cache stays as it was)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "triton-cache"))


def launch_of(kernel: str, dtype: torch.dtype) -> gpu_targets.Launch:
    if kernel == "_na3d_kernel":
        return gpu_targets.na_launches(*NA_PRODUCTION["stage 5, 720p"], dtype)[0]
    shape = PRODUCTION["1080p, 512 channels"]
    return next(launch for launch in gpu_targets.launches(shape, dtype, LAYOUT[kernel]) if launch.kernel == kernel)


def test_every_kernel_is_launched_and_compiled_here():
    """Every @triton.jit kernel of vae/kernels (a new module's too) has its launches recorded here, and the
    covering set compiles each of them on every target and in every dtype between them."""
    for module in pkgutil.iter_modules(kernels.__path__):
        found = vars(importlib.import_module(f"vae.kernels.{module.name}"))
        jitted = {name for name, fn in found.items() if isinstance(fn, triton.runtime.JITFunction) and name.endswith("_kernel")}
        assert jitted <= set(KERNELS), f"vae/kernels/{module.name}.py: {jitted - set(KERNELS)} not in tests/gpu_targets.py"
    launched = {launch.kernel for layout in ("ncdhw", "ndhwc") for launch in gpu_targets.launches((1, 64, 2, 8, 8), torch.float32, layout)}
    launched |= {launch.kernel for launch in gpu_targets.na_launches((1, 2, 8, 8, 1, 64), (3, 7, 7), torch.float32)}
    assert launched == set(KERNELS) == {kernel for kernel, _, _ in COVERING}
    assert {target for _, target, _ in COVERING} == set(TARGETS)
    assert {dtype for _, _, dtype in COVERING} == set(kernel_check.DTYPES)


@pytest.mark.parametrize("kernel, target, dtype", COVERING, ids=[f"{k}-{t}-{str(d)[6:]}" for k, t, d in COVERING])
def test_compiled_code_rounds_to_nearest_and_keeps_nan(kernel, target, dtype):
    launch = launch_of(kernel, dtype)
    code = gpu_targets.compiled(launch, TARGETS[target])
    binary = code.get("cubin") or code.get("hsaco")
    assert isinstance(binary, bytes) and binary, f"no {target} binary"
    problems = gpu_targets.code_problems(launch, code, TARGETS[target])
    assert not problems, f"{kernel} on {target} in {dtype}: {problems}"


def assert_fits(launch: gpu_targets.Launch, size: str):
    """CUDA: at most 2^31 - 1 programs on grid axis x, 65535 on y and z; HIP: at most 2^32 - 1 work-items
    (programs x 4 warps of 64) on each axis. A 32-bit product of two arguments (H * W) must not wrap,
    and program ids are widened to 64 bits before any arithmetic (addresses pass 2^31 elements)."""
    grid = launch.grid + (1,) * (3 - len(launch.grid))
    assert all(1 <= n <= limit for n, limit in zip(grid, GRID_LIMITS)), f"{launch.kernel} at {size}: grid {grid}"
    assert all(n * 4 * 64 < 2**32 for n in grid), f"{launch.kernel} at {size}: grid {grid} is too large for HIP"
    problems = gpu_targets.int32_problems(gpu_targets.ttir(launch), launch)
    assert not problems, f"{launch.kernel} at {size}: {problems}"


@pytest.mark.parametrize("layout", ["ncdhw", "ndhwc"])
@pytest.mark.parametrize("size", PRODUCTION)
def test_production_launches_fit_the_grid_limits_and_32_bit_indices(size, layout):
    for launch in gpu_targets.launches(PRODUCTION[size], torch.bfloat16, layout):
        assert_fits(launch, size)


@pytest.mark.parametrize("size", NA_PRODUCTION)
def test_neighborhood_attention_launches_fit_the_grid_limits_and_32_bit_indices(size):
    (launch,) = gpu_targets.na_launches(*NA_PRODUCTION[size], torch.bfloat16)
    assert_fits(launch, size)
