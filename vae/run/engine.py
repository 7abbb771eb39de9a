"""The engine: runs a whole clip through a `VideoVAE` in temporal chunks, as a `planning.Plan` says.

    z = vae.encode(model, video)                          # B,3,T,H,W in [-1, 1] -> raw posterior mean
    y = vae.decode(model, z, vae.Settings(tile_size=256))  # raw latent -> B,3,T'',H'',W'' (not clamped)

The model says what the network is, as the stages a temporal chunk passes through
(`encode_stages`/`decode_stages`); the engine does the rest, in one loop (`_run_chunks`, over the chunks
`RunContext.chunks` gives) whatever the strategy. The causal caches in the
`RunContext` make every chunking produce the whole-clip result (frames: `geometry.py`); chunks are
written into a preallocated output (optionally on another device) or handed to a `sink` (a video file
writer), and encode reads its input chunk by chunk (also from a video file), so memory does not grow
with clip length beyond the output itself.

How the layers of a chunk cover the frame is the run's execution strategy (`strategies/`): whole
frames, exact tiles, or row bands over the ranks of a process group (`bands=`, which also decides the
part of every frame this process computes). Fast tiles are independent runs on overlapping tiles,
blended afterwards. The plan (`planning.py`) picks chunk, tiles and cache placement from `Settings`,
computed once, or given by the caller; out-of-memory and fp16 overflow are recovered from
(`recovery.py`). `opts` (`kernels.Optimizations`) chooses the kernels for this run only.
"""
import dataclasses
import logging
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F

from ..kernels import KernelLog, Optimizations, activation_layout
from ..kernels.backend import same_device
from ..model.blocks import CausalConv3d, FrameConv2d
from ..model.video_vae import run_stages
from . import geometry, planning, recovery
from .causal_cache import CausalCache
from .clip_statistics import GatheredStatistics, gather
from .inputs import check_pixels, checked_latent
from .planning import Plan, Settings
from .progress import CancelFn, ProgressFn, Steps
from .strategies import WHOLE_FRAME, Bands, Partition
from .strategies.exact_tiles import ExactTiles
from .strategies.fast_tiles import decode_fast, encode_fast
from .strategies.frame_stream import FrameStream
from .run_context import RunContext

SinkFn = Callable[[int, torch.Tensor], None]  # (first frame index, frames B,C,k,H,W)
log = logging.getLogger("streamvae")


def _conv_count(modules) -> int:
    return sum(isinstance(m, (CausalConv3d, FrameConv2d)) for root in modules for m in root.modules())


def _as_video(x: torch.Tensor, what: str) -> tuple[torch.Tensor, bool]:
    image = x.dim() == 4
    if image:
        x = x.unsqueeze(2)
    if x.dim() != 5:
        raise ValueError(f"{what} must be 5-D B,C,T,H,W or 4-D B,C,H,W; got shape {tuple(x.shape)}")
    return x, image


def _planned(model, op: str, shape, how: Plan | Settings | None, io_devices, opts: Optimizations,
             bands: Bands | None) -> Plan:
    """The plan to run: the caller's (which must be for this op and input), or one made here from the
    caller's settings (default `Settings()`). `io_devices`: where the whole input and output live."""
    if isinstance(how, Plan):
        if how.op != op or tuple(how.input_shape[1:]) != tuple(shape[1:]):
            raise ValueError(f"the plan is for {how.op} of {tuple(how.input_shape)}, not {op} of {tuple(shape)}")
        plan = how
    elif how is not None and not isinstance(how, Settings):
        raise TypeError(f"{op} takes a vae.Plan or vae.Settings as its third argument, got {type(how).__name__}")
    elif bands is not None:
        plan = bands.agreed_plan(model, op, shape, how or Settings(), opts)
    else:
        io_on_device = tuple(same_device(d, model.device) for d in io_devices)
        plan = planning.plan(model, op, tuple(shape), how, io_on_device=io_on_device, opts=opts)
    if bands is None and isinstance(how, Settings):
        planning.refuse_over_budget(plan, how)  # a budget the caller gave: refused before any work
    if plan.fits is False and bands is not None:
        return plan  # a band cannot be tiled yet: `Bands.agreed_plan` said so, and it runs a chunk at a time
    if plan.fits is False:  # "auto": what is free now; the prediction may be high, so it is tried
        log.warning("StreamVAE %s: even %s is predicted above the free memory (%.2f GiB); trying it anyway (an "
                    "out-of-memory error shrinks it to its floor, then stops with what it tried): to fit, free "
                    "memory or %s fewer pixels per frame", op, plan.describe(), plan.budget_bytes / 2**30, op)
    elif plan.cache_offload != "none":
        log.info("StreamVAE %s: %s", op, plan.describe())
    return plan


