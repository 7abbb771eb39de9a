"""The plan of one encode/decode, computed once: temporal chunk, tile grid, where the causal caches
wait between chunks, and the predicted peak memory on the compute device.

What a caller asks for is a `Settings` value (the user's knobs, validated once); `plan()` turns it
into a `Plan` and is the one place these are decided. The nodes call it once per run, show it,
reserve memory with it and hand it to the engine (`engine.encode/decode(model, x, plan)`); the web
preview calls it for its readout; the engine calls it itself when it is given settings instead of a
plan. Both are immutable: out-of-memory recovery makes a smaller plan (`recovery.smaller_plan`).

With a memory budget the largest settings that fit are chosen, the given ones acting as upper
limits: untiled with the largest temporal chunk, then untiled with the causal caches offloaded,
then exact tiles, largest first, each without and then with offloaded caches (offloading costs less
time than tiling). Peaks come from the calibrated memory model (`memory.estimate`); a case it has
no calibration for gets the given settings and no peak.

What the engine refuses in its inputs before it plans is `inputs`'.
"""
import dataclasses
import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import torch

from ..kernels import Optimizations, kernel_choice
from ..kernels.backend import host_available, host_free
from ..model.execution import OwnTiles
from ..model.video_vae import ClipExtent
from . import geometry, kernel_plan, memory
from .causal_cache import check_offload
from .geometry import Clip
from .kernel_plan import KernelPlan

OPS = ("encode", "decode")
AUTO_MARGIN = 0.10            # "auto" budget: free memory minus 10% ...
AUTO_MARGIN_MIN = 512 * 2**20  # ... and at least 512 MiB
TILE_CANDIDATES = (2048, 1536, 1024, 768, 640, 512, 384, 320, 256, 192, 128, 96, 64, 48, 32)
# Tiles of its own a model runs at once by default, per device type (else every tile of a clip): on the CPU one
# at a time, faster than a clip's tiles batched in two runs of three and smaller (MiniMax-H3, bench/RESULTS.md
# sections 23 and 25).
OWN_TILE_BATCH = {"cpu": 1}
STREAM_BELOW_TILE = 256  # under a budget, smaller exact tiles come only with frame streaming
NEAR_LOWEST = 1.10  # when no setting fits a budget: the fastest one within 10 % of the lowest peak
log = logging.getLogger("streamvae")


@dataclass(frozen=True)
class Settings:
    """How to run one encode/decode, as a caller asks for it; `plan()` turns it into a `Plan`.

    `temporal_chunk`: latent frames per step (None: the most that fit the budget, else 1).
    `tile_size` / `tile_overlap`: pixels of the video side, an int or (h, w); None or 0 = untiled.
    `tiling`: "exact" (equals untiled) or "fast" (independent blended tiles). `memory_budget`: bytes,
    "auto" (free memory minus a margin) or None (no limit): the largest settings that fit are chosen,
    the given ones acting as upper limits. `cache_offload`: where the causal caches wait between
    chunks, "none" (compute device), "host" (pinned CPU memory, for GPUs), "disk", or "auto"
    (offloaded when a budget or an out-of-memory retry needs it). `stream_frames`: run the
    stages of a chunk one frame at a time (`strategies.FrameStream`; one latent frame per chunk),
    which keeps one frame of every high-resolution layer on the device; None: when a budget needs it.
    For a model that runs its own tiles (`ClipExtent.OWN_TILES`: MiniMax-H3), `own_tile_batch`: tiles of
    a clip through the network at once (None: the device's default, `OWN_TILE_BATCH`, or fewer under a
    budget), and `stream_weights`: whether the weights it can stream wait in host memory (None: when a
    budget needs it). Every setting gives the same result. Values are checked here, with what to do; the family's
    smallest tile when planning.
    """

    temporal_chunk: int | None = None
    tile_size: geometry.Pair | None = None
    tile_overlap: geometry.Pair = (0, 0)
    tiling: str = "exact"
    memory_budget: int | str | None = None
    cache_offload: str = "auto"
    stream_frames: bool | None = None
    own_tile_batch: int | None = None
    stream_weights: bool | None = None

    def __post_init__(self):
        check_chunk(self.temporal_chunk)
        if self.own_tile_batch is not None and (isinstance(self.own_tile_batch, bool)
                                                or not isinstance(self.own_tile_batch, int) or self.own_tile_batch < 1):
            raise ValueError(f"own_tile_batch must be None (the device's default) or a positive number of tiles, "
                             f"got {self.own_tile_batch!r}")
        check_offload(self.cache_offload)
        check_budget(self.memory_budget)
        error = geometry.tiling_error(self.tile_size, self.tile_overlap, self.tiling)
        if error is not None:
            raise ValueError(error)
        # normalised: tiles as (h, w) pairs or None
        object.__setattr__(self, "tile_size", geometry.as_pair(self.tile_size) if self.tile_size else None)
        object.__setattr__(self, "tile_overlap", geometry.as_pair(self.tile_overlap or 0))


