"""Kernels and switches that make the VAE blocks fast; no model structure lives here.

- `settings.Optimizations`: one flag per optimization, so each can be timed against the
  straightforward path.
- `norm_act`: fused norm + SiLU (GroupNorm per frame, RMS norm) with float32 statistics.
"""
from .settings import Optimizations
from .norm_act import (
    group_norm_act,
    group_norm_apply,
    group_norm_moments,
    group_norm_stats,
    merge_group_moments,
    rms_norm_act,
)

__all__ = [
    "Optimizations",
    "group_norm_act",
    "group_norm_apply",
    "group_norm_moments",
    "group_norm_stats",
    "merge_group_moments",
    "rms_norm_act",
]
