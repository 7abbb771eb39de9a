"""Memory model and planning: predict an encode/decode's peak memory, pick settings that fit a budget.

Peak = weights + input/output buffers on the compute device + what stays resident between calls
(the CPU Winograd filter cache, from the model's conv weights and the cache cap) + activations.
Activations follow a
linear model calibrated by measurement for each family, op and mode (untiled, exact tiles; fast tiles
are untiled runs of one tile) on the CPU (bench/calibrate_memory.py writes `memory_calibration.json`
beside this file; a CUDA calibration is used on CUDA where one exists):

    activations = element_size * (per_pixel * chunk_pixels + per_tile_pixel * tile_pixels) + fixed

with chunk_pixels the pixel-frames of one temporal chunk at video resolution (decode output /
encode input) and tile_pixels those of one spatial tile (exact tiling). Untiled execution is chosen
whenever it fits, because tiling costs time.
"""
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from .tiling import as_pair, latent_grid

try:  # inside the ComfyUI pack, `optimizations` is a sibling subpackage
    from ..optimizations import conv as opt_conv, winograd
except ImportError:  # plain library use: the repository root is on sys.path
    from optimizations import conv as opt_conv, winograd

CALIBRATION = Path(__file__).with_name("memory_calibration.json")
AUTO_MARGIN = 0.10            # "auto" budget: free memory minus 10% ...
AUTO_MARGIN_MIN = 512 * 2**20  # ... and at least 512 MiB
TILE_CANDIDATES = (2048, 1536, 1024, 768, 640, 512, 384, 320, 256, 192, 128, 96, 64, 48, 32)


@dataclass(frozen=True)
class Plan:
    """Settings for one encode/decode and what they are predicted to cost on the compute device."""

    op: str
    temporal_chunk: int          # latent frames per step
    tile_size: tuple[int, int] | None  # pixels; None = untiled
    tiling: str                  # "exact" or "fast"
    grid: tuple[int, int, int]   # tile rows, tile columns, temporal chunks
    peak_bytes: int              # predicted peak: weights + buffers + activations
    budget_bytes: int | None
    fits: bool

    def describe(self) -> str:
        rows, cols, chunks = self.grid
        tile = "untiled" if self.tile_size is None else f"{self.tiling} tiles {self.tile_size[0]}x{self.tile_size[1]} px"
        return f"{rows}x{cols}x{chunks} ({tile}, {self.temporal_chunk} latent frames per chunk), peak {self.peak_bytes / 2**30:.2f} GiB"


@lru_cache(maxsize=1)
def _calibration() -> dict:
    return json.loads(CALIBRATION.read_text()) if CALIBRATION.is_file() else {}


def coefficients(family: str, op: str, mode: str, device_type: str) -> dict:
    """Calibrated {per_pixel, per_tile_pixel, fixed} for a family/op/mode, preferring the device's own
    measurement (CPU numbers stand in where a device type has none)."""
    table = _calibration()
    for dev in (device_type, "cpu"):
        entry = table.get(dev, {}).get(family, {}).get(op, {}).get(mode)
        if entry:
            return entry
    raise KeyError(f"no memory calibration for {family} {op} {mode}; run bench/calibrate_memory.py")


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
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil  # not on Linux: ask psutil (installed with ComfyUI)

    return psutil.virtual_memory().available


def resolve_budget(memory_budget, device) -> int | None:
    """None (no limit), bytes, or "auto" (free memory minus a margin) -> bytes or None."""
    if memory_budget is None:
        return None
    if memory_budget == "auto":
        free = free_memory(device)
        return max(0, free - max(int(free * AUTO_MARGIN), AUTO_MARGIN_MIN))
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget <= 0:
        raise ValueError(f"memory_budget must be None, 'auto' or a positive number of bytes, got {memory_budget!r}")
    return memory_budget


def _geometry(model, op: str, shape):
    """(latent frames, video height, video width, bytes of the input + output buffers per element)."""
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
    return b, n_lat, height, width, video + latent


def estimate(model, op: str, shape, temporal_chunk: int, tile_size, tiling: str = "exact", device=None) -> int:
    """Predicted peak bytes on the compute device for one encode/decode with these settings.

    Fast tiles are independent untiled runs on a tile (with its overlap), so they use the untiled
    coefficients at tile size, plus the tile's own output buffer that is blended into the result.
    """
    device = torch.device(device) if device is not None else model.device
    dtype = model.decode_dtype if op == "decode" else model.encode_dtype
    elem = torch.finfo(dtype).bits // 8
    b, n_lat, height, width, buffers = _geometry(model, op, shape)
    frames = model.temporal_factor * min(temporal_chunk, n_lat)  # pixel frames of a full chunk
    tile_pixels = 0
    if tile_size is not None:
        th, tw = as_pair(tile_size)
        tile_pixels = b * frames * min(th, height) * min(tw, width)
    if tile_size is not None and tiling == "fast":
        coef = coefficients(model.family, op, "untiled", device.type)
        clip_frames = model.temporal_factor * (n_lat - 1) + 1
        act = coef["per_pixel"] * tile_pixels + 3 * clip_frames * tile_pixels / frames
    else:
        coef = coefficients(model.family, op, "untiled" if tile_size is None else "exact", device.type)
        act = coef["per_pixel"] * b * frames * height * width + coef.get("per_tile_pixel", 0.0) * tile_pixels
    return int(weight_bytes(model) + buffers * 4 + resident_cache_bytes(model, op, device) + elem * act + coef.get("fixed", 0))


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
         memory_budget=None, device=None) -> Plan:
    """Settings for an encode ("encode", pixels B,3,T,H,W) or decode ("decode", latent B,C,T,h,w).

    Without a budget the given settings are kept (temporal_chunk None -> 1). With one, the largest
    settings that fit are chosen, the given ones acting as upper limits: untiled with the largest
    temporal chunk if that fits, else exact tiles, largest tile first.
    """
    if op not in ("encode", "decode"):
        raise ValueError(f"op must be 'encode' or 'decode', got {op!r}")
    device = torch.device(device) if device is not None else model.device
    budget = resolve_budget(memory_budget, device)
    _, n_lat, height, width, _ = _geometry(model, op, input_shape)
    max_chunk = min(temporal_chunk or n_lat, n_lat) if budget is not None else (temporal_chunk or 1)
    given_tile = as_pair(tile_size) if tile_size is not None else None

    def make(chunk, tile):
        peak = estimate(model, op, input_shape, chunk, tile, tiling, device)
        fits = budget is None or peak <= budget
        grid = _grid(model, op, input_shape, chunk, tile, tile_overlap, tiling)
        return Plan(op, chunk, tile, tiling, grid, peak, budget, fits)

    if budget is None:
        return make(max_chunk, given_tile)
    chunks = sorted({max_chunk, *[c for c in (32, 16, 8, 4, 2, 1) if c < max_chunk]}, reverse=True)
    if given_tile is None or (given_tile[0] >= height and given_tile[1] >= width):
        for chunk in chunks:
            candidate = make(chunk, None)
            if candidate.fits:
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
        for chunk in chunks:
            candidate = make(chunk, tile)
            if candidate.fits:
                return candidate
    return make(1, tiles[-1])  # nothing fits: the smallest setting, marked fits=False