@dataclass(frozen=True)
class Plan:
    """How one encode/decode runs and what it is predicted to cost on the compute device.

    `input_shape`: the engine input (pixels B,3,T,H,W for encode, a latent B,C,T',h,w for decode),
    `clip` its frames and sizes. Tiles are in pixels of the video side. `cache_offload` is where the
    causal caches wait between chunks ("none": the compute device, "host", "disk"); `offload_fallback`
    where an out-of-memory retry may move them (None: the user chose). `peak_bytes` and `fits` are None
    where the memory model has no calibration; `tried` lists the settings that ran out of memory before
    this plan. `kernel_choice` is how each layer's exact kernel is picked ("measure": the fastest
    measured on this machine, `kernels_on_record` layer shapes of which are measured already;
    "defaults": fixed rules). `activation_layout` is the layout of the run's activations ("ncdhw" or
    "ndhwc", `run.kernel_plan`), in which the engine puts the model's weights before the run.
    `kernels` names the kernels its convs, norms and attention may take (`kernel_plan.KernelPlan`).
    `own_tiles`: how a model that runs its own tiles runs them (`execution.OwnTiles`), else None.
    """

    op: str
    input_shape: tuple[int, ...]
    clip: Clip
    temporal_chunk: int
    tile_size: geometry.Pair | None
    tile_overlap: geometry.Pair
    tiling: str
    cache_offload: str
    offload_fallback: str | None
    grid: tuple[int, int, int]   # tile rows, tile columns, temporal chunks
    peak_bytes: int | None
    budget_bytes: int | None
    fits: bool | None
    weight_bytes: int = 0        # the weights' part of peak_bytes (ComfyUI counts them itself)
    tried: tuple[str, ...] = ()
    kernel_choice: str = "defaults"
    kernels_on_record: int | None = None
    frames_streamed: bool = False  # the chunk's stages run one frame at a time (strategies.FrameStream)
    activation_layout: str = "ncdhw"
    kernels: KernelPlan = KernelPlan()
    # Stage inputs the passes that gather whole-clip statistics may keep, in host memory (`run.clip_statistics`).
    kept_stage_bytes: int = 0
    own_tiles: OwnTiles | None = None

    @property
    def work_bytes(self) -> int | None:
        """The peak without the weights: what to ask a host for beside the model it loads itself."""
        return None if self.peak_bytes is None else max(0, self.peak_bytes - self.weight_bytes)

    def settings(self) -> str:
        tile = "untiled" if self.tile_size is None else f"{self.tiling} tiles {self.tile_size[0]}x{self.tile_size[1]} px"
        caches = "" if self.cache_offload == "none" else f", caches offloaded to {self.cache_offload}"
        frames = ", frames streamed one at a time" if self.frames_streamed else ""
        if self.own_tiles is not None:
            weights = ", weights streamed from host memory" if self.own_tiles.weights_streamed else ""
            return f"the model's own tiles, {self.own_tiles.batch} at a time{weights}, its clips streamed"
        return f"{tile}, {self.temporal_chunk} latent frame(s) per chunk{frames}{caches}"

    def kernel_selection(self) -> str:
        """How this plan's kernels are picked among `kernels`, in words."""
        if self.kernel_choice == "defaults":
            return "fixed default kernels (kernel_choice setting)"
        return (f"kernels measured per layer shape ({self.kernels_on_record} shape(s) on record for this machine; "
                f"a new shape is timed once, on first use, {kernel_choice.TUNING_COST})")

    def describe(self) -> str:
        rows, cols, chunks = self.grid
        peak = "peak unknown" if self.peak_bytes is None else f"peak {self.peak_bytes / 2**30:.2f} GiB"
        return f"{rows}x{cols}x{chunks} ({self.settings()}), {peak}, {self.kernel_selection()}"

    def summary(self) -> str:
        """The short form the nodes and the web extension show."""
        rows, cols, chunks = self.grid
        text = f"tiles {rows}x{cols}x{chunks}"
        if self.peak_bytes is not None:
            text += f", peak {self.peak_bytes / 2**30:.2f} GiB" + (" (over budget)" if self.fits is False else "")
        if self.frames_streamed:
            text += ", frames streamed"
        if self.own_tiles is not None:
            text += f", {self.own_tiles.batch} own tile(s) at a time"
            text += ", weights streamed" if self.own_tiles.weights_streamed else ""
        if self.cache_offload != "none":
            text += f", caches offloaded to {self.cache_offload}"
        return text

    def below_floor(self, setting: str = "memory_budget", no_limit: str = "None for no limit",
                    in_bytes: bool = True) -> str:
        """What to say when even this plan, the smallest, exceeds the budget: the floor in GiB and how to
        change the setting, in the words of the surface it was given on: `setting` its name, `no_limit`
        what lifts the limit there, `in_bytes` whether it takes bytes (the library) or GiB."""
        floor = math.ceil(self.peak_bytes / 2**30 * 100) / 100  # GiB, rounded up so that it fits
        needed = f"{floor:g} GiB" + (f" ({math.ceil(floor * 2**30)} bytes)" if in_bytes else "")
        return (f"this {self.op} needs at least {self.peak_bytes / 2**30:.2f} GiB (its smallest plan: {self.settings()}), "
                f"more than the memory budget of {gib(self.budget_bytes)}: set {setting} to at least {needed}, or "
                f"{no_limit}, or {self.op} fewer pixels per frame")

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for key in ("input_shape", "grid", "tile_size", "tile_overlap", "tried"):
            d[key] = list(d[key]) if d[key] is not None else None
        d["estimated"] = self.peak_bytes is not None
        return d


