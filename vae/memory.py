"""Memory model and planning: predict an encode/decode's peak memory, pick settings that fit a budget.

Peak = weights + the input/output buffers that live on the compute device (a decode into host
memory counts none of its output) + what stays resident between calls (the CPU Winograd filter
cache, from the model's conv weights and the cache cap) + activations. Activations follow a linear
model calibrated by measurement for each family, op and mode (untiled, exact tiles; fast tiles are
untiled runs of one tile), separately per device type (bench/calibrate_memory.py writes
`memory_calibration.json` beside this file): on the CPU the peak of live tensors, on CUDA the peak
the caching allocator reserves (cuDNN workspaces and fragmentation included). A device type without
its own calibration (a GPU before `python -m bench.gpu_check --parts calibrate` ran on one; MPS)
uses the CPU's coefficients times UNCALIBRATED_MARGIN:

    activations = element_size * (per_pixel * chunk_pixels + per_tile_pixel * tile_pixels + fixed)

with chunk_pixels the pixel-frames of one temporal chunk at video resolution (decode output /
encode input) and tile_pixels those of one spatial tile (exact tiling). The causal caches are part
of that; offloaded (`causal_cache.py`), they leave the compute device except the running module's
own (its old and new frames), which `cache_profile` (elements per video pixel, all caches and the
largest, measured by a short run) gives. Untiled execution is chosen whenever it fits, because
tiling costs time; offloading the caches costs less than tiling, so it is tried first.
"""
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from .blocks import StreamContext
from .causal_cache import check_offload
from .devices import host_free
from .tiling import as_pair, latent_grid

try:  # inside the ComfyUI pack, `optimizations` is a sibling subpackage
    from ..optimizations import conv as opt_conv, winograd
except ImportError:  # plain library use: the repository root is on sys.path
    from optimizations import conv as opt_conv, winograd

CALIBRATION = Path(__file__).with_name("memory_calibration.json")
AUTO_MARGIN = 0.10            # "auto" budget: free memory minus 10% ...
AUTO_MARGIN_MIN = 512 * 2**20  # ... and at least 512 MiB
TILE_CANDIDATES = (2048, 1536, 1024, 768, 640, 512, 384, 320, 256, 192, 128, 96, 64, 48, 32)
# CPU coefficients on a GPU underestimate it: on an H100 (bench/results/gpu/, 2026-11-24) measured
# peaks were 1.1x (Wan2.1 decode) to 1.8x (Wan2.2 decode) of the CPU model's prediction.
UNCALIBRATED_MARGIN = 2.0
NEAR_LOWEST = 1.10  # when no setting fits a budget: the fastest one within 10 % of the lowest peak


@dataclass(frozen=True)
class Plan:
    """Settings for one encode/decode and what they are predicted to cost on the compute device."""

    op: str
    temporal_chunk: int          # latent frames per step
    tile_size: tuple[int, int] | None  # pixels; None = untiled
    tiling: str                  # "exact" or "fast"
    cache_offload: str           # where the causal caches wait between chunks ("none", "host", "disk")
    grid: tuple[int, int, int]   # tile rows, tile columns, temporal chunks
    peak_bytes: int              # predicted peak: weights + buffers + activations
    budget_bytes: int | None
    fits: bool
    weight_bytes: int = 0        # the weights' part of peak_bytes (a host that loads them counts them itself)

    def describe(self) -> str:
        rows, cols, chunks = self.grid
        tile = "untiled" if self.tile_size is None else f"{self.tiling} tiles {self.tile_size[0]}x{self.tile_size[1]} px"
        caches = "" if self.cache_offload == "none" else f", caches offloaded to {self.cache_offload}"
        return (f"{rows}x{cols}x{chunks} ({tile}, {self.temporal_chunk} latent frames per chunk{caches}), "
                f"peak {self.peak_bytes / 2**30:.2f} GiB")


@lru_cache(maxsize=1)
def _calibration() -> dict:
    return json.loads(CALIBRATION.read_text()) if CALIBRATION.is_file() else {}


