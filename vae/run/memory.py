"""Memory model: predict an encode/decode's peak memory on its compute device (`planning.py` uses it to
pick settings that fit a budget).

Peak = weights + the input/output buffers that live on the compute device (a decode into host
memory counts none of its output) + what stays resident between calls (the CPU Winograd filter
cache, from the model's conv weights and the cache cap) + activations. Activations follow a linear
model calibrated by measurement for each family, op and mode (untiled, exact tiles; fast tiles are
untiled runs of one tile), separately per device type (bench/calibrate_memory.py writes each family's
`memory_calibration.json` in its folder, vae/model/<family>/, device -> op -> mode; `calibration`
merges them): on the CPU the peak of live tensors, on CUDA the peak the caching allocator reserves
(cuDNN workspaces and fragmentation included). A device type without
its own calibration (a GPU before `python -m bench.gpu_check --parts calibrate` ran on one; MPS)
uses the CPU's coefficients times UNCALIBRATED_MARGIN:

    activations = element_size * (per_pixel * chunk_pixels + per_tile_pixel * tile_pixels + fixed)

with chunk_pixels the pixel-frames of one temporal chunk at video resolution (decode output /
encode input) and tile_pixels those of one spatial tile (exact tiling). The causal caches are part
of that; offloaded (`causal_cache.py`), they leave the compute device except the running module's
own (its old and new frames), which `cache_profile` (elements per video pixel, all caches and the
largest, measured by a short run) gives. The keys and values a frame-causal attention keeps of the
whole clip (HunyuanVideo 1.5: `VideoVAE.attention_cache_elements`) are counted on top: at every step
where they stay on the device, at the attention step where they are offloaded.

An op in temporal chunks of whole frames (`ClipExtent.UNTILED_CHUNKS`: LTX-2.5's decoder, whose layers keep
their own state between chunks) has modes of its own, "untiled_chunks" and, its state offloaded,
"untiled_chunks_offloaded": activations = element_size * (per_pixel * chunk_pixels + per_frame_pixel *
frame_pixels + per_clip_pixel * clip_pixels + fixed) (`untiled_chunk_features`), fitted to the meta-device
count of its code path (`bench.calibrate_memory --untiled-chunks`).
"""
import json
from functools import lru_cache
from pathlib import Path

import torch

from ..kernels import Optimizations, filter_cache, winograd
from ..kernels import conv as opt_conv
from ..model.execution import OwnTiles
from ..model.video_vae import ClipExtent, OwnTileWork
from .clip_statistics import EachChunksOwn
from .geometry import Clip, as_pair, pixel_frames
from .run_context import RunContext

MODELS = Path(__file__).resolve().parents[1] / "model"  # the family folders (vae/model/<family>/)
CALIBRATION_FILE = "memory_calibration.json"
# CPU coefficients on a GPU underestimate its peaks, by less than this margin on the one GPU measured
# (bench/RESULTS.md sections 0 and 10; section 10 also for the streamed mode below).
UNCALIBRATED_MARGIN = 2.0


def calibration_path(family: str) -> Path:
    """The file of `family`'s memory coefficients, in its folder: {device type: {op: {mode: entry}}}."""
    return MODELS / family / CALIBRATION_FILE


@lru_cache(maxsize=1)
def calibration() -> dict:
    """Every family's memory coefficients, merged: {device type: {family: {op: {mode: entry}}}} ({}: none)."""
    table: dict = {}
    for path in sorted(MODELS.glob(f"*/{CALIBRATION_FILE}")):
        for device_type, ops in json.loads(path.read_text()).items():
            table.setdefault(device_type, {})[path.parent.name] = ops
    return table


def coefficients(family: str, op: str, mode: str, device_type: str) -> dict:
    """Calibrated {per_pixel, per_tile_pixel, fixed} for a family/op/mode ("caches": the
    `cache_profile`, elements per pixel, the same on every device) on `device_type`; where that
    device type has no calibration, the CPU's times UNCALIBRATED_MARGIN. An entry may say where its
    numbers come from ("source": "cpu", the CUDA streamed mode until a GPU measures it: tiled one frame
    at a time, a GPU holds the CPU's live tensors, and the meta-device count of the GPU code path
    agrees); only the numbers are returned."""
    table = calibration()
    entry = table.get(device_type, {}).get(family, {}).get(op, {}).get(mode)
    if entry:
        return {name: value for name, value in entry.items() if name != "source"}
    entry = table.get("cpu", {}).get(family, {}).get(op, {}).get(mode)
    if entry:
        numbers = {name: value for name, value in entry.items() if name != "source"}
        return numbers if mode == "caches" else {k: v * UNCALIBRATED_MARGIN for k, v in numbers.items()}
    raise KeyError(f"no memory calibration for {family} {op} {mode}; run python -m bench.calibrate_memory")