class BudgetTooSmall(ValueError):
    """A memory budget the caller gave is below the smallest plan's peak; `plan` is that plan (its
    `below_floor` words the message for the surface that took the budget)."""

    def __init__(self, plan: Plan):
        super().__init__(plan.below_floor())
        self.plan = plan


def refuse_over_budget(plan: Plan, settings: Settings | None) -> None:
    """Raise BudgetTooSmall when `plan`, made from `settings`, does not fit a budget the caller gave in
    bytes (an "auto" budget is what is free now: its plan is tried anyway). The one home of that rule:
    the engine and the nodes ask here, each wording the message for its surface."""
    if plan.fits is False and settings is not None and isinstance(settings.memory_budget, int):
        raise BudgetTooSmall(plan)


# --- the memory a plan may use ------------------------------------------------------------------

def free_memory(device) -> int:
    """Bytes the device can still give us: CUDA free + what PyTorch's cache holds; CPU MemAvailable."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return host_free()


def budget_from_free(free: int) -> int:
    """The "auto" budget when `free` bytes are free: minus a margin for what the model does not count."""
    return max(0, free - max(int(free * AUTO_MARGIN), AUTO_MARGIN_MIN))


def gib(nbytes: int) -> str:
    """Bytes as GiB with three significant digits (a budget of a few bytes does not read as 0.00)."""
    return f"{nbytes / 2**30:.3g} GiB"


def check_budget(memory_budget) -> None:
    if memory_budget not in (None, "auto") and (isinstance(memory_budget, bool) or not isinstance(memory_budget, int)
                                                or memory_budget <= 0):
        raise ValueError(f"memory_budget must be None (no limit), 'auto' (the free memory) or a positive number of "
                         f"bytes (GiB x 2**30), got {memory_budget!r}")


def resolve_budget(memory_budget, device) -> int | None:
    """None (no limit), bytes, or "auto" (free memory minus a margin) -> bytes or None."""
    check_budget(memory_budget)
    if memory_budget == "auto":
        return budget_from_free(free_memory(device))
    return memory_budget


def offload_target(device) -> str:
    """Where "auto" offloads causal caches from `device`: pinned host memory from a GPU, else disk."""
    return "disk" if torch.device(device).type == "cpu" else "host"


# --- the plan -------------------------------------------------------------------------------------

def check_chunk(temporal_chunk) -> None:
    if temporal_chunk is not None and (isinstance(temporal_chunk, bool) or not isinstance(temporal_chunk, int)
                                       or temporal_chunk < 1):
        raise ValueError(f"temporal_chunk must be a positive number of latent frames, got {temporal_chunk!r}")


def grid(clip: Clip, temporal_chunk: int, tile_size, tile_overlap, tiling: str) -> tuple[int, int, int]:
    rows, cols = geometry.tile_grid(clip.height, clip.width, tile_size, tile_overlap, tiling, clip.spatial_factor)
    return rows, cols, clip.chunks(temporal_chunk)


def clip_of(model, op: str, input_shape) -> Clip:
    """The frames and sizes of `op` on an engine input of `input_shape` for `model`'s family."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    clip = Clip.of(op, tuple(input_shape), model.spatial_factor, model.temporal_factor)
    made = model.frames_made(op, input_shape[2])  # the network's frame rule (4n+1 unless it has its own)
    return dataclasses.replace(clip, **{"frames" if op == "decode" else "latent_frames": made})


