"""The mid-block attention kernel: PyTorch's scaled-dot-product attention, with a forced kernel only
where that kernel can take the shape.

SeedVR2 and Wan attend with one head as wide as the block (384-512 channels). Forcing a kernel that
cannot take such a head makes PyTorch fall back to its quadratic "math" kernel, silently: flash
attention stops at head dim 256, cuDNN's at 128. `choose` therefore replaces a forced kernel that
cannot run the head by one that can (memory-efficient first) and says so; `sdpa` runs it.

Kernels: "auto" (PyTorch picks), "flash", "efficient", "cudnn" (fused GPU kernels) and "math"
(the reference). The fused kernels are CUDA/ROCm kernels; elsewhere a request runs as "auto".
"""
import contextlib
import logging
from functools import lru_cache

import torch
import torch.nn.functional as F

KERNELS = ("auto", "flash", "efficient", "cudnn", "math")
log = logging.getLogger("streamvae")


def unsupported(kernel: str, head_dim: int, dtype: torch.dtype, device: torch.device) -> str | None:
    """Why `kernel` cannot run a head of `head_dim` in `dtype` on `device` (None: it can)."""
    if kernel in ("auto", "math"):
        return None
    if device.type != "cuda":
        return f"a GPU kernel, not available on {device.type}"
    half = dtype in (torch.float16, torch.bfloat16)
    nvidia_major = torch.cuda.get_device_properties(device).major if torch.version.hip is None else None
    if kernel == "flash":
        if not half:
            return "needs fp16/bf16"
        if nvidia_major is not None and nvidia_major < 8:
            return "needs an Ampere or newer GPU"
        return None if head_dim <= 256 else f"head dim {head_dim} > 256"
    if kernel == "cudnn":
        if torch.version.hip is not None:
            return "NVIDIA only"
        if not half or nvidia_major < 8:
            return "needs fp16/bf16 on an Ampere or newer GPU"
        return None if head_dim <= 128 else f"head dim {head_dim} > 128"
    if kernel == "efficient":
        return None if head_dim % 8 == 0 else f"head dim {head_dim} is not a multiple of 8"
    raise ValueError(f"attention kernel must be one of {KERNELS}, got {kernel!r}")


def choose(requested: str, head_dim: int, dtype: torch.dtype, device) -> tuple[str, str | None]:
    """(kernel to run, note) for a `requested` kernel: the request itself where it can run this head,
    else the first of efficient, flash, cudnn that can ("auto" on a non-GPU device), with a note
    saying why."""
    device = torch.device(device)
    reason = unsupported(requested, head_dim, dtype, device)
    if reason is None:
        return requested, None
    if device.type != "cuda":
        return "auto", f"attention {requested}: {reason}; PyTorch's choice runs"
    fallback = next((k for k in ("efficient", "flash", "cudnn") if unsupported(k, head_dim, dtype, device) is None), "math")
    return fallback, f"attention {requested} cannot run this model's head ({reason}); {fallback} runs instead"


@lru_cache(maxsize=64)
def _noted(note: str) -> None:
    """Log each distinct note once per process."""
    log.warning("StreamVAE: %s", note)


def _kernel_context(kernel: str):
    if kernel == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
    backend = getattr(SDPBackend, names[kernel], None)
    if backend is None:  # this torch has no such kernel (cuDNN attention: torch 2.5+)
        return contextlib.nullcontext()
    # MATH stays allowed, so an input the kernel rejects at run time (a rule above too optimistic for
    # some GPU) still computes the right answer.
    return sdpa_kernel([backend] if kernel == "math" else [backend, SDPBackend.MATH])


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, requested: str = "auto") -> torch.Tensor:
    """Single-head attention of q, k, v (B,N,C each): softmax(q k^T / sqrt(C)) v with the kernel
    `choose` picks for `requested`."""
    kernel, note = choose(requested, q.shape[-1], q.dtype, q.device)
    if note is not None:
        _noted(note)
    with _kernel_context(kernel):
        return F.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)