def calibration_mode(extent: ClipExtent, tile_size, tiling: str, streamed: bool, cache_offload: str) -> str:
    """The calibrated mode a plan's activations follow: for an op in temporal chunks of whole frames
    (`ClipExtent.UNTILED_CHUNKS`) "untiled_chunks", or "untiled_chunks_offloaded" with the caches offloaded;
    else "streamed", "untiled" (fast tiles too) or "exact"."""
    if extent is ClipExtent.UNTILED_CHUNKS:
        return "untiled_chunks" if cache_offload == "none" else "untiled_chunks_offloaded"
    return "streamed" if streamed else "untiled" if tile_size is None or tiling == "fast" else "exact"


def calibration_source(family: str, op: str, mode: str, device_type: str) -> str:
    """Where `coefficients(family, op, mode, device_type)` come from: "measured" on that device type,
    "the CPU's" or "meta-device count" (an entry that says so: `bench.calibrate_memory --meta` counts the
    tensors the device's code path holds, without the device), "derived" (the CPU's times
    UNCALIBRATED_MARGIN) or "none"."""
    table = calibration()
    entry = table.get(device_type, {}).get(family, {}).get(op, {}).get(mode)
    if entry:
        return {"cpu": "the CPU's", "meta": "meta-device count"}.get(entry.get("source"), "measured")
    return "derived" if table.get("cpu", {}).get(family, {}).get(op, {}).get(mode) else "none"


def calibration_summary(device_type: str) -> str:
    """Per family, where the memory model's coefficients on `device_type` come from, e.g. "seedvr2
    measured (streamed: the CPU's); qwen21 derived (the CPU's x 2.0)"."""
    table = calibration()
    parts = []
    for family in sorted(set(table.get("cpu", {})) | set(table.get(device_type, {}))):
        sources: dict[str, list[str]] = {}
        for source_table in (table.get("cpu", {}), table.get(device_type, {})):
            for op, modes in source_table.get(family, {}).items():
                for mode in modes:
                    if mode != "caches":
                        where = calibration_source(family, op, mode, device_type)
                        sources.setdefault(where, [])
                        if f"{op} {mode}" not in sources[where]:
                            sources[where].append(f"{op} {mode}")
        main = max(sources, key=lambda where: len(sources[where]))
        rest = ", ".join(f"{', '.join(sorted(items))}: {where}" for where, items in sources.items() if where != main)
        label = f"derived (the CPU's x {UNCALIBRATED_MARGIN:g})" if main == "derived" else main
        parts.append(f"{family} {label}" + (f" ({rest})" if rest else ""))
    return "; ".join(parts)


STEADY_CHUNKS_MAX = 64  # latent frames a steady state is looked for in (LTX-2's decoder fills in about 22)


def steady_cache_sizes(model, op: str, latent_hw: tuple[int, int],
                       opts: Optimizations | None = None) -> list[tuple[torch.Size, int]]:
    """(shape, bytes) of every causal cache a steady chunk leaves at latent_hw latent cells: what running
    one-latent-frame chunks of zeros keeps (frame 0 alone, then one latent frame at a time) once a
    chunk changes nothing. Causal networks are steady after the second chunk; a decoder whose convs
    look ahead once its last layer has had frames (every layer one frame behind the one before it)."""
    h, w = latent_hw
    sf = model.spatial_factor
    if op == "decode":
        frame, dtype, run = (1, model.latent_channels, 1, h, w), model.decode_dtype, model.decode_chunk
        first = torch.zeros(frame, dtype=dtype, device=model.device)
    else:
        frame = (1, model.in_channels, model.temporal_factor, h * sf, w * sf)
        dtype, run = model.encode_dtype, model.encode_chunk
        first = torch.zeros(frame[:2] + (1,) + frame[3:], dtype=dtype, device=model.device)
    steady = torch.zeros(frame, dtype=dtype, device=model.device)
    ctx = RunContext(opts or Optimizations(), frames_are_images=model.frames_are_images)
    ctx.clip_statistics = EachChunksOwn()  # sizes are what is counted here, not values
    sizes = None
    with torch.inference_mode():
        for chunk, _ in ctx.chunks(1 + STEADY_CHUNKS_MAX, 1, ending=False):
            run(steady if chunk else first, ctx)
            before, sizes = sizes, sorted(ctx.cache.sizes()) if chunk else None
            if sizes is not None and sizes == before:
                break
    return ctx.cache.sizes()