def plan(model, op: str, input_shape, settings: Settings | None = None, *, device=None, io_on_device=(True, True),
         opts: Optimizations | None = None) -> Plan:
    """The plan for `op` ("encode"/"decode") of an input of `input_shape` on `device` (default: the
    model's), as `settings` (default `Settings()`) ask. Without a budget the given settings are kept
    (temporal_chunk None -> 1, cache_offload "auto" -> on the device, offloaded by an out-of-memory
    retry); with one, the fastest that fits (`_candidates`), or, when none does, the smallest, marked
    fits=False. `io_on_device`: whether the whole input and the whole output live on the compute
    device (`memory.estimate`). Raises ValueError for settings this family cannot run, with what to do.
    (temporal_chunk None is the whole clip where chunks cost passes: `ClipExtent.CHUNKS_AFTER_STATISTICS`.)

    Planning only decides: it leaves the model as it found it (the engine puts the weights in the
    plan's activation layout before the run, `kernels.activation_layout.weights_in`)."""
    clip = clip_of(model, op, input_shape)
    settings = clip_settings(model, clip, settings or Settings())
    error = geometry.tiling_error(settings.tile_size, settings.tile_overlap, settings.tiling, model.spatial_factor)
    if error is not None:
        raise ValueError(error)
    device = torch.device(device) if device is not None else model.device
    opts = opts or Optimizations()
    budget = resolve_budget(settings.memory_budget, device)
    target = offload_target(device)
    weights = memory.weight_bytes(model)
    on_record = kernel_choice.choices_for(device).on_record() if opts.kernel_choice == "measure" else None
    dtype = model.decode_dtype if op == "decode" else model.encode_dtype
    run_layout = kernel_plan.choose(model, opts.activation_layout, opts.kernel_choice, dtype)
    kernels = kernel_plan.kernels_for(model, op, device, dtype, run_layout, opts)

    def make(candidate: Candidate, peak=None, own: OwnTiles | None = None) -> Plan:
        chunk, tile, offload, streamed = candidate
        fallback = target if settings.cache_offload == "auto" and offload != target else None
        fits = None if peak is None else budget is None or peak <= budget
        chunks = grid(clip, chunk, tile, settings.tile_overlap, settings.tiling)
        resident = weights if own is None else memory.resident_weight_bytes(model, op, own, device)
        return Plan(op, tuple(input_shape), clip, chunk, tile, settings.tile_overlap, settings.tiling, offload, fallback,
                    chunks, peak, budget, fits, resident, kernel_choice=opts.kernel_choice,
                    kernels_on_record=on_record, frames_streamed=streamed, activation_layout=run_layout, kernels=kernels,
                    kept_stage_bytes=_kept_stage_bytes(model, op, chunks[2], device, budget, peak), own_tiles=own)

    def estimated(candidate: Candidate) -> Plan:
        chunk, tile, offload, streamed = candidate
        return make(candidate, memory.estimate(model, clip, chunk, tile, settings.tiling, device, offload, io_on_device,
                                               opts, streamed))

    # No chunk asked: one latent frame, or the whole clip where each chunk more costs passes over it.
    default_chunk = clip.latent_frames if model.clip_extent(op).gathers_statistics else 1
    given = (min(settings.temporal_chunk or default_chunk, clip.latent_frames), settings.tile_size,
             "none" if settings.cache_offload == "auto" else settings.cache_offload, bool(settings.stream_frames))
    if model.clip_extent(op) is ClipExtent.OWN_TILES:  # one chunk, untiled: the candidates are how its tiles run
        choices = _own_tile_choices(model, op, input_shape, settings, device)

        def own_plan(own: OwnTiles) -> Plan:
            return make(given, memory.estimate_own_tiles(model, clip, input_shape, own, device, io_on_device), own)

        return _fastest_fitting(choices[0], choices, own_plan, lambda own: make(given, None, own), budget, op, device)
    return _fastest_fitting(given, _candidates(model, clip, settings, target, device), estimated, make, budget, op,
                            device)