def coefficients(family: str, op: str, mode: str, device_type: str) -> dict:
    """Calibrated {per_pixel, per_tile_pixel, fixed} for a family/op/mode ("caches": the
    `cache_profile`, elements per pixel, the same on every device) on `device_type`; where that
    device type has no calibration, the CPU's times UNCALIBRATED_MARGIN."""
    table = _calibration()
    entry = table.get(device_type, {}).get(family, {}).get(op, {}).get(mode)
    if entry:
        return entry
    entry = table.get("cpu", {}).get(family, {}).get(op, {}).get(mode)
    if entry:
        return entry if mode == "caches" else {k: v * UNCALIBRATED_MARGIN for k, v in entry.items()}
    raise KeyError(f"no memory calibration for {family} {op} {mode}; run bench/calibrate_memory.py")


def steady_cache_sizes(model, op: str, latent_hw: tuple[int, int]) -> list[tuple[torch.Size, int]]:
    """(shape, bytes) of every causal cache a steady chunk leaves at latent_hw latent cells: what
    running two one-latent-frame chunks of zeros (frame 0 alone, then one steady latent frame) keeps."""
    h, w = latent_hw
    sf = model.spatial_factor
    if op == "decode":
        shape, dtype, run = (1, model.latent_channels, 2, h, w), model.decode_dtype, model.decode_chunk
    else:
        shape = (1, model.in_channels, 1 + model.temporal_factor, h * sf, w * sf)
        dtype, run = model.encode_dtype, model.encode_chunk
    clip = torch.zeros(shape, dtype=dtype, device=model.device)
    ctx = StreamContext(model.opts)
    with torch.inference_mode():
        for chunk in (clip[:, :, :1], clip[:, :, 1:]):
            run(chunk, ctx)
            ctx.first_chunk = False
    return ctx.cache.sizes()


def cache_profile(model, op: str, cells: int = 8) -> dict:
    """Causal-cache elements per video pixel that a steady chunk leaves: {"all": summed over the
    modules, "largest": of one module}, from `steady_cache_sizes` at `cells` x `cells` latent cells
    (the caches are whole frames, so they scale with the frame area)."""
    pixels = (cells * model.spatial_factor) ** 2
    sizes = [shape.numel() for shape, _ in steady_cache_sizes(model, op, (cells, cells))]
    return {"all": sum(sizes) / pixels, "largest": max(sizes, default=0) / pixels}


def offload_target(device) -> str:
    """Where "auto" offloads causal caches from `device`: pinned host memory from a GPU, else disk."""
    return "disk" if torch.device(device).type == "cpu" else "host"


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def resident_cache_bytes(model, op: str, device) -> int:
    """What stays resident between calls of `op` on `device`: the CPU Winograd filter transforms of
    its eligible 3x3 convs up to the cache's cap; nothing elsewhere."""
    if torch.device(device).type != "cpu" or not model.opts.winograd_conv:
        return 0
    total = 0
    roots = model.decode_modules() if op == "decode" else model.encode_modules()
    for module in (m for root in roots for m in root.modules()):
        weight = getattr(module, "weight", None)
        if (isinstance(module, torch.nn.Conv3d) and weight is not None and weight.dim() == 5
                and opt_conv.winograd_weight_eligible(weight.shape, module.stride)):
            total += winograd.transform_nbytes(weight.shape)
    return min(total, winograd.FILTER_CACHE.limit_bytes)