def _begin(model, op: str, shape, latent_rows: int, how: Plan | Settings | None, io_devices, opts: Optimizations,
           bands: Bands | None) -> tuple[Plan, Partition]:
    """The plan of an encode or decode of an input of `shape` (`_planned`) and this process's partition
    of a frame of `latent_rows` latent rows (the whole frame, or its band: then every rank must agree
    on the shapes and the plan)."""
    partition = bands.start(latent_rows) if bands is not None else WHOLE_FRAME
    plan = _planned(model, op, shape, how, io_devices, opts, bands)
    if bands is not None:
        bands.agree((*shape, plan.temporal_chunk, int(bands.gather)), model.device,
                    "video shapes or settings" if op == "encode" else "latent shapes or settings")
    return plan, partition


def _run(model, plan: Plan, partition: Partition, grid, progress: ProgressFn | None, cancel: CancelFn | None, *,
         clip: Callable[[Steps], None], fast_tiles: Callable[[Steps], None]) -> None:
    """The one driver of an encode or decode: the model's weights in the plan's activation layout
    first (`activation_layout.weights_in`, the one change a run may make to the model, a no-op once
    they are), then without autograd, started again where `recovery.attempts` says a failure restarts
    the run: `clip(steps)` runs the clip through the model (frames and rows as the plan and partition
    say), or, for a fast-tiled plan (`grid` not None), `fast_tiles(steps)` runs the tiles as
    independent runs and blends them; `steps` counts progress and checks `cancel`."""
    activation_layout.weights_in(model, plan.activation_layout)
    _place_streamed_weights(model, plan)
    for attempt in recovery.attempts(model, plan.op):
        with attempt, torch.inference_mode():
            if grid is None:
                modules = model.decode_modules() if plan.op == "decode" else model.encode_modules()
                clip(_steps(plan, progress, cancel, partition, modules))
            else:
                fast_tiles(Steps(plan.grid[2] * len(grid[0]) * len(grid[1]), progress, cancel))


def _place_streamed_weights(model, plan: Plan) -> None:
    """The op's `streamed_modules` in host memory (pinned, from a GPU) where the plan streams their weights
    (`Plan.own_tiles`), else on the compute device: where they stay until a plan says otherwise. (On the meta
    device, where the memory model counts a run, they stay: weights are counted apart.)"""
    device = model.device
    modules = model.streamed_modules(plan.op)
    if not modules or device.type == "meta":
        return
    streamed = plan.own_tiles is not None and plan.own_tiles.weights_streamed
    for param in (p for module in modules for p in module.parameters()):
        if not streamed:
            param.data = param.data.to(device)
        elif device.type == "cpu":
            param.data = param.data.cpu()
        elif param.device.type != "cpu" or not param.is_pinned():
            param.data = param.data.cpu().pin_memory()


def _tile_plan(model, plan: Plan, input_shape) -> Plan:
    """The plan of one independent run of a fast-tiled run: one tile, untiled, as the run's chunk."""
    clip = planning.clip_of(model, plan.op, input_shape)
    return dataclasses.replace(plan, input_shape=tuple(input_shape), clip=clip, tile_size=None, tiling="exact",
                               grid=(1, 1, plan.grid[2]))


def _steps(plan: Plan, progress: ProgressFn | None, cancel: CancelFn | None, partition: Partition, modules) -> Steps:
    """Progress and cancellation of a run, cancellation agreed between the processes of a partition."""
    return Steps(plan.grid[2], progress, lambda: partition.cancelled(bool(cancel and cancel())), _conv_count(modules))


