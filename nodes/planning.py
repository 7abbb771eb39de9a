"""Memory plans for the nodes and the web extension, and what a checkpoint is without loading it.

`make_plan` asks the library's memory model (`vae.memory.plan`) for the tile grid and predicted peak
of an encode/decode; where this build of the library has no memory model yet, it still reports the
grid and leaves the peak unknown. `inspect_checkpoint` reads only a safetensors header (names,
shapes, config metadata) and builds the model on the meta device, so the web extension can show
the family and a plan for a multi-GB checkpoint without reading its weights.
"""
import inspect
import logging
import math
import os
from dataclasses import asdict, dataclass
from functools import lru_cache

import torch

from ..vae import loading, streaming
from ..vae import tiling as vae_tiling
from .common import latent_frames

log = logging.getLogger("streamvae")

try:  # the memory model lands in the library separately; without it plans carry no peak estimate
    from ..vae import memory as vae_memory
except ImportError:
    vae_memory = None


@dataclass
class PlanInfo:
    """A plan as the nodes and the web extension use it (JSON-ready via `as_dict`)."""

    op: str
    input_shape: tuple
    grid: tuple[int, int, int]  # rows, cols, temporal chunks
    tile_size: tuple[int, int] | None
    temporal_chunk: int
    peak_bytes: int | None
    fits: bool | None
    budget_bytes: int | None
    estimated: bool  # False when the library has no memory model (peak unknown)
    cache_offload: str = "none"  # where the causal caches wait between chunks ("none": on the device)
    weight_bytes: int = 0  # the weights' part of peak_bytes

    @property
    def work_bytes(self) -> int | None:
        """The peak without the weights: what to ask ComfyUI for beside the model it loads itself."""
        return None if self.peak_bytes is None else max(0, self.peak_bytes - self.weight_bytes)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["input_shape"] = list(self.input_shape)
        d["grid"] = list(self.grid)
        d["tile_size"] = list(self.tile_size) if self.tile_size else None
        return d

    def summary(self) -> str:
        rows, cols, chunks = self.grid
        text = f"tiles {rows}x{cols}x{chunks}"
        if self.peak_bytes is not None:
            text += f", peak {self.peak_bytes / 2**30:.2f} GiB"
            if self.fits is False:
                text += " (over budget)"
        if self.cache_offload != "none":
            text += f", caches offloaded to {self.cache_offload}"
        return text


def engine_accepts(op: str, name: str) -> bool:
    """Whether `streaming.encode`/`decode` of this library build takes keyword `name`."""
    return name in inspect.signature(getattr(streaming, op)).parameters


def make_plan(model, op: str, input_shape, tiling, device, io_on_device=(False, False)) -> PlanInfo:
    """The plan for running `op` ("encode"/"decode") on an input of `input_shape` with `tiling`
    (`common.Tiling`) on `device`; `io_on_device`: whether the whole input / output live on that
    device (a node's IMAGE and LATENT stay in host memory unless ComfyUI runs --gpu-only). Without a
    usable memory model (none in this build, or no calibration for this family/op/mode) the plan
    has the grid but no peak estimate."""
    device = torch.device(device)
    plan = None
    if vae_memory is not None:
        try:
            plan = vae_memory.plan(model, op, tuple(input_shape), temporal_chunk=tiling.temporal_chunk,
                                   tile_size=tiling.tile_size, tile_overlap=tiling.tile_overlap, tiling=tiling.tiling,
                                   memory_budget=tiling.memory_budget, device=device, io_on_device=tuple(io_on_device))
        except KeyError as missing:  # the memory model has no calibration for this case
            _warn_once(f"StreamVAE: no peak memory estimate ({missing.args[0] if missing.args else missing})")
    if plan is not None:
        tile = tuple(plan.tile_size) if plan.tile_size else None
        return PlanInfo(op, tuple(input_shape), tuple(plan.grid), tile, plan.temporal_chunk, int(plan.peak_bytes),
                        bool(plan.fits), plan.budget_bytes, True, plan.cache_offload, plan.weight_bytes)
    return _grid_only_plan(model, op, input_shape, tiling)


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def _grid_only_plan(model, op, input_shape, tiling) -> PlanInfo:
    """The tile grid the engine will use, without a memory estimate."""
    sf, tf = model.spatial_factor, model.temporal_factor
    if op == "encode":
        t, h, w = input_shape[2], -(-input_shape[3] // sf), -(-input_shape[4] // sf)
        n_lat = latent_frames(t, tf)
    else:
        n_lat, h, w = input_shape[2], input_shape[3], input_shape[4]
    chunk = min(tiling.temporal_chunk or 1, n_lat)
    rows = cols = 1
    tile = None
    if tiling.tile_size:
        grid = vae_tiling.latent_grid(h, w, tiling.tile_size, tiling.tile_overlap, sf)
        if grid is not None:
            rows, cols = len(grid[0]), len(grid[1])
            tile = vae_tiling.as_pair(tiling.tile_size)
    return PlanInfo(op, tuple(input_shape), (rows, cols, math.ceil(n_lat / chunk)), tile, chunk,
                    None, None, None, False)


def plan_input_shape(model, op: str, frames: int, height: int, width: int, batch: int = 1) -> tuple:
    """The engine input shape for a clip of `frames` pixel frames of height x width."""
    if op == "encode":
        return (batch, 3, frames, height, width)
    sf = model.spatial_factor
    return (batch, model.latent_channels, latent_frames(frames, model.temporal_factor), -(-height // sf), -(-width // sf))


# --- checkpoints without loading them ------------------------------------------------------------

@dataclass
class CheckpointInfo:
    family: str
    latent_channels: int
    spatial_factor: int
    stored_dtype: str
    model: torch.nn.Module  # on the meta device: shapes and config only


def inspect_checkpoint(path: str) -> CheckpointInfo:
    """Family and a meta-device model of a checkpoint without reading its weights: the safetensors
    header, or a pickle's structure (cached by path, size and modification time). Raises
    `vae.CheckpointError` with what to do for a file StreamVAE cannot use."""
    stat = os.stat(path)
    return _inspect(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=16)
def _inspect(path: str, size: int, mtime: int) -> CheckpointInfo:
    state, metadata = loading.read_shapes(path)
    model, _ = loading.build_empty(state, metadata)
    stored = "/".join(sorted({str(t.dtype).removeprefix("torch.") for t in state.values()}))
    return CheckpointInfo(model.family, model.latent_channels, model.spatial_factor, stored, model)
