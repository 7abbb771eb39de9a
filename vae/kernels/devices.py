"""What the device at hand can do, decided from the hardware rather than from what torch will accept.

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
"""
from pathlib import Path

import torch

from .conv import cpu_has_native

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


def describe(device) -> str:
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
