"""The device and torch's backends on it: what the hardware can do, the versions, and the process-wide
flags applied around one encode/decode.

## What the device can do

Users run NVIDIA (Turing to Blackwell), AMD (ROCm builds report their GPUs as "cuda" devices),
Apple (MPS) and CPUs. The decisions here are made once per question and tested by making torch
report a given device (tests/test_gpu_decisions.py):

- `native_bf16(device)`: bf16 arithmetic in hardware. `torch.cuda.is_bf16_supported()` also says yes
  where bf16 is only emulated (NVIDIA before Ampere: correct but several times slower), so it is not
  asked. NVIDIA: compute capability 8.0 or newer. AMD: CDNA2/3 (gfx90a, gfx94x, gfx95x) and RDNA3/4
  (gfx11xx, gfx12xx); not RDNA2 and older. Apple: macOS 14 or newer. CPUs: AVX-512 BF16 or AMX.
- `DTYPES` / `dtype_name`: the precisions by the names users give them ("fp32", "bf16", "fp16"), for
  the nodes, the command line and the benchmarks alike.
- `auto_dtype(device, op)`: what `auto` precision means there (decode: bf16 where native, fp32
  elsewhere; encode: fp32, because bf16 encode visibly hurts image-to-video conditioning). CPUs
  included: with AVX-512 BF16 or AMX, oneDNN's bf16 convs are faster than fp32 and the decode stays
  close to fp32 (bench/bench_precision.py, bench/RESULTS.md section 8).
- `OOM` and `is_oom(error)`: out-of-memory as every backend reports it.
- `host_free()` / `host_available()`: RAM the OS can give, and what host buffers may take of it.
- `cpu_has_native(dtype)`: oneDNN convolutions in `dtype` in hardware (probed once per dtype).

## The backend flags

Process-wide torch backend flags, applied for the duration of one encode/decode and then restored.

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


# --- what the device can do ------------------------------------------------------------------------

@lru_cache(maxsize=None)
def cpu_has_native(dtype: torch.dtype) -> bool:
    """Whether this CPU runs `dtype` convolutions natively (probed once per dtype)."""
    probe = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}.get(dtype)
    if probe is None:
        return True
    check = getattr(torch.ops.mkldnn, probe, None)
    try:
        return bool(check()) if check is not None else False
    except RuntimeError:
        return False


# torch.OutOfMemoryError exists from torch 2.5; before that the CUDA class is the same object.
OOM = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError

# Messages of out-of-memory failures that are not raised as OOM: MPS ("MPS backend out of memory"),
# cuDNN / cuBLAS / MIOpen workspace allocations, HIP and CUDA runtime errors, the CPU allocator
# (Linux "can't allocate memory", Windows "not enough memory").
_OOM_MESSAGES = ("out of memory", "CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED", "miopenStatusAllocFailed",
                 "hipErrorOutOfMemory", "can't allocate memory", "not enough memory")

# AMD architectures with bf16 arithmetic (CDNA2/3/4, RDNA3/4), by the prefix of gcnArchName.
_AMD_BF16_ARCHS = ("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def is_oom(error: BaseException) -> bool:
    """Whether `error` means the device (or the host) ran out of memory, on any backend."""
    if isinstance(error, (OOM, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and any(m.lower() in str(error).lower() for m in _OOM_MESSAGES)


def native_bf16(device) -> bool:
    """Whether `device` computes bf16 in hardware (see the module docstring for each vendor)."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False
        props = torch.cuda.get_device_properties(device)
        if torch.version.hip is not None:
            return getattr(props, "gcnArchName", "").startswith(_AMD_BF16_ARCHS)
        return props.major >= 8
    if device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        check = getattr(mps, "is_macos_or_newer", None)
        return bool(check(14, 0)) if check is not None else False
    if device.type == "cpu":
        return cpu_has_native(torch.bfloat16)
    return False


# The precisions a user names; "auto" (`auto_dtype`) chooses one of them per device and op.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The name `DTYPES` gives `dtype` ("bf16"), or torch's ("float64") for another one."""
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def auto_dtype(device, op: str) -> torch.dtype:
    """The precision `auto` gives `op` ("encode" / "decode") on `device`."""
    device = torch.device(device)
    if op == "decode" and native_bf16(device):
        return torch.bfloat16
    return torch.float32


def same_device(a, b) -> bool:
    """Whether two device specs name one device ("cuda" and "cuda:0" do, on a one-GPU process)."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        current = torch.cuda.current_device() if a.type == "cuda" and torch.cuda.is_available() else 0
        return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
    return a.index == b.index


def describe_device(device) -> str:
    """One line about the device for logs and bug reports: name, capability and bf16 support."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        arch = getattr(props, "gcnArchName", "") if torch.version.hip else f"sm_{props.major}{props.minor}"
        return f"{props.name} ({arch}, {'native' if native_bf16(device) else 'no native'} bf16)"
    return f"{device.type} ({'native' if native_bf16(device) else 'no native'} bf16)"


# RAM left to the rest of the machine when StreamVAE sizes host buffers: 10 % of what is available,
# at least 2 GiB, so offloaded caches never push the system into swap.
HOST_MARGIN_FRACTION = 0.10
HOST_MARGIN_MIN = 2 * 2**30


def host_free() -> int:
    """Bytes of RAM the OS can give now (Linux MemAvailable; psutil elsewhere, as ComfyUI counts it)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil  # not on Linux: ask psutil (installed with ComfyUI)

    return psutil.virtual_memory().available


def host_available() -> int:
    """RAM StreamVAE may fill with host buffers: what is free minus the margin above."""
    free = host_free()
    return max(0, free - max(int(free * HOST_MARGIN_FRACTION), HOST_MARGIN_MIN))