def _fastest_fitting(given, candidates, estimated, make, budget: int | None, op: str, device) -> Plan:
    """Without a budget the plan of `given`, with its predicted peak (`estimated`; KeyError where the memory
    model has no calibration for it) or none (`make`); with one, the first of `candidates` (fastest first)
    that fits, else the fastest within NEAR_LOWEST of the lowest peak."""
    if budget is None:
        try:
            return estimated(given)
        except KeyError:  # no calibration for this family/op/mode/device: no predicted peak
            return make(given)
    plans = []
    for candidate in candidates:
        try:
            plans.append(estimated(candidate))
        except KeyError as missing:  # this mode is not calibrated: the planner cannot say it fits
            why = missing.args[0] if missing.args else missing
            _warn_once(f"StreamVAE {op}: {why}; plans of that kind are not considered under a memory budget")
            continue
        if plans[-1].fits:
            return plans[-1]
    if not plans:
        _warn_once(f"StreamVAE {op}: memory budget ignored (no memory calibration for this model on {device.type}); "
                   "an out-of-memory error still shrinks the run")
        return make(given)
    # Nothing fits: the fastest of those within NEAR_LOWEST of the lowest peak (below it, plans only
    # get slower for the last few percent).
    lowest = min(candidate.peak_bytes for candidate in plans)
    return next(candidate for candidate in plans if candidate.peak_bytes <= lowest * NEAR_LOWEST)


def _kept_stage_bytes(model, op: str, chunks: int, device: torch.device, budget: int | None, peak: int | None) -> int:
    """What the passes gathering whole-clip statistics may keep of stage inputs in host memory (`Plan.
    kept_stage_bytes`; none without passes): from a GPU or without a budget, half the RAM the host may give
    buffers; on the CPU under a budget, what the budget leaves beside the predicted peak (none if unknown)."""
    if chunks < 2 or not model.clip_extent(op).gathers_statistics:
        return 0
    if device.type != "cpu" or budget is None:
        return host_available() // 2
    return max(0, budget - peak) if peak is not None else 0


def clip_settings(model, clip: Clip, settings: Settings) -> Settings:
    """`settings` for how much of the clip `model`'s op must see at once (`VideoVAE.clip_extent`): for a whole-clip
    extent one untiled chunk of every latent frame, for untiled chunks no tiles; what the caller asked otherwise is
    said and set aside (it would not give the whole clip's frames)."""
    extent = model.clip_extent(clip.op)
    if extent.tiled:
        return settings
    if extent.chunked:
        if settings.tile_size and min(settings.tile_size) < max(clip.height, clip.width):
            _warn_once(f"StreamVAE {clip.op}: this {model.family} {clip.op} runs on whole frames ({extent.value}: its "
                       f"layers are no convs that exact tiles could split), so tile_size={settings.tile_size!r} is set "
                       f"aside: it runs untiled, in temporal chunks. To need less memory: shorter chunks "
                       f"(temporal_chunk) or a smaller size")
        return dataclasses.replace(settings, tile_size=None, tiling="exact")
    asked = [f"{name}={value!r}" for name, value, kept in (
        ("temporal_chunk", settings.temporal_chunk, settings.temporal_chunk in (None, clip.latent_frames)),
        ("tile_size", settings.tile_size, not settings.tile_size or min(settings.tile_size) >= max(clip.height, clip.width)),
        ("stream_frames", settings.stream_frames, not settings.stream_frames)) if not kept]
    if asked:
        _warn_once(f"StreamVAE {clip.op}: this {model.family} {clip.op} sees the whole clip at once ({extent.value}; "
                   f"chunks or tiles would change its frames), so {', '.join(asked)} {'is' if len(asked) == 1 else 'are'} "
                   f"set aside: it runs on all {clip.latent_frames} latent frames in one chunk. To need less memory: "
                   f"{clip.op} fewer frames or a smaller size")
    return dataclasses.replace(settings, temporal_chunk=clip.latent_frames, stream_frames=False, tile_size=None,
                               tiling="exact")


Candidate = tuple  # (temporal chunk, tile (h, w) or None, cache offload, frames streamed)


