"""Recovering from faults in the middle of an encode/decode instead of losing the work done so far.

- Out of memory inside a chunk: the chunk is retried with a smaller plan (`smaller_plan`: caches
  offloaded, then exact tiles of half the size, then half the temporal chunk). Chunks already
  written to the output are kept; the causal caches the retry needs are rebuilt by running the
  finished frames again without writing them (see `engine._stream`). Exact tiling gives the
  untiled result, so a retry never changes the output.
- fp16 overflow (non-finite output from finite input, the "black frames" complaint): the op is rerun
  in bf16 where the device computes it natively, else in float32, and the model stays there (said
  when it happens: a model that fell back no longer computes in fp16, so it happens once).
"""
import dataclasses
import gc
import logging
import warnings

import torch

from ..kernels.backend import OOM, native_bf16
from . import geometry
from .planning import Plan, grid

log = logging.getLogger("streamvae")


class OutOfMemory(OOM):
    """Out of memory even at the smallest tile and temporal chunk; the message says what was tried."""


class HalfOverflow(ArithmeticError):
    """fp16 compute produced Inf/NaN from a finite input (caught by the engine, which falls back)."""


def free_cached_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()


def smaller_plan(model, plan: Plan, reason: str) -> Plan:
    """The plan to retry a chunk that ran out of memory with: the causal caches offloaded (where the
    user left that open: `Plan.offload_fallback`), else exact tiles of half the size down to the
    smallest valid tile (`geometry.min_tile`), else half the temporal chunk, else the chunk's stages
    one frame at a time (`Plan.streamed`). Raises OutOfMemory at the floor, listing what was tried.
    `reason`: the out-of-memory message."""
    frame = (plan.clip.height, plan.clip.width)
    floor = geometry.min_tile(model.spatial_factor)
    current = tuple(min(side, full) for side, full in zip(plan.tile_size or frame, frame))
    chunk, tile, offload, fallback = plan.temporal_chunk, plan.tile_size, plan.cache_offload, plan.offload_fallback
    streamed = plan.streamed
    if fallback is not None:
        offload, fallback = fallback, None
    elif max(current) > floor:
        tile = tuple(max(floor, -(-side // 2)) for side in current)
    elif chunk > 1:
        chunk //= 2
    elif not streamed:
        streamed = True
    else:
        tried = " -> ".join((*plan.tried, plan.settings()))
        raise OutOfMemory(
            f"out of memory on {model.device} even at the smallest setting; tried: {tried}. Free memory (close "
            f"other programs or unload models), decode fewer frames or a smaller size, or run on another device. "
            f"Last error: {reason.splitlines()[0]}")
    smaller = dataclasses.replace(
        plan, temporal_chunk=chunk, tile_size=tile, tiling="exact", cache_offload=offload, offload_fallback=fallback,
        streamed=streamed, grid=grid(plan.clip, chunk, tile, plan.tile_overlap, "exact"), peak_bytes=None,
        fits=None, tried=(*plan.tried, plan.settings()))
    log.warning("StreamVAE: out of memory; retrying the chunk with %s", smaller.settings())
    return smaller


def half_fallback_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the GPU computes it natively (not where it is only emulated), else float32."""
    return torch.bfloat16 if device.type != "cpu" and native_bf16(device) else torch.float32


def fall_back_from_half(model, op: str) -> torch.dtype:
    """Switch the model's `op` ("encode"/"decode") compute from fp16 to the fallback dtype, and say so."""
    dtype = half_fallback_dtype(model.device)
    model.set_dtypes(**{op: dtype})
    message = (f"StreamVAE: fp16 {op} overflowed (Inf/NaN output from a finite input); "
               f"rerunning in {str(dtype).removeprefix('torch.')} and keeping that precision for this model")
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    return dtype


def check_half(y: torch.Tensor, op: str) -> None:
    """HalfOverflow where an fp16 output `y` of `op` has Inf/NaN (from a finite input: checked before)."""
    if y.dtype == torch.float16 and not bool(torch.isfinite(y).all()):
        raise HalfOverflow(f"fp16 {op} produced Inf/NaN")


def with_half_fallback(model, op: str, run):
    """run(), rerun in bf16/fp32 if fp16 compute overflowed (`fall_back_from_half`)."""
    try:
        return run()
    except HalfOverflow:
        fall_back_from_half(model, op)
        return run()
