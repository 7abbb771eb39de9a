"""Kernels and switches that make the VAE blocks fast; no model structure and no run policy live here
(a leaf: nothing here imports `vae.model` or `vae.run`).

- `settings.Optimizations`: one flag per optimization, so each can be timed against the
  straightforward path.
- `norm_act`: fused norm + SiLU (GroupNorm per frame, RMS norm) with float32 statistics.
- `conv`: convolution dispatch (float32 compute for half precision on CPUs without native kernels;
  Winograd for eligible CPU convs when the caller enables it).
- `winograd`: Winograd F(4x4, 3x3) conv3d for the CPU; its jobs, one per slab of tile rows on one thread
  per core, with the temporal taps summed in one GEMM per position (`winograd_job`), on MKL or oneDNN
  (`winograd_gemm`); its filter transforms cached per weight (`filter_cache`: by frame size when not
  all fit, byte-capped, scan-resistant: STREAMVAE_WINOGRAD_CACHE_GB, default RAM/8 within 1-4 GiB).
- `kernel_choice`: which exact kernel each layer shape runs, measured once per machine and kept on disk
  (STREAMVAE_KERNEL_CACHE), or fixed defaults (`Optimizations.kernel_choice`).
- `triton_norm`: the norm + SiLU steps as Triton kernels on GPUs (64-bit addressing, two-pass
  statistics); `kernel_check`: each of them compared with torch on its first use on a device in a dtype
  (both layouts, a production-sized grid), kept in the kernel record; one that fails is replaced by
  torch's op alone.
- `neighborhood`: 3-D neighbourhood attention (LTX-2.5's decoder) for a part of the grid (`na_window`: the
  window, the part's boxes): the reference, the blocked torch implementation (any device), on CPUs
  `cpu_na`'s C kernel (cpu_na.c, built at first use by the machine's C compiler, loaded with ctypes) and on
  GPUs `triton_na`'s kernel (flash-attention style, float32 softmax; proven in Triton's interpreter on the CPU
  and compiled for the GPU targets in CI); each compiled one checked against the reference before its first use.
- `kernel_log`: which kernel each conv and norm of one run took (`KernelLog`, for the run report).
- `attention`: the mid-block attention kernel, a forced kernel only where it takes the head width.
- `backend`: process-wide torch switches (cuDNN autotuning, TF32, the PyTorch 2.9 conv3d
  workaround) applied around one encode/decode and restored afterwards.
"""
from .attention import sdpa
from .backend import BackendFlags, cpu_has_native
from .conv import conv3d
from .kernel_log import KernelLog
from .norm_act import (
    group_norm_act,
    group_norm_apply,
    group_norm_moments,
    group_norm_stats,
    merge_group_moments,
    rms_norm_act,
)
from .settings import Optimizations

__all__ = [
    "BackendFlags",
    "KernelLog",
    "Optimizations",
    "conv3d",
    "cpu_has_native",
    "group_norm_act",
    "group_norm_apply",
    "group_norm_moments",
    "group_norm_stats",
    "merge_group_moments",
    "rms_norm_act",
    "sdpa",
]
