"""Recovering from faults in the middle of an encode/decode instead of losing the work done so far:
the one place that knows which failure restarts what (`restart_point`), at one of two declared points.

- out of memory in a step (`backend.is_oom`), where the partition allows it: the next smaller plan
  (`smaller_plan`: caches offloaded, then exact tiles of half the size, then half the temporal chunk,
  then frames streamed, as far as the op's `clip_extent` allows) -> `Restart.CHUNK`: the failed chunk again; the chunks written stay, and the
  causal caches are rebuilt by running their frames again without writing them (`engine._run_chunks`);
- out of memory in a clip of a model that runs its own tiles (MiniMax-H3: the whole clip is one chunk, and
  the model's clips before it are handed on already): the clip again with half as many tiles at once
  (`fewer_own_tiles`), which the rest of the run keeps (`own_tile_clip`);
- fp16 overflow (`HalfOverflow`: non-finite output from a finite input, the "black frames"
  complaint): the op's precision becomes bf16 where the device computes it natively, else float32,
  and the model stays there (said when it happens, so once) -> `Restart.RUN`: the encode or decode
  again from frame 0 (`attempts`);
- a block that failed to compile in the middle of a run (`compile.CompileFallback`): every block is
  eager again (one warning, `compile.py`) -> `Restart.RUN`: its causal caches may hold part of the
  failed step.

Exact tiling gives the untiled result, so a restart never changes the output.
"""
import dataclasses
import enum
import gc
import logging
import warnings

import torch

from ..kernels.backend import OOM, is_oom, native_bf16
from ..model.execution import ClipWork, OwnTiles, RunState
from . import geometry
from .compile import CompileFallback
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
    one frame at a time (`Plan.frames_streamed`): each step only where the op's `VideoVAE.clip_extent`
    allows it (a whole clip is one chunk, untiled where it takes no tiles). Raises OutOfMemory at the
    floor, listing what was tried. `reason`: the out-of-memory message."""
    frame = (plan.clip.height, plan.clip.width)
    floor = geometry.min_tile(model.spatial_factor)
    current = tuple(min(side, full) for side, full in zip(plan.tile_size or frame, frame))
    chunk, tile, offload, fallback = plan.temporal_chunk, plan.tile_size, plan.cache_offload, plan.offload_fallback
    streamed = plan.frames_streamed
    extent = model.clip_extent(plan.op)
    if fallback is not None and extent.chunked:  # one chunk keeps no cache for a next one
        offload, fallback = fallback, None
    elif extent.tiled and max(current) > floor:
        tile = tuple(max(floor, -(-side // 2)) for side in current)
    elif extent.chunked and chunk > 1:
        chunk //= 2
    elif extent.chunked and not streamed:
        streamed = True
    else:
        tried = " -> ".join((*plan.tried, plan.settings()))
        whole = "" if extent.chunked else f" (this {plan.op} sees the whole clip at once: {extent.value})"
        if plan.own_tiles is not None:  # its clips already handed on cannot be taken back: a budget plans smaller
            whole += (f"; with a memory budget (memory_budget) it runs fewer of the model's own tiles at a time or "
                      f"streams the weights from host memory")
        raise OutOfMemory(
            f"out of memory on {model.device} even at the smallest setting{whole}; tried: {tried}. Free memory (close "
            f"other programs or unload models), {plan.op} fewer frames or a smaller size, or run on another device. "
            f"Last error: {reason.splitlines()[0]}")
    smaller = dataclasses.replace(
        plan, temporal_chunk=chunk, tile_size=tile, tiling="exact", cache_offload=offload, offload_fallback=fallback,
        frames_streamed=streamed, grid=grid(plan.clip, chunk, tile, plan.tile_overlap, "exact"), peak_bytes=None,
        fits=None, tried=(*plan.tried, plan.settings()))
    log.warning("StreamVAE: out of memory; retrying the chunk with %s", smaller.settings())
    return smaller


def fewer_own_tiles(own: OwnTiles, tiles: int, reason: str) -> OwnTiles:
    """The `OwnTiles` to retry a clip of `tiles` of a model's own tiles that ran out of memory with: half as many
    tiles at once. Raises OutOfMemory at one tile at a time, saying what to do. `reason`: the error's message."""
    batch = min(own.batch or tiles, tiles)
    if batch <= 1:
        budget = "" if own.weights_streamed else (
            "; a memory budget (memory_budget) lets the plan stream the decoder's weights from host memory")
        raise OutOfMemory(f"out of memory even with one of the model's own tiles at a time{budget}. Free memory (close "
                          "other programs or unload models), use a smaller size, or run on another device. Last error: "
                          f"{reason.splitlines()[0]}")
    smaller = dataclasses.replace(own, batch=batch // 2)
    log.warning("StreamVAE: out of memory; retrying the clip with %d of its %d tiles at a time", smaller.batch, tiles)
    return smaller


def own_tile_clip(ctx: RunState, device: torch.device, work: ClipWork, tiles: int) -> torch.Tensor:
    """`work(own)` for one clip of `tiles` tiles of a model that runs its own tiles, `own` the run's
    `ctx.own_tiles` (`RunState.own_tile_clip` in an engine run); where it runs out of memory on `device`, again
    with half as many tiles at once (`fewer_own_tiles`), which the rest of the run keeps. Only this clip runs
    again: the clips before it are handed on already, and a clip's tiles batched differently change only
    float rounding."""
    while True:
        own = ctx.own_tiles or OwnTiles()
        try:
            return work(own)
        except Exception as error:
            if restart_point(error) is not Restart.CHUNK:
                raise
            reason = str(error) or type(error).__name__  # keep no reference to the failed clip's tensors
        free_cached_memory(device)
        ctx.own_tiles = fewer_own_tiles(own, tiles, reason)


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


class Restart(enum.Enum):
    """Where a run starts again after a failure it recovers from (see the module docstring)."""

    CHUNK = "the failed chunk, with a smaller plan"
    RUN = "the encode or decode, from frame 0"


def restart_point(error: BaseException) -> Restart | None:
    """Where the run restarts after `error`, or None: it is not recovered from (it propagates; so does
    `OutOfMemory`, out of memory at the smallest plan)."""
    if isinstance(error, (HalfOverflow, CompileFallback)):
        return Restart.RUN
    if is_oom(error) and not isinstance(error, OutOfMemory):
        return Restart.CHUNK
    return None


def attempts(model, op: str):
    """The attempts of a run of `op`: `for attempt in attempts(model, op): with attempt: <the run>`
    runs it once, and again from the start after a failure whose restart point is the run
    (`Restart.RUN`), once per kind: fp16 overflow, the model then falling back from half precision
    (`fall_back_from_half`), or a block that failed to compile (every block is eager already).
    Every other failure propagates. (A loop, not a wrapper around the run: no frame of its own on
    the stack of every layer.)"""
    restarted: set[type] = set()
    while True:
        attempt = _Attempt(restarted)
        yield attempt
        if attempt.failed is None:
            return
        if attempt.failed is HalfOverflow:
            fall_back_from_half(model, op)


class _Attempt:
    """One attempt of `attempts`: a failure whose restart point is the run ends it (`failed`: its
    type; the failure itself is dropped, with the failed run's tensors), the first of its kind."""

    def __init__(self, restarted: set):
        self.restarted, self.failed = restarted, None

    def __enter__(self) -> "_Attempt":
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if error is None or restart_point(error) is not Restart.RUN or kind in self.restarted:
            return False
        self.restarted.add(kind)
        self.failed = kind
        return True