def cache_profile(model, op: str, cells: int = 8) -> dict:
    """Causal-cache elements per video pixel that a steady chunk leaves: {"all": summed over the
    modules, "largest": of one module}, from `steady_cache_sizes` at `cells` x `cells` latent cells
    (the caches are whole frames, so they scale with the frame area)."""
    pixels = (cells * model.spatial_factor) ** 2
    sizes = [shape.numel() for shape, _ in steady_cache_sizes(model, op, (cells, cells))]
    return {"all": sum(sizes) / pixels, "largest": max(sizes, default=0) / pixels}


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _module_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def resident_weight_bytes(model, op: str, own: OwnTiles | None, device) -> int:
    """The weights in the compute device's memory during `op`: all of them, or, where `own` streams them
    (`execution.OwnTiles`) from host memory to another device, all but the `streamed_modules`, of which two
    are there at a time (the one running and the next arriving). (On the CPU host memory is the device's.)"""
    streams = own is not None and own.weights_streamed and torch.device(device).type != "cpu"
    streamed = model.streamed_modules(op) if streams else []
    sizes = sorted(map(_module_bytes, streamed))
    return weight_bytes(model) - sum(sizes) + sum(sizes[-2:])


# The coefficients of a model that runs its own tiles (`estimate_own_tiles`), in the order of their features.
OWN_TILE_COEFFICIENTS = ("per_pixel", "per_tile_pixel", "per_held_tile_pixel")


def own_tile_features(work: OwnTileWork, own: OwnTiles) -> list[float]:
    """What the coefficients of a model that runs its own tiles multiply (`OWN_TILE_COEFFICIENTS`): the
    pixels of a clip's blended frames, of the tiles run at once, and of the tiles whose tokens are held
    between blocks (every tile of the clip with the weights streamed, else none)."""
    held = work.tiles * work.tile_pixels if own.weights_streamed else 0
    return [work.clip_pixels, min(own.batch, work.tiles) * work.tile_pixels, held]


def own_tile_elements(coef: dict, features: list[float]) -> float:
    """Activation elements of a model that runs its own tiles: `coef` (the "own_tiles" coefficients) . the
    `own_tile_features` + fixed."""
    return _linear_elements(coef, OWN_TILE_COEFFICIENTS, features)