def free_memory(device: torch.device) -> int:
    """Bytes the device can still give us: CUDA free + what PyTorch's cache holds; CPU MemAvailable."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return host_free()


def budget_from_free(free: int) -> int:
    """The "auto" budget when `free` bytes are free: minus a margin for what the model does not count."""
    return max(0, free - max(int(free * AUTO_MARGIN), AUTO_MARGIN_MIN))


def resolve_budget(memory_budget, device) -> int | None:
    """None (no limit), bytes, or "auto" (free memory minus a margin) -> bytes or None."""
    if memory_budget is None:
        return None
    if memory_budget == "auto":
        return budget_from_free(free_memory(device))
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget <= 0:
        raise ValueError(f"memory_budget must be None, 'auto' or a positive number of bytes, got {memory_budget!r}")
    return memory_budget


def _geometry(model, op: str, shape):
    """(batch, latent frames, video height, video width, (input, output) buffer elements)."""
    sf, tf = model.spatial_factor, model.temporal_factor
    if op == "decode":
        b, _, n_lat, h, w = shape
        height, width = h * sf, w * sf
        frames = tf * (n_lat - 1) + 1
    else:
        b, _, frames, height, width = shape
        n_lat = (frames - 1 + tf - 1) // tf + 1
        height, width = -(-height // sf) * sf, -(-width // sf) * sf
    video = b * 3 * frames * height * width
    latent = b * model.latent_channels * n_lat * (height // sf) * (width // sf)
    return b, n_lat, height, width, (latent, video) if op == "decode" else (video, latent)


def estimate(model, op: str, shape, temporal_chunk: int, tile_size, tiling: str = "exact", device=None,
             cache_offload: str = "none", io_on_device: tuple[bool, bool] = (True, True)) -> int:
    """Predicted peak bytes on the compute device for one encode/decode with these settings.

    Fast tiles are independent untiled runs on a tile (with its overlap), so they use the untiled
    coefficients at tile size, plus the tile's own output buffer that is blended into the result.
    Offloaded caches ("host", "disk") leave all but the running module's old and new frames.
    `io_on_device`: whether the whole input and the whole output live on the compute device (a
    node's latent and frames stay in host memory and pass through the device a chunk at a time,
    which the activations already count).
    """
    device = torch.device(device) if device is not None else model.device
    dtype = model.decode_dtype if op == "decode" else model.encode_dtype
    elem = torch.finfo(dtype).bits // 8
    b, n_lat, height, width, io_elements = _geometry(model, op, shape)
    buffers = sum(n for n, here in zip(io_elements, io_on_device) if here)
    frames = model.temporal_factor * min(temporal_chunk, n_lat)  # pixel frames of a full chunk
    tile_pixels = 0
    if tile_size is not None:
        th, tw = as_pair(tile_size)
        tile_pixels = b * frames * min(th, height) * min(tw, width)
    fast = tile_size is not None and tiling == "fast"
    frame_pixels = tile_pixels / frames if fast else b * height * width  # one frame of what one stream runs
    coef = coefficients(model.family, op, "untiled" if tile_size is None or fast else "exact", device.type)
    # The calibration ran one latent frame per chunk, so its per_pixel holds the causal caches, which
    # are whole frames per module whatever the chunk length: they scale with the frame, the rest
    # with the chunk's pixel frames.
    cache_all, cache_largest = _cache_elements(model, op, device.type)
    per_chunk_pixel = max(0.0, coef["per_pixel"] - cache_all / model.temporal_factor)
    act = per_chunk_pixel * frames * frame_pixels + cache_all * frame_pixels
    if fast:
        clip_frames = model.temporal_factor * (n_lat - 1) + 1
        act += 3 * clip_frames * frame_pixels  # the tile's own output buffer
    else:
        act += coef.get("per_tile_pixel", 0.0) * tile_pixels
    if cache_offload != "none":
        act -= (cache_all - 2 * cache_largest) * frame_pixels
    return int(weight_bytes(model) + buffers * 4 + resident_cache_bytes(model, op, device) + elem * (act + coef.get("fixed", 0)))


def _cache_elements(model, op: str, device_type: str) -> tuple[float, float]:
    """Causal-cache elements per video pixel (all modules, the largest one); (0, 0) uncalibrated."""
    try:
        caches = coefficients(model.family, op, "caches", device_type)
    except KeyError:
        return 0.0, 0.0
    return caches["all"], caches["largest"]


def _grid(model, op, shape, temporal_chunk, tile_size, tile_overlap, tiling) -> tuple[int, int, int]:
    _, n_lat, height, width, _ = _geometry(model, op, shape)
    chunks = -(-n_lat // temporal_chunk)
    if tile_size is None:
        return 1, 1, chunks
    if tiling == "fast":
        sf = model.spatial_factor
        grid = latent_grid(height // sf, width // sf, tile_size, tile_overlap, sf)
        return (len(grid[0]), len(grid[1]), chunks) if grid else (1, 1, chunks)
    th, tw = as_pair(tile_size)
    return -(-height // th), -(-width // tw), chunks


def plan(model, op: str, input_shape, *, temporal_chunk=None, tile_size=None, tile_overlap=0, tiling="exact",
         memory_budget=None, device=None, cache_offload="auto", io_on_device=(True, True)) -> Plan:
    """Settings for an encode ("encode", pixels B,3,T,H,W) or decode ("decode", latent B,C,T,h,w).

    Without a budget the given settings are kept (temporal_chunk None -> 1; cache_offload "auto" ->
    "none"). With one, the largest settings that fit are chosen, the given ones acting as upper
    limits: untiled with the largest temporal chunk if that fits, then untiled with the causal caches
    offloaded (cache_offload "auto": to `offload_target`), else exact tiles, largest tile first, each
    without and then with offloaded caches. `io_on_device` as in `estimate`.
    """
    if op not in ("encode", "decode"):
        raise ValueError(f"op must be 'encode' or 'decode', got {op!r}")
    check_offload(cache_offload)
    device = torch.device(device) if device is not None else model.device
    budget = resolve_budget(memory_budget, device)
    offloads = [cache_offload]
    if cache_offload == "auto":
        offloads = ["none"]
        try:
            coefficients(model.family, op, "caches", device.type)
            offloads.append(offload_target(device))
        except KeyError:  # not calibrated: the caches stay on the device
            pass
    _, n_lat, height, width, _ = _geometry(model, op, input_shape)
    max_chunk = min(temporal_chunk or n_lat, n_lat) if budget is not None else (temporal_chunk or 1)
    given_tile = as_pair(tile_size) if tile_size is not None else None

    def make(chunk, tile, offload):
        peak = estimate(model, op, input_shape, chunk, tile, tiling, device, offload, io_on_device)
        fits = budget is None or peak <= budget
        grid = _grid(model, op, input_shape, chunk, tile, tile_overlap, tiling)
        return Plan(op, chunk, tile, tiling, offload, grid, peak, budget, fits, weight_bytes(model))

    def first_fit(tile):
        candidates = (make(chunk, tile, offload) for offload in offloads for chunk in chunks)
        return next((candidate for candidate in candidates if candidate.fits), None)

    if budget is None:
        return make(max_chunk, given_tile, offloads[0])
    chunks = sorted({max_chunk, *[c for c in (32, 16, 8, 4, 2, 1) if c < max_chunk]}, reverse=True)
    if given_tile is None or (given_tile[0] >= height and given_tile[1] >= width):
        if (candidate := first_fit(None)) is not None:
            return candidate
    limit = given_tile or (height, width)
    # Exact tiles below 4 latent cells cost far more time than they save; fast tiles must exceed
    # twice the overlap to make progress.
    smallest = 4 * model.spatial_factor
    if tiling == "fast":
        smallest = max(smallest, 2 * max(as_pair(tile_overlap)) + model.spatial_factor)
    tiles = [(min(t, limit[0]), min(t, limit[1])) for t in TILE_CANDIDATES if smallest <= t < max(height, width)]
    tiles = sorted(set(tiles), key=lambda hw: hw[0] * hw[1], reverse=True) or [limit]
    for tile in tiles:
        if (candidate := first_fit(tile)) is not None:
            return candidate
    # Nothing fits (marked fits=False). Smaller exact tiles stop paying once the whole-frame part of
    # the peak dominates (exact tiles bound each conv's temporaries, not the frames between layers),
    # while their cost keeps growing: take the largest tile within NEAR_LOWEST of the lowest peak.
    smallest = [make(1, tile, offloads[-1]) for tile in tiles]
    lowest = min(candidate.peak_bytes for candidate in smallest)
    return next(candidate for candidate in smallest if candidate.peak_bytes <= lowest * NEAR_LOWEST)