def _own_tile_choices(model, op: str, input_shape, settings: Settings, device) -> list[OwnTiles]:
    """How a model that runs its own tiles may run them, fastest first, the given settings acting as upper
    limits: the device's batch of tiles (`OWN_TILE_BATCH`, else every tile of a clip; `own_tile_batch`) halved
    down to one, weights resident, then the same with the weights streamed (`stream_weights` None: both, but
    on the CPU, whose memory streaming would not spare, resident; a model with none to stream: resident)."""
    tiles = model.own_tile_work(op, tuple(input_shape)).tiles
    top = min(settings.own_tile_batch or OWN_TILE_BATCH.get(torch.device(device).type, tiles), tiles)
    batches = sorted({top >> k or 1 for k in range(top.bit_length())}, reverse=True)
    streams = [False, True] if model.streamed_modules(op) and torch.device(device).type != "cpu" else [False]
    if settings.stream_weights is not None:
        streams = [settings.stream_weights and bool(model.streamed_modules(op))]
    return [OwnTiles(batch, streamed) for streamed in streams for batch in batches]


def _candidates(model, clip: Clip, settings: Settings, target: str, device) -> Iterator[Candidate]:
    """The plans to try under a budget, fastest first, the given settings acting as upper limits:
    untiled with the longest chunk down to one latent frame, with the caches on the device and then
    offloaded (`target`: pinned host memory from a GPU, disk from the CPU; offloading costs less time
    than tiling); exact tiles from the largest down to STREAM_BELOW_TILE px, the same way; then frame
    streaming (one latent frame per chunk, its stages one frame at a time, caches offloaded), untiled
    and with every tile down to the family's smallest: below STREAM_BELOW_TILE px tiles cost more
    time than streaming frames does (a caller's tile below that size is tried as it is first: it is a
    limit, not a wish to stream). The smaller tiles without streaming come last (where streaming has no
    calibration, or is not allowed). Only what the op's `clip_extent` allows: a whole-clip extent one chunk, never
    streamed, untiled where it takes no tiles; chunks after whole-clip statistics every tile of the longest chunk
    before any shorter chunk (each chunk more costs a pass over the clip per norm), then streamed frames."""
    height, width, n_lat = clip.height, clip.width, clip.latent_frames
    extent = model.clip_extent(clip.op)
    max_chunk = min(settings.temporal_chunk or n_lat, n_lat)
    chunks = sorted({max_chunk, *[c for c in (32, 16, 8, 4, 2, 1) if c < max_chunk and extent.chunked]}, reverse=True)
    offloads = [settings.cache_offload] if settings.cache_offload != "auto" else ["none"]
    if settings.cache_offload == "auto" and memory.cache_calibrated(model, clip.op, torch.device(device).type):
        offloads.append(target)
    limit = settings.tile_size or (height, width)
    smallest = geometry.min_tile(model.spatial_factor)
    if settings.tiling == "fast":  # a fast tile must exceed twice the overlap to make progress
        smallest = max(smallest, 2 * max(settings.tile_overlap) + model.spatial_factor)
    tiles = [(min(t, limit[0]), min(t, limit[1])) for t in TILE_CANDIDATES if smallest <= t < max(height, width)]
    tiles = (sorted(set(tiles), key=lambda hw: hw[0] * hw[1], reverse=True) or [limit]) if extent.tiled else []
    whole = [None] if settings.tile_size is None or (limit[0] >= height and limit[1] >= width) else []
    # The caller's tile is an upper limit, never a reason to leave memory: below STREAM_BELOW_TILE px it
    # is still tried whole-chunk, with the caches on the device, before anything streams.
    large = [tile for tile in tiles if max(tile) >= min(STREAM_BELOW_TILE, max(limit))]

    if extent.gathers_statistics:  # a clip in several chunks passes through once per norm first: tiles first
        if settings.stream_frames is not True:
            yield from ((chunk, tile, offload, False) for chunk in chunks for tile in whole + tiles for offload in offloads)
        if settings.stream_frames is not False and settings.tiling == "exact":
            yield from ((1, tile, offloads[-1], True) for tile in whole + tiles)
        return

    def whole_chunks(tiles):
        if settings.stream_frames is True:
            return
        for tile in tiles:
            for offload in offloads:
                for chunk in chunks:
                    yield chunk, tile, offload, False

    yield from whole_chunks(whole + large)
    if settings.stream_frames is not False and settings.tiling == "exact" and extent.chunked:
        for tile in whole + tiles:
            yield 1, tile, offloads[-1], True
    yield from whole_chunks([tile for tile in tiles if tile not in large])


@lru_cache(maxsize=64)
def _warn_once(message: str) -> None:
    """Log `message` the first time (a bounded cache of what was said: the planner runs per preview)."""
    log.warning(message)
