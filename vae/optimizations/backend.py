"""Process-wide torch backend flags, applied for the duration of one encode/decode and then restored.

PyTorch keeps cuDNN autotuning and TF32 as global switches. The host application (ComfyUI) and
other nodes set them too, so StreamVAE never leaves its choices behind: `applied(flags)` sets what
`BackendFlags` asks for and restores every previous value on exit, also when the work inside raises.
(The attention kernel is not global: it is `Optimizations.attention`, see attention.py.)

    with applied(BackendFlags(tf32=True)):
        y = vae.decode(model, z)

Every torch API read here is checked for before use: the pack supports torch 2.4 and newer, and
the TF32 API changed in 2.9 (`torch.backends.cudnn.conv.fp32_precision`).

The PyTorch 2.9 cuDNN conv3d regression (ComfyUI#10373, pytorch#166643): PyTorch 2.9-2.10 stop using
cuDNN for half-precision conv3d when cuDNN is 9.10-9.14, because of a cuDNN bug seen on one data
centre GPU, and fall back to a vol2col path that needs ~3x the memory and is several times slower.
`conv3d_regression_affected()` probes for that combination (once per process: a fact of the install).
Where it says yes and the run's `Optimizations.conv3d_workaround` is on (the default), the conv
dispatch routes CUDA half-precision convs to `cudnn_conv3d`, which calls cuDNN directly (what ComfyUI
core does for its own convs); `wants_cudnn_conv3d` is that test for one input.
"""
import contextlib
import ctypes
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

# The affected window, as ComfyUI core narrowed it down from user reports (cuDNN 9.10.02 up to 9.15,
# torch 2.9 and 2.10; torch 2.8 uses cuDNN for these convs and is not affected).
_CUDNN_AFFECTED = (91002, 91500)
_TORCH_AFFECTED = ((2, 9), (2, 10))


@dataclass(frozen=True)
class BackendFlags:
    """What to set while StreamVAE runs. `None` leaves a switch as the host has it.

    cudnn_benchmark: let cuDNN time the conv algorithms for each new input shape (faster for fixed
        tile shapes once warmed up; more memory and a slow first call).
    tf32: TensorFloat-32 for float32 matmuls and convs on Ampere and newer (10-bit mantissa).
    (The conv3d workaround is a kernel choice, not a global switch: `Optimizations.conv3d_workaround`.)
    """

    cudnn_benchmark: bool | None = None
    tf32: bool | None = None


# --- version probe ---------------------------------------------------------------------------------

def torch_version() -> tuple[int, int]:
    """(major, minor) of the running torch, e.g. (2, 9) for "2.9.1+cu128"."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


@lru_cache(maxsize=None)
def conv3d_regression_affected() -> bool:
    """Whether this install has the PyTorch 2.9 cuDNN conv3d memory regression (NVIDIA CUDA only)."""
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return False
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if cudnn is None:
        return False
    low, high = _TORCH_AFFECTED
    return _CUDNN_AFFECTED[0] <= cudnn < _CUDNN_AFFECTED[1] and low <= torch_version() <= high


def describe() -> str:
    """One line about the backend, for logs and bug reports."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, cuDNN {cudnn or 'none'}"


def triton_version() -> str | None:
    """The installed Triton's version, None without one."""
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


@lru_cache(maxsize=None)
def driver_version() -> str | None:
    """The GPU driver's version: NVIDIA's from NVML ("570.124.06"), else the CUDA version the driver
    supports ("CUDA 12.8", from the driver API); AMD's amdgpu module version. None without a GPU driver
    (asked once per process; torch has no API for it)."""
    if not torch.cuda.is_available():
        return None
    if torch.version.hip is not None:
        try:
            return "amdgpu " + Path("/sys/module/amdgpu/version").read_text().strip()
        except OSError:
            return None
    text = ctypes.create_string_buffer(96)
    for name in ("libnvidia-ml.so.1", "nvml.dll"):
        nvml = _library(name)
        if nvml is not None and nvml.nvmlInit_v2() == 0 and nvml.nvmlSystemGetDriverVersion(text, 96) == 0:
            return text.value.decode()
    version = ctypes.c_int()
    for name in ("libcuda.so.1", "nvcuda.dll"):
        cuda = _library(name)
        if cuda is not None and cuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"CUDA {version.value // 1000}.{version.value % 1000 // 10}"
    return None


def _library(name: str):
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


# --- the conv3d workaround -----------------------------------------------------------------------

def cudnn_conv3d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride, padding) -> torch.Tensor:
    """conv3d through cuDNN directly (no dilation, no groups), bypassing PyTorch's vol2col fallback."""
    out = torch.cudnn_convolution(x, weight, list(padding), list(stride), [1, 1, 1], 1,
                                  benchmark=torch.backends.cudnn.benchmark, deterministic=False, allow_tf32=True)
    if bias is not None:
        out += bias.reshape(1, -1, 1, 1, 1)
    return out


def wants_cudnn_conv3d(x: torch.Tensor) -> bool:
    """Whether a conv3d on `x` meets the regression: a CUDA half-precision input on an affected install
    (the caller's `Optimizations.conv3d_workaround` decides whether to work around it)."""
    return x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and conv3d_regression_affected()


# --- applying and restoring ------------------------------------------------------------------------

def _tf32_get() -> tuple:
    matmul, conv = torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision") and hasattr(matmul, "fp32_precision"):
        # torch >= 2.9: reading the legacy allow_tf32 flags after the new API was used raises, and
        # the other way round, so only the new API is touched where it exists.
        return ("new", matmul.fp32_precision, conv.fp32_precision)
    return ("legacy", torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)


def _tf32_set(saved: tuple) -> None:
    api, matmul, conv = saved
    if api == "new":
        torch.backends.cuda.matmul.fp32_precision = matmul
        torch.backends.cudnn.conv.fp32_precision = conv
    else:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = conv


def _tf32_value(enabled: bool, api: str):
    if api == "new":
        return "tf32" if enabled else "ieee"
    return enabled


@contextlib.contextmanager
def applied(flags: BackendFlags | None):
    """Set `flags` for the duration of the block; every previous value is restored on exit."""
    if flags is None:
        yield
        return
    saved_benchmark = torch.backends.cudnn.benchmark
    saved_tf32 = _tf32_get()
    try:
        if flags.cudnn_benchmark is not None:
            torch.backends.cudnn.benchmark = flags.cudnn_benchmark
        if flags.tf32 is not None:
            value = _tf32_value(flags.tf32, saved_tf32[0])
            _tf32_set((saved_tf32[0], value, value))
        yield
    finally:
        torch.backends.cudnn.benchmark = saved_benchmark
        _tf32_set(saved_tf32)