def _prepare(model, ctx: RunContext, plan: Plan, steps: Steps, partition: Partition, chunks_left: int) -> None:
    """Give the run fresh causal caches where `plan` puts them, its execution strategy (the
    partition's row bands, exact tiles when the plan's tile is smaller than the (padded) frame, or
    whole frames: None) and, when the plan streams frames, its frame-at-a-time schedule of the
    model's stages; recount the steps of the `chunks_left` chunks to go (for a model that runs its own
    tiles, one per batch of them, which it counts itself: `RunState.step`)."""
    _fresh_caches(model, ctx, plan)
    frame, tile = (plan.clip.height, plan.clip.width), plan.tile_size
    if plan.own_tiles is not None:  # the model's own tiles: a unit per batch of them (`RunState.step`)
        work = model.own_tile_work(plan.op, plan.input_shape)
        ctx.execution, ctx.step = None, steps
        ctx.own_tile_clip = partial(recovery.own_tile_clip, ctx, model.device)
        steps.replan(chunks_left, work.clips * -(-work.tiles // plan.own_tiles.batch))
        return
    if partition.execution is not None:
        ctx.execution = partition.execution
    elif tile is None or (tile[0] >= frame[0] and tile[1] >= frame[1]):
        ctx.execution = None
    else:
        ctx.execution = ExactTiles(frame, tile, steps, chain=plan.frames_streamed)
    steps.replan(chunks_left, steps.units_per_chunk(ctx.execution))


def _fresh_caches(model, ctx: RunContext, plan: Plan) -> None:
    """New causal caches (and attention keys and values) for a run of the clip from its frame 0, and when the plan
    streams frames, a new frame-at-a-time schedule of the model's stages (from the stage whose inputs a
    gathering run kept: `clip_statistics`)."""
    ctx.cache.close()
    ctx.cache = CausalCache(plan.cache_offload, model.device, fallback=plan.offload_fallback,
                            attention_frames=plan.clip.latent_frames)
    stages = model.decode_stages() if plan.op == "decode" else model.encode_stages()
    statistics = ctx.clip_statistics
    start = statistics.first_stage if statistics is not None else 0
    ctx.frame_stream = FrameStream(stages[start:], first_stage=start, statistics=statistics) \
        if plan.frames_streamed else None


def _run_chunks(model, ctx: RunContext, steps: Steps, plan: Plan, partition: Partition, step) -> None:
    """step(first, count, write) for consecutive chunks of `plan.temporal_chunk` latent frames
    (`ctx.chunks`, which says which chunk holds the clip's first frame and which its last) until the
    clip is done or step returns False, after the passes that gather whole-clip statistics where the
    clip runs in several chunks (`clip_statistics.gather`) and the model's prefill (`_prefill`); the causal
    caches are closed at the end.

    Out of memory inside a step (`recovery.Restart.CHUNK`, where the partition allows it) goes on with
    the next smaller plan (`recovery.smaller_plan`, up to its floor, where it raises): the causal
    caches are rebuilt by running latent frames [0, done) again without writing them (their output is
    already written and stays), then the failed chunk runs again. No copy of the caches is kept for
    this: it would double their memory, the largest part of a chunk's peak. Every chunk after the first
    has the same size, so an out-of-memory error nearly always comes in the second chunk, and the
    rebuild is the first chunk's single latent frame. Whole-clip statistics gathered stay (they do not
    depend on the chunks)."""
    n_lat, done = plan.clip.latent_frames, 0
    statistics = GatheredStatistics.for_run(model, plan.op, plan.kept_stage_bytes)
    try:
        while True:
            ctx.clip_statistics = statistics if plan.grid[2] > 1 else None
            passes = ctx.clip_statistics.passes_left if ctx.clip_statistics is not None else 0
            chunks_left = -(-(n_lat - done) // plan.temporal_chunk)
            _prepare(model, ctx, plan, steps, partition, chunks_left + passes * plan.grid[2])
            try:
                gather(ctx, plan.clip.latent_frames, plan.temporal_chunk, step, steps,
                       prefill=lambda run: _prefill(model, ctx, plan, run),
                       fresh_caches=lambda: _fresh_caches(model, ctx, plan))
                with steps.muted():  # cancellable, but no progress to report
                    _prefill(model, ctx, plan, step)
                    for first, n in ctx.chunks(n_lat, plan.temporal_chunk, stop=done):
                        step(first, n, False)
                for first, n in ctx.chunks(n_lat, plan.temporal_chunk, start=done):
                    more = step(first, n, True)
                    done = first + n
                    steps.chunk_done()
                    if more is False:
                        break
                return
            except Exception as error:
                if not partition.recoverable or recovery.restart_point(error) is not recovery.Restart.CHUNK:
                    raise
                reason = str(error) or type(error).__name__  # keep no reference to the failed chunk's tensors
            ctx.cache.close()
            if statistics is not None:
                statistics.restart()
            recovery.free_cached_memory(model.device)
            plan = recovery.smaller_plan(model, plan, reason)
    finally:
        ctx.cache.close()  # the disk file of offloaded caches goes with it
        ctx.clip_statistics = None


def _prefill(model, ctx: RunContext, plan: Plan, step) -> None:
    """Run the model's `prefill_stages` (those that must see every frame before the clip runs: a full
    attention gathering its keys) over the whole clip, chunk by chunk as the plan runs it, with
    `ctx.prefill` set and nothing written; then the causal state starts again at frame 0 (what the
    prefill gathered, in `ctx.cache.keys_values`, stays)."""
    stages = model.prefill_stages(plan.op)
    if not stages or (ctx.clip_statistics is not None and ctx.clip_statistics.first_stage):
        return  # (a clip that starts past the prefill's stages, from inputs kept there, needs none)
    clip_stream = ctx.frame_stream
    ctx.prefill, ctx.frame_stream = True, FrameStream(stages) if clip_stream is not None else None
    try:
        for first, n in ctx.chunks(plan.clip.latent_frames, plan.temporal_chunk):
            step(first, n, False)
    finally:
        ctx.prefill, ctx.frame_stream = False, clip_stream
    ctx.cache.clear()


def _run_chunk(model, x: torch.Tensor, ctx: RunContext, plan: Plan, emit, first: int) -> None:
    """One chunk x through the model's stages: `emit(y)` gets the output (pixel frames, or the
    encoder's moments B,2*latent,t,h,w), the whole chunk's at once, or a frame or less at a time when
    the stream runs frame by frame (`ctx.frame_stream`). Where the convs look ahead in time, they give
    the frames they held back with the clip's last chunk, each layer more than the one before: that
    chunk is passed on a chunk's pixel frames at a time, so no layer holds more than a chunk's. In a
    prefill pass (`_prefill`) only the model's `prefill_stages` run, and nothing is emitted. Where the run
    gathers whole-clip statistics, the chunk (latent frames from `first`) starts at the stage whose inputs
    the passes kept, and keeps the inputs the pass asks for (`clip_statistics.GatheredStatistics`). A model
    that runs its own tiles (`ctx.own_tiles`) gives its output clip by clip, each emitted as it comes."""
    stages = model.decode_stages() if plan.op == "decode" else model.encode_stages()
    if ctx.frame_stream is not None and ctx.clip_statistics is not None and not ctx.prefill:
        ctx.clip_statistics.stream(ctx.frame_stream, x, ctx, emit, first)
    elif ctx.frame_stream is not None:  # in a prefill pass, the stream of the prefill stages
        ctx.frame_stream.run(x, ctx, (lambda y: None) if ctx.prefill else emit)
    elif ctx.prefill:
        run_stages(model.prefill_stages(plan.op), x, ctx)
    elif ctx.last_chunk and model.looks_ahead(plan.op):
        FrameStream(stages, piece=plan.temporal_chunk * model.temporal_factor, started=not ctx.first_chunk).run(x, ctx, emit)
    elif ctx.clip_statistics is not None:  # from the stage inputs kept, keeping more (`clip_statistics`)
        emit(ctx.clip_statistics.run(stages, x, ctx, first))
    elif ctx.own_tiles is not None:  # the model's own clips, each once final
        for y in model.own_tile_pieces(plan.op, x, ctx):
            emit(y)
            del y  # handed on: not held while the model makes the next clip
    else:
        for stage in stages:  # `run_stages`, written out: one Python frame less under every layer
            x = stage(x, ctx)
        emit(x)


def encode(model, video: torch.Tensor, how: Plan | Settings | None = None, *, opts: Optimizations | None = None,
           return_logvar: bool = False, out_device: torch.device | str | None = None, bands: Bands | None = None,
           progress: ProgressFn | None = None, cancel: CancelFn | None = None, kernel_log: KernelLog | None = None):
    """Encode pixels B,3,T,H,W (or B,3,H,W) in [-1, 1] to the raw posterior mean B,C,T',h,w. NaN/Inf
    pixels and values outside [-1, 1] (beyond rounding) are a ValueError naming the frames or the range.

    `video` may also be a frame source read chunk by chunk (`video_reader.VideoReader`): `shape`,
    `dtype`, `device` and `index_select(2, ascending frame indices)` as a tensor has them.

    Any T >= 1 is accepted: T is padded to the next 4n+1 (or as the network's own frame rule,
    `VideoVAE.frames_made`, says) by repeating the last frame and H, W to multiples of the spatial
    factor by edge replication, one chunk at a time (the padded clip is never materialised);
    `decode(model, z, num_frames=T, height=H, width=W)` undoes both.
    How it runs is `how`: a `Plan` (from `vae.plan`), or the `Settings` the engine plans from itself
    (default `Settings()`); every setting gives the same result. `opts` chooses the kernels (default:
    all optimizations on). With `return_logvar` the result is (mean, logvar). `bands`
    (`distributed.RowBands`): this process is one rank of a group that encodes the clip together, each
    reading only its rows; rank 0 returns the result (or each rank its band: `RowBands(gather=False)`),
    the others None. `kernel_log` (`kernels.KernelLog`) counts the kernels every conv and norm
    ran, for a run report.
    """
    video, image = _as_video(video, "encode input") if isinstance(video, torch.Tensor) else (video, False)
    check_pixels(model, video)
    b, c, t, h, w = video.shape
    opts = opts or Optimizations()
    sf = model.spatial_factor
    out_device = video.device if out_device is None else torch.device(out_device)
    plan, partition = _begin(model, "encode", video.shape, -(-h // sf), how, (video.device, out_device), opts, bands)
    latent_h, latent_w = plan.clip.latent_hw
    n_moments = 2 if return_logvar else 1
    shape = (b, model.latent_channels, plan.clip.latent_frames, partition.output_rows(latent_h, 1), latent_w)
    out_dtype = video.dtype if video.dtype.is_floating_point else torch.float32
    outputs = [torch.empty(shape, dtype=out_dtype, device=out_device) for _ in range(n_moments)] \
        if partition.delivers() else []
    grid = None
    if plan.tile_size and plan.tiling == "fast":
        grid = geometry.fast_grid(latent_h, latent_w, plan.tile_size, plan.tile_overlap, sf)
    if grid is not None and not isinstance(video, torch.Tensor):  # each tile would read the whole clip
        raise ValueError("fast tiling cannot stream from a frame source; use tiling='exact'")

    def encode_tile(pixels, steps):
        tile_plan = _tile_plan(model, plan, pixels.shape)
        tile_h, tile_w = tile_plan.clip.latent_hw
        parts = [torch.empty(shape[:3] + (tile_h, tile_w), dtype=out_dtype, device=out_device) for _ in outputs]
        _encode_clip(model, pixels, parts, n_moments, tile_plan, opts, steps.for_tile(tile_plan.grid[2]),
                     WHOLE_FRAME, kernel_log)
        return parts

    _run(model, plan, partition, grid, progress, cancel,
         clip=partial(_encode_clip, model, video, outputs, n_moments, plan, opts, partition=partition,
                      kernel_log=kernel_log),
         fast_tiles=lambda steps: encode_fast(video, outputs, grid, sf, lambda pixels: encode_tile(pixels, steps), steps.check))
    if not outputs:
        return None
    if image:
        outputs = [o.squeeze(2) for o in outputs]
    return tuple(outputs) if return_logvar else outputs[0]


def _encode_clip(model, video, outputs: list[torch.Tensor], n_moments: int, plan: Plan, opts, steps: Steps,
                 partition: Partition, kernel_log: KernelLog | None) -> None:
    """Temporal chunks of `video` (B,3,T,H,W, or a frame source) through the encoder into the
    preallocated `outputs` (mean, then logvar; none on a process that delivers nothing), reading
    the rows of the partition, padded as `encode` says."""
    t, h, w = video.shape[2:]
    clip = plan.clip
    rows = partition.rows(clip.spatial_factor) or (0, clip.height)  # padded video rows this process encodes
    real = (rows[0], min(rows[1], h))  # the part of them the input has (a band starts inside the frame)
    ctx = RunContext(opts, kernel_log=kernel_log, frames_are_images=model.frames_are_images, own_tiles=plan.own_tiles,
                     clip_latent_frames=plan.clip.latent_frames)
    run_layout = plan.activation_layout

    def step(first, n, write):
        start, stop = geometry.pixel_span(first, n, clip.temporal_factor)
        if first + n == clip.latent_frames and model.frames_kept(t) == t:
            stop = t  # a network that reads any count (`VideoVAE.frames_kept`) gets the clip's frames as they are
        # Frames past the end repeat the last real frame (T -> next 4n+1).
        index = torch.arange(start, stop).clamp_(max=t - 1).to(video.device)
        if isinstance(video, torch.Tensor):
            x = video[..., real[0]:real[1], :].index_select(2, index)
        else:  # a frame source reads whole frames
            x = video.index_select(2, index)[..., real[0]:real[1], :]
        x = x.to(device=model.device, dtype=model.encode_dtype)
        pad_rows, pad_cols = rows[1] - real[1], clip.width - w
        if pad_rows or pad_cols:  # edge replication, B,3,t,rows,W -> B,3,t,rows+pad_rows,W+pad_cols
            x = F.pad(x, (0, pad_cols, 0, pad_rows, 0, 0), mode="replicate")
        x = activation_layout.to_layout(x, run_layout)
        at = [first]  # the latent frame the next moments go to

        def emit(h):
            moments = model.moments(h)
            recovery.check_half(moments[0], "encode")
            if not write:
                return
            for i, part in enumerate(moments[:n_moments]):
                collected = partition.collect(part, 1)
                if collected is not None:
                    outputs[i][:, :, at[0]:at[0] + collected.shape[2]] = collected
            at[0] += h.shape[2]

        _run_chunk(model, x, ctx, plan, emit, first)

    _run_chunks(model, ctx, steps, plan, partition, step)


def decode(model, z: torch.Tensor, how: Plan | Settings | None = None, *, opts: Optimizations | None = None,
           num_frames: int | None = None, height: int | None = None, width: int | None = None,
           nonfinite: str = "error", out: torch.Tensor | None = None, out_device: torch.device | str | None = None,
           out_dtype: torch.dtype | None = None, sink: SinkFn | None = None, bands: Bands | None = None,
           progress: ProgressFn | None = None, cancel: CancelFn | None = None,
           kernel_log: KernelLog | None = None) -> torch.Tensor | None:
    """Decode a raw latent B,C,T',h,w (or B,C,h,w) to pixels B,3,T,H,W (or B,3,H,W), not clamped
    (`model.out_channels` channels, 4 for RGBA; H = h * spatial_factor * `model.decode_upscale`).

    `how` and `opts` as in `encode` (tiles in output pixels). `num_frames`, `height`, `width` trim
    the output (to undo `encode`'s padding); the decoded chunks are written straight into a
    preallocated buffer (`out`, or a new one on `out_device`), or, with `sink`, handed over as they are
    decoded: `sink(first, frames)` gets frames B,3,k,H,W (on the compute device, not clamped, to be
    copied before it returns) starting at frame `first`, and decode returns None. A rerun (fp16
    overflow) starts again at frame 0; only exact tiling streams.
    A latent with NaN/Inf values is an error naming its frames, unless `nonfinite="zero"`: the bad
    values are then replaced by 0 (with a warning) and the clip is decoded. `bands` as in `encode`:
    each rank decodes its rows, rank 0 receives whole frames (or each rank its band of output rows,
    cut at `height`), the others return None. `kernel_log` as in `encode`.
    """
    z, image = _as_video(z, "decode input")
    z = checked_latent(model, z, nonfinite)
    b, c, n_lat, h, w = z.shape
    opts = opts or Optimizations()
    sf, of = model.spatial_factor, model.spatial_factor * model.decode_upscale  # of: output pixels per latent cell
    where_out = out.device if out is not None else (z.device if out_device is None else out_device)
    plan, partition = _begin(model, "decode", z.shape, h, how, (z.device, where_out), opts, bands)
    full_t, full_h, full_w = plan.clip.frames, h * of, w * of
    t_out = full_t if num_frames is None else num_frames
    h_out = full_h if height is None else height
    w_out = full_w if width is None else width
    for name, value, limit in (("num_frames", t_out, full_t), ("height", h_out, full_h), ("width", w_out, full_w)):
        if not 1 <= value <= limit:
            raise ValueError(f"{name}={value} is outside 1..{limit}, the size this latent decodes to")
    shape = (b, model.out_channels, t_out, partition.output_rows(h_out, of), w_out)
    grid = None
    if plan.tile_size and plan.tiling == "fast":
        grid = geometry.fast_grid(h, w, plan.tile_size, plan.tile_overlap, sf)
    if sink is not None and (out is not None or grid is not None):  # fast: each tile spans the clip
        raise ValueError("decode takes out or sink, not both, and streams to a sink with tiling='exact' only")
    if out is None and sink is None and partition.delivers():
        dtype = out_dtype or (z.dtype if z.dtype.is_floating_point else torch.float32)
        out = torch.empty(shape, dtype=dtype, device=z.device if out_device is None else out_device)
    elif out is not None and tuple(out.shape) != shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {shape}")
    deliver = sink or (lambda first, frames: _write_into(out, first, frames))

    def decode_tile(zt, steps):
        tile_plan = _tile_plan(model, plan, zt.shape)
        tile_out = torch.empty((b, model.out_channels, t_out, zt.shape[3] * of, zt.shape[4] * of), dtype=out.dtype,
                               device=out.device)
        _decode_clip(model, zt, tile_out.shape[2:], lambda first, frames: _write_into(tile_out, first, frames),
                     tile_plan, opts, steps.for_tile(tile_plan.grid[2]), WHOLE_FRAME, kernel_log)
        return tile_out

    _run(model, plan, partition, grid, progress, cancel,
         clip=partial(_decode_clip, model, z, shape[2:], deliver, plan, opts, partition=partition,
                      kernel_log=kernel_log),
         fast_tiles=lambda steps: decode_fast(model, z, out, grid, lambda zt: decode_tile(zt, steps), steps.check))
    if out is None or sink is not None:
        return None
    return out.squeeze(2) if image else out


def _write_into(out: torch.Tensor, first: int, frames: torch.Tensor) -> None:
    out[:, :, first:first + frames.shape[2]] = frames


def _decode_clip(model, z, size_thw, deliver: SinkFn, plan: Plan, opts, steps: Steps, partition: Partition,
                 kernel_log: KernelLog | None) -> None:
    """Temporal chunks of `z` (B,C,T',h,w: the partition's rows of it) through the decoder, cropped to
    `size_thw` (frames, height, width: rows of the partition's output) and handed to
    `deliver(first, frames)` where the partition delivers."""
    t_out, h_out, w_out = size_thw
    rows = partition.rows(1)
    part = z if rows is None else z[..., rows[0]:rows[1], :]  # B,C,T',band rows,w
    ctx = RunContext(opts, kernel_log=kernel_log, frames_are_images=model.frames_are_images, own_tiles=plan.own_tiles,
                     clip_latent_frames=plan.clip.latent_frames)
    run_layout = plan.activation_layout
    pos = 0

    scale = model.spatial_factor * model.decode_upscale  # output rows per latent row

    def emit(y, write):
        nonlocal pos
        recovery.check_half(y, "decode")
        if not write:
            return
        k = max(0, min(y.shape[2], t_out - pos))
        frames = partition.collect(y[:, :, :k, :, :w_out], scale)  # every rank takes part
        if frames is not None and k:
            deliver(pos, frames[..., :h_out, :])
        pos += k

    def step(first, n, write):
        x = part[:, :, first:first + n].to(device=model.device, dtype=model.decode_dtype)
        x = activation_layout.to_layout(x, run_layout)
        _run_chunk(model, x, ctx, plan, lambda y: emit(y, write), first)
        return pos < t_out

    _run_chunks(model, ctx, steps, plan, partition, step)