def estimate_own_tiles(model, clip: Clip, input_shape, own: OwnTiles, device, io_on_device=(True, True)) -> int:
    """Predicted peak bytes on the compute device of a model that runs its own tiles (`ClipExtent.OWN_TILES`),
    as `own` says: the weights there (`resident_weight_bytes`), the whole input and output where they live
    there, and the activations of one clip, calibrated per device type in the mode "own_tiles":

        activations = element_size * (coefficients . own_tile_features + fixed)

    (`VideoVAE.own_tile_work` gives the pixels)."""
    device = torch.device(device)
    op = clip.op
    dtype = model.decode_dtype if op == "decode" else model.encode_dtype
    basis, scale = model.memory_calibration(op)
    coef = coefficients(basis, op, "own_tiles", device.type)
    features = own_tile_features(model.own_tile_work(op, tuple(input_shape)), own)
    act = own_tile_elements(coef, features)
    buffers = sum(n for n, here in zip(_io_elements(model, clip), io_on_device) if here)
    return int(resident_weight_bytes(model, op, own, device) + buffers * 4 + torch.finfo(dtype).bits // 8 * act * scale)


# The coefficients of an op in temporal chunks of whole frames (`ClipExtent.UNTILED_CHUNKS`), in the order of
# their features (`untiled_chunk_features`).
UNTILED_CHUNK_COEFFICIENTS = ("per_pixel", "per_frame_pixel", "per_clip_pixel")


def untiled_chunk_features(model, clip: Clip, temporal_chunk: int) -> list[float]:
    """What the coefficients of an op in temporal chunks of whole frames multiply (`UNTILED_CHUNK_COEFFICIENTS`):
    the pixels of a chunk's frames (what a call computes), of one frame (what its layers keep between calls:
    their windows' frames, whatever the chunk) and of the clip (what it keeps for the whole clip: LTX-2.5's
    noise, drawn whole), at video resolution."""
    frame = clip.batch * clip.height * clip.width
    return [frame * model.temporal_factor * min(temporal_chunk, clip.latent_frames), frame, frame * clip.frames]


def untiled_chunk_elements(coef: dict, features: list[float]) -> float:
    """Activation elements of an op in temporal chunks of whole frames: `coef` . the `untiled_chunk_features` + fixed."""
    return _linear_elements(coef, UNTILED_CHUNK_COEFFICIENTS, features)


def _linear_elements(coef: dict, names: tuple[str, ...], features: list[float]) -> float:
    """The coefficients `names` of `coef` (0 where absent) . `features`, + its fixed term."""
    return sum(coef.get(name, 0.0) * value for name, value in zip(names, features)) + coef.get("fixed", 0)


def resident_cache_bytes(model, op: str, device, opts: Optimizations) -> int:
    """What stays resident between calls of `op` on `device`: the CPU Winograd filter transforms of
    its eligible 3x3 convs that run Winograd, up to the cache's cap; nothing elsewhere. With kernels
    measured per layer shape (`opts.kernel_choice`) a conv runs Winograd where this machine's record
    says so for its weight (a conv none of whose shapes is on record yet is counted: measuring it
    computes the transform, which stays if Winograd wins); with the default kernels, wherever eligible."""
    if torch.device(device).type != "cpu" or not opts.winograd_conv:
        return 0
    total = 0
    roots = model.decode_modules() if op == "decode" else model.encode_modules()
    dtype = model.decode_dtype if op == "decode" else model.encode_dtype
    for module in (m for root in roots for m in root.modules()):
        weight = getattr(module, "weight", None)
        if not (isinstance(module, torch.nn.Conv3d) and weight is not None and weight.dim() == 5
                and opt_conv.winograd_weight_eligible(weight.shape, module.stride)):
            continue
        if opts.kernel_choice == "measure" and opt_conv.uses_winograd(device, dtype, weight.shape, module.stride) is False:
            continue
        total += winograd.transform_nbytes(weight.shape)
    return min(total, filter_cache.filter_cache(opts.winograd_cache_bytes).limit_bytes)


def _io_elements(model, clip: Clip) -> tuple[int, int]:
    """Elements of the whole (input, output) of the op: pixels (an upscale decoder's at its output size)
    and latent."""
    if clip.op == "decode":
        video = clip.batch * model.out_channels * model.decode_upscale ** 2 * clip.frames * clip.height * clip.width
    else:
        video = clip.batch * model.in_channels * clip.frames * clip.height * clip.width
    h, w = clip.latent_hw
    latent = clip.batch * model.latent_channels * clip.latent_frames * h * w
    return (latent, video) if clip.op == "decode" else (video, latent)


def estimate(model, clip: Clip, temporal_chunk: int, tile_size, tiling: str = "exact", device=None,
             cache_offload: str = "none", io_on_device: tuple[bool, bool] = (True, True),
             opts: Optimizations | None = None, streamed: bool = False) -> int:
    """Predicted peak bytes on the compute device for one encode/decode of `clip` with these settings.

    `streamed`: the chunk's stages run one frame at a time (`strategies.FrameStream`); then the
    activations follow the "streamed" coefficients, calibrated with the caches offloaded and one
    latent frame per chunk: per_pixel per pixel of one frame (what every high-resolution layer holds
    of one frame) and per_tile_pixel per pixel of one frame's tile (the conv buffers), whatever the
    chunk (an untiled frame is one tile), plus the offloaded caches' bands (`cache_band_elements`);
    the caches are added whole where they stay on the device.

    Fast tiles are independent untiled runs on a tile (with its overlap), so they use the untiled
    coefficients at tile size, plus the tile's own output buffer that is blended into the result.
    Offloaded caches ("host", "disk") leave all but the running module's old and new frames.
    `io_on_device`: whether the whole input and the whole output live on the compute device (a
    node's latent and frames stay in host memory and pass through the device a chunk at a time,
    which the activations already count). `opts`: the optimizations the run uses (default: all on).
    """
    opts = opts or Optimizations()
    device = torch.device(device) if device is not None else model.device
    op, b, n_lat, height, width = clip.op, clip.batch, clip.latent_frames, clip.height, clip.width
    dtype = model.decode_dtype if op == "decode" else model.encode_dtype
    elem = torch.finfo(dtype).bits // 8
    buffers = sum(n for n, here in zip(_io_elements(model, clip), io_on_device) if here)
    frames = model.temporal_factor * min(temporal_chunk, n_lat)  # pixel frames of a full chunk
    tile_pixels = 0
    if tile_size is not None:
        th, tw = as_pair(tile_size)
        tile_pixels = b * frames * min(th, height) * min(tw, width)
    fast = tile_size is not None and tiling == "fast"
    frame_pixels = tile_pixels / frames if fast else b * height * width  # one frame of what one stream runs
    basis, scale = model.memory_calibration(op)  # a variant scales its family's coefficients by its width
    extent = model.clip_extent(op)
    mode = calibration_mode(extent, tile_size, tiling, streamed, cache_offload)
    coef = {k: v * scale for k, v in coefficients(basis, op, mode, device.type).items()}
    resident = weight_bytes(model) + buffers * 4 + resident_cache_bytes(model, op, device, opts)
    if extent is ClipExtent.UNTILED_CHUNKS:  # its layers' own state: calibrated whole, on the device or offloaded
        return int(resident + elem * untiled_chunk_elements(coef, untiled_chunk_features(model, clip, temporal_chunk)))
    cache_all, cache_largest = _cache_elements(model, op, device.type)
    chunk = 1 if streamed else min(temporal_chunk, n_lat)
    if streamed:
        th, tw = (min(side, full) for side, full in zip(as_pair(tile_size or (height, width)), (height, width)))
        frame_pixels = b * height * width
        act = coef["per_pixel"] * frame_pixels + coef.get("per_tile_pixel", 0.0) * b * th * tw
        act += cache_all * frame_pixels if cache_offload == "none" else b * cache_band_elements(cache_largest, th, width)
        return int(resident + elem * (_with_attention_cache(model, clip, chunk, cache_offload, act) + coef.get("fixed", 0)))
    # The calibration ran one latent frame per chunk, so its per_pixel holds the causal caches, which
    # are whole frames per module whatever the chunk length: they scale with the frame, the rest
    # with the chunk's pixel frames.
    per_chunk_pixel = max(0.0, coef["per_pixel"] - cache_all / model.temporal_factor)
    act = per_chunk_pixel * frames * frame_pixels + cache_all * frame_pixels
    if fast:
        channels = model.out_channels * model.decode_upscale ** 2 if op == "decode" else 3
        act += channels * pixel_frames(n_lat, model.temporal_factor) * frame_pixels  # the tile's own output buffer
    else:
        act += coef.get("per_tile_pixel", 0.0) * tile_pixels
    if cache_offload != "none":
        act -= (cache_all - 2 * cache_largest) * frame_pixels
    if not fast:  # a fast tile's attention spans the tile: its keys are in the untiled coefficients' range
        act = _with_attention_cache(model, clip, chunk, cache_offload, act)
    return int(resident + elem * (act + coef.get("fixed", 0)))


def _with_attention_cache(model, clip: Clip, chunk: int, cache_offload: str, act: float) -> float:
    """`act` (elements) with the keys and values a frame-causal attention keeps of the whole clip
    (`kv_cache.py`): on the device they add to every step; offloaded, they are read back for the
    attention step only, where the rest is the chunk's latent-resolution tensors (counted as the
    chunk's own keys and values again, for its queries and output), far below the high-resolution
    steps' peak. The calibrated runs (two latent frames) hold a negligible part of them."""
    whole = model.attention_cache_elements(clip.op, clip.batch, clip.latent_frames, clip.latent_hw)
    if cache_offload == "none":
        return act + whole
    return max(act, whole + model.attention_cache_elements(clip.op, clip.batch, chunk, clip.latent_hw))


def cache_band_elements(largest: float, tile_rows: int, width: int) -> float:
    """Elements of the offloaded caches on the device while a conv runs under exact tiles: the old
    and the new band of rows of the largest module's cache (`largest`: its elements per video pixel),
    as tall as a row of tiles with its halo, the frame wide (`strategies.ExactTiles`)."""
    return 2 * largest * (tile_rows + 2) * width


def cache_calibrated(model, op: str, device_type: str) -> bool:
    """Whether the causal caches' size is known for this family/op (needed to plan offloading them): for an op
    in temporal chunks of whole frames, whether its offloaded mode is calibrated."""
    if model.clip_extent(op) is ClipExtent.UNTILED_CHUNKS:
        return calibration_source(model.memory_calibration(op)[0], op, "untiled_chunks_offloaded", device_type) != "none"
    return _cache_elements(model, op, device_type) != (0.0, 0.0)


def _cache_elements(model, op: str, device_type: str) -> tuple[float, float]:
    """Causal-cache elements per video pixel (all modules, the largest one); (0, 0) uncalibrated."""
    basis, scale = model.memory_calibration(op)
    try:
        caches = coefficients(basis, op, "caches", device_type)
    except KeyError:
        return 0.0, 0.0
    return caches["all"] * scale, caches["largest"] * scale
