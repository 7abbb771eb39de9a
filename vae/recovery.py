"""Recovering from faults in the middle of an encode/decode instead of losing the work done so far.

- Out of memory inside a chunk: the chunk is retried with exact tiles of half the size, down to
  `min_tile`, then with half the temporal chunk, down to one latent frame. Chunks already written to
  the output are kept; the causal caches the retry needs are rebuilt by running the finished frames
  again without writing them (see `streaming._stream`). Exact tiling gives the untiled result, so a
  retry never changes the output.
- fp16 overflow (non-finite output from finite input, the "black frames" complaint): the op is rerun
  in bf16 where the device computes it natively, else in float32, and the model stays there; said
  once per model.
"""
import gc
import logging
import warnings

import torch

from . import tiling as tiles
from .causal_cache import CausalCache
from .devices import OOM, native_bf16

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


def min_tile(model) -> int:
    """The smallest exact tile an out-of-memory retry goes down to, in pixels: 2 latent cells."""
    return 2 * model.spatial_factor


class Shrinker:
    """Smaller settings for a chunk that ran out of memory: offload the causal caches (where the
    user left that open: `CausalCache.fallback`), then halve the exact tile, then the chunk.

    `reference_hw` is the video size the stream's tiles are laid out on; `steps` the stream's
    `Steps`, whose per-chunk count follows the new tiling (`count=False`: the stream is one tile of
    fast mode, counted by its caller, so sub-tiles only check for cancellation).
    """

    def __init__(self, model, ctx, steps, reference_hw, chunk: int, count: bool = True):
        self.model, self.ctx, self.steps = model, ctx, steps
        self.reference, self.chunk, self.count = reference_hw, chunk, count
        self.tried: list[str] = [self._describe()]

    def _tile(self) -> tuple[int, int] | None:
        return self.ctx.tiling.tile if self.ctx.tiling is not None else None

    def _describe(self) -> str:
        tile = self._tile()
        where = "untiled" if tile is None else f"tiles {tile[0]}x{tile[1]} px"
        caches = "" if self.ctx.cache.offload == "none" else f", caches offloaded to {self.ctx.cache.offload}"
        return f"{where}, {self.chunk} latent frame(s) per chunk{caches}"

    def shrink(self, reason: str, remaining: int) -> int:
        """The chunk length to retry with (the tiling is already switched); raises OutOfMemory at the floor.
        `reason`: the out-of-memory message; `remaining`: latent frames still to do, to recount progress."""
        floor = min_tile(self.model)
        current = self._tile() or self.reference
        if self.ctx.cache.fallback is not None:
            old = self.ctx.cache
            self.ctx.cache = CausalCache(old.fallback, old.device)
            old.close()
        elif max(current) > floor:
            tile = tuple(max(floor, -(-side // 2)) for side in current)
            tile = tuple(min(t, r) for t, r in zip(tile, self.reference))
            self.ctx.tiling = tiles.ExactTiling(self.reference, tile, self.steps if self.count else self.steps.check)
        elif self.chunk > 1:
            self.chunk //= 2
        else:
            raise OutOfMemory(
                f"out of memory on {self.model.device} even at the smallest setting; tried: {' -> '.join(self.tried)}. "
                f"Free memory (close other programs or unload models), decode fewer frames or a smaller size, "
                f"or run on another device. Last error: {reason.splitlines()[0]}")
        self.tried.append(self._describe())
        log.warning("StreamVAE: out of memory; retrying the chunk with %s", self.tried[-1])
        if self.count:
            self.steps.replan(-(-remaining // self.chunk), self.steps.units_per_chunk(self.ctx.tiling))
        return self.chunk


_half_fallbacks_reported: set[int] = set()


def half_fallback_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the GPU computes it natively (not where it is only emulated), else float32."""
    return torch.bfloat16 if device.type != "cpu" and native_bf16(device) else torch.float32


def fall_back_from_half(model, op: str) -> torch.dtype:
    """Switch the model's `op` ("encode"/"decode") compute from fp16 to the fallback dtype; warns once per model."""
    dtype = half_fallback_dtype(model.device)
    model.set_dtypes(**{op: dtype})
    if id(model) not in _half_fallbacks_reported:
        _half_fallbacks_reported.add(id(model))
        message = (f"StreamVAE: fp16 {op} overflowed (Inf/NaN output from a finite input); "
                   f"rerunning in {str(dtype).removeprefix('torch.')} and keeping that precision for this model")
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    return dtype
