"""The engine: runs a whole clip through a `VideoVAE` in temporal chunks and spatial tiles, as a
`planning.Plan` says.

    z = vae.encode(model, video)   # B,3,T,H,W in [-1, 1] -> raw posterior mean B,C,T',H/f,W/f
    y = vae.decode(model, z)       # raw latent -> B,3,T'',H'',W'' (not clamped)

The model says what the network does to one temporal chunk (`encode_chunk`/`decode_chunk`); the
engine does the rest. The causal caches in the `StreamContext` make every chunking produce the
whole-clip result (frames: `geometry.py`); chunks are written into a preallocated output
(optionally on another device) or handed to a `sink` (a video file writer), and encode reads its
input chunk by chunk (also from a video file), so memory does not grow with clip length beyond the
output itself. Spatial tiling (`tiling.py`) composes with the chunking; the plan (`planning.py`) picks
chunk, tiles and cache placement, computed once, or given by the caller; out-of-memory and fp16
overflow are recovered from (`recovery.py`). `opts` (`optimizations.Optimizations`) chooses the
kernels for this run only.
"""
import dataclasses
import logging
import warnings
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F

from . import geometry, recovery
from . import planning
from .blocks import CausalConv3d, FrameConv2d, StreamContext
from .causal_cache import CausalCache
from .devices import is_oom, same_device
from .optimizations import Optimizations
from .progress import CancelFn, ProgressFn, Steps
from .tiling import ExactTiling, decode_fast, encode_fast

SinkFn = Callable[[int, torch.Tensor], None]  # (first frame index, frames B,3,k,H,W)
NONFINITE_MODES = ("error", "zero")
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


def _planned(model, op: str, shape, plan: planning.Plan | None, settings: dict, io_devices,
             opts: Optimizations) -> planning.Plan:
    """The plan to run: the caller's (which must be for this op and input), or one made here from
    `settings` (the planning keyword arguments of `encode`/`decode`). `io_devices`: where the whole
    input and output live."""
    if plan is None:
        io_on_device = tuple(same_device(d, model.device) for d in io_devices)
        plan = planning.plan(model, op, tuple(shape), io_on_device=io_on_device, opts=opts, **settings)
    else:
        if any(value != _SETTING_DEFAULTS[name] for name, value in settings.items()):
            raise ValueError(f"{op}: pass either plan= or the settings it is made from "
                             f"({', '.join(sorted(_SETTING_DEFAULTS))}), not both")
        if plan.op != op or tuple(plan.input_shape[1:]) != tuple(shape[1:]):
            raise ValueError(f"the plan is for {plan.op} of {tuple(plan.input_shape)}, not {op} of {tuple(shape)}")
    if plan.fits is False:
        log.warning("StreamVAE %s: even %s exceeds the memory budget of %.2f GiB; trying it anyway (an "
                    "out-of-memory error shrinks it further). Exact tiles keep whole frames between layers: to "
                    "fit, free memory, decode a smaller size, or use tiling='fast'", op, plan.describe(),
                    plan.budget_bytes / 2**30)
    elif plan.cache_offload != "none":
        log.info("StreamVAE %s: %s", op, plan.describe())
    return plan


_SETTING_DEFAULTS = {"temporal_chunk": None, "tile_size": None, "tile_overlap": 0, "tiling": "exact",
                     "memory_budget": None, "cache_offload": "auto"}


def _stream_plan(plan: planning.Plan, input_shape) -> planning.Plan:
    """The plan of one independent stream of a fast-tiled run: one tile, untiled, as the run's chunk."""
    return dataclasses.replace(plan, input_shape=tuple(input_shape), tile_size=None, tiling="exact",
                               grid=(1, 1, plan.grid[2]))


def _context(model, plan: planning.Plan, opts: Optimizations, steps: Steps, reference_hw, count: bool) -> StreamContext:
    """A stream's context as `plan` says: its causal caches and exact tiling; counts its steps."""
    ctx = StreamContext(opts)
    _apply(model, ctx, plan, steps, reference_hw, count)
    if count:
        steps.replan(steps.chunks, steps.units_per_chunk(ctx.tiling))
    return ctx


def _apply(model, ctx: StreamContext, plan: planning.Plan, steps: Steps, reference_hw, count: bool) -> None:
    """Give the stream fresh causal caches where `plan` puts them and its exact tiling (None when one
    tile covers the `reference_hw` frame). `count=False`: the stream is one tile of fast mode, counted
    by its caller; its sub-tiles (after an out-of-memory retry) only check for cancellation."""
    ctx.cache = CausalCache(plan.cache_offload, model.device, fallback=plan.offload_fallback)
    size = plan.tile_size
    if size is None or (size[0] >= reference_hw[0] and size[1] >= reference_hw[1]):
        ctx.tiling = None
    else:
        ctx.tiling = ExactTiling(reference_hw, size, steps if count else steps.check)


def _stream(model, ctx: StreamContext, steps: Steps, plan: planning.Plan, n_lat: int, reference_hw, step,
            count: bool) -> None:
    """step(first, count, write) for consecutive runs of latent frames until done or step returns False.

    Out of memory inside a step makes a smaller plan (`recovery.smaller_plan`) and retries. No copy of
    the causal caches is kept for that: it would double their memory, the largest part of a chunk's
    peak. Instead the caches are rebuilt by running the finished latent frames again with the new
    plan (`write=False`: their output is already written and stays). Every chunk after the first
    has the same size, so an out-of-memory error nearly always comes in the second chunk and the
    rebuild is the first chunk's single latent frame. The caches are closed at the end."""
    try:
        lo, done = 0, 0  # caches hold frames [0, lo); output is written for [0, done)
        while lo < n_lat:
            replay = lo < done
            n = min(plan.temporal_chunk, (done if replay else n_lat) - lo)
            tiling, tile_step = ctx.tiling, None
            if replay and tiling is not None:  # rebuilding: cancellable, but no progress to report
                tile_step, tiling.step = tiling.step, steps.check
            try:
                more = step(lo, n, not replay)
            except (RuntimeError, MemoryError) as error:
                if not is_oom(error):
                    raise
                reason = str(error) or type(error).__name__  # keep no reference to the failed chunk's tensors
            else:
                ctx.first_chunk = False
                lo += n
                if replay:
                    steps.check()
                else:
                    done = lo
                    steps.chunk_done() if count else steps()
                    if more is False:
                        return
                continue
            finally:
                if tile_step is not None:
                    tiling.step = tile_step
            ctx.cache.close()
            ctx.first_chunk, lo = True, 0
            recovery.free_cached_memory(model.device)
            plan = recovery.smaller_plan(model, plan, reason)
            _apply(model, ctx, plan, steps, reference_hw, count)
            if count:
                steps.replan(-(-(n_lat - done) // plan.temporal_chunk), steps.units_per_chunk(ctx.tiling))
    finally:
        ctx.cache.close()  # the disk file of offloaded caches goes with it


def _with_half_fallback(model, op: str, run):
    """run(), rerun in bf16/fp32 if fp16 compute overflowed (see recovery.fall_back_from_half)."""
    try:
        return run()
    except recovery.HalfOverflow:
        recovery.fall_back_from_half(model, op)
        return run()


def _overflowed(y: torch.Tensor) -> bool:
    return y.dtype == torch.float16 and not bool(torch.isfinite(y).all())


def encode(
    model,
    video: torch.Tensor,
    temporal_chunk: int | None = None,
    *,
    tile_size=None,
    tile_overlap=0,
    tiling: str = "exact",
    memory_budget=None,
    cache_offload: str = "auto",
    plan: planning.Plan | None = None,
    opts: Optimizations | None = None,
    return_logvar: bool = False,
    out_device: torch.device | str | None = None,
    progress: ProgressFn | None = None,
    cancel: CancelFn | None = None,
):
    """Encode pixels B,3,T,H,W (or B,3,H,W) in [-1, 1] to the raw posterior mean B,C,T',h,w.

    `video` may also be a frame source read chunk by chunk (`video_reader.VideoReader`): `shape`,
    `dtype`, `device` and `index_select(2, ascending frame indices)` as a tensor has them.

    Any T >= 1 is accepted: T is padded to the next 4n+1 by repeating the last frame and H, W to
    multiples of the spatial factor by edge replication, one chunk at a time (the padded clip is never
    materialised); `decode(model, z, num_frames=T, height=H, width=W)` undoes both.
    How it runs is a `planning.Plan`: pass one (`plan=`), or the settings `planning.plan` makes it from:
    `temporal_chunk` latent frames per step; `tile_size` and `tile_overlap` (pixels) tile the frame,
    `tiling` "exact" (equals untiled) or "fast" (independent blended tiles); `memory_budget` (bytes or
    "auto") picks the largest chunk and tile that fit, the given ones acting as upper limits;
    `cache_offload` says where the causal caches wait between chunks: "none" (compute device),
    "host" (pinned CPU memory, for GPUs), "disk", or "auto" (offloaded when a memory budget or an
    out-of-memory retry needs it). Every setting gives the same result. `opts` chooses the kernels
    (default: all optimizations on). With `return_logvar` the result is (mean, logvar).
    """
    video, image = _as_video(video, "encode input") if isinstance(video, torch.Tensor) else (video, False)
    b, c, t, h, w = video.shape
    if c != model.in_channels:
        raise ValueError(f"encode expects {model.in_channels} colour channels on dim 1, got {c} (shape {tuple(video.shape)})")
    if t < 1 or h < 1 or w < 1:
        raise ValueError(f"encode got an empty video of shape {tuple(video.shape)}")
    opts = opts or Optimizations()
    out_device = video.device if out_device is None else torch.device(out_device)
    settings = dict(temporal_chunk=temporal_chunk, tile_size=tile_size, tile_overlap=tile_overlap, tiling=tiling,
                    memory_budget=memory_budget, cache_offload=cache_offload)
    plan = _planned(model, "encode", video.shape, plan, settings, (video.device, out_device), opts)
    sf = model.spatial_factor
    n_lat = geometry.latent_frames(t, model.temporal_factor)
    out_dtype = video.dtype if video.dtype.is_floating_point else torch.float32
    shape = (b, model.latent_channels, n_lat, -(-h // sf), -(-w // sf))
    mean = torch.empty(shape, dtype=out_dtype, device=out_device)
    logvar = torch.empty(shape, dtype=out_dtype, device=out_device) if return_logvar else None
    grid = None
    if plan.tile_size and plan.tiling == "fast":
        grid = geometry.fast_grid(shape[3], shape[4], plan.tile_size, plan.tile_overlap, sf)
    if grid is not None and not isinstance(video, torch.Tensor):  # each tile would read the whole clip
        raise ValueError("fast tiling cannot stream from a frame source; use tiling='exact'")

    def run():
        if grid is None:
            steps = Steps(plan.grid[2], progress, cancel, _conv_count(model.encode_modules()))
            _encode_stream(model, video, mean, logvar, plan, opts, steps)
            return
        steps = Steps(plan.grid[2] * len(grid[0]) * len(grid[1]), progress, cancel)

        def encode_tile(pixels):
            tile_shape = (b, model.latent_channels, n_lat, -(-pixels.shape[3] // sf), -(-pixels.shape[4] // sf))
            m = torch.empty(tile_shape, dtype=out_dtype, device=out_device)
            lv = torch.empty_like(m) if logvar is not None else None
            _encode_stream(model, pixels, m, lv, _stream_plan(plan, pixels.shape), opts, steps, count=False)
            return (m, lv) if lv is not None else (m,)

        encode_fast(video, mean, logvar, grid, sf, encode_tile, steps.check)

    with torch.inference_mode():
        _with_half_fallback(model, "encode", run)
    if image:
        mean = mean.squeeze(2)
        logvar = logvar.squeeze(2) if logvar is not None else None
    return (mean, logvar) if return_logvar else mean


def _encode_stream(model, video, mean, logvar, plan: planning.Plan, opts, steps: Steps, count: bool = True) -> None:
    """Temporal chunks of `video` through the encoder into the preallocated `mean` (and `logvar`),
    exactly tiled when the plan's tile is smaller than the (padded) frame."""
    t, h, w = video.shape[2:]
    sf, tf = model.spatial_factor, model.temporal_factor
    hp, wp = mean.shape[3] * sf, mean.shape[4] * sf
    device, dtype = model.device, model.encode_dtype
    ctx = _context(model, plan, opts, steps, (hp, wp), count)

    def step(first, n, write):
        start, stop = geometry.pixel_span(first, n, tf)
        # Frames past the end repeat the last real frame (T -> next 4n+1).
        index = torch.arange(start, stop).clamp_(max=t - 1).to(video.device)
        x = video.index_select(2, index).to(device=device, dtype=dtype)
        if hp != h or wp != w:
            x = F.pad(x, (0, wp - w, 0, hp - h, 0, 0), mode="replicate")
        m, lv = model.encode_chunk(x, ctx)
        if _overflowed(m):
            raise recovery.HalfOverflow("fp16 encode produced Inf/NaN")
        if not write:
            return
        mean[:, :, first:first + m.shape[2]] = m
        if logvar is not None:
            logvar[:, :, first:first + lv.shape[2]] = lv

    _stream(model, ctx, steps, plan, mean.shape[2], (hp, wp), step, count)


def _nonfinite_frames(z: torch.Tensor) -> list[int]:
    """Latent frames with NaN/Inf, checked a frame at a time: a whole-latent mask would grow with the clip."""
    if z.device.type == "meta":  # shape-only runs (FLOP counting) have no values to check
        return []
    finite = torch.stack([torch.isfinite(z[:, :, i]).all() for i in range(z.shape[2])])
    return torch.nonzero(~finite).flatten().tolist()


def decode(
    model,
    z: torch.Tensor,
    temporal_chunk: int | None = None,
    *,
    num_frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    tile_size=None,
    tile_overlap=0,
    tiling: str = "exact",
    memory_budget=None,
    cache_offload: str = "auto",
    plan: planning.Plan | None = None,
    opts: Optimizations | None = None,
    nonfinite: str = "error",
    out: torch.Tensor | None = None,
    out_device: torch.device | str | None = None,
    out_dtype: torch.dtype | None = None,
    sink: SinkFn | None = None,
    progress: ProgressFn | None = None,
    cancel: CancelFn | None = None,
) -> torch.Tensor | None:
    """Decode a raw latent B,C,T',h,w (or B,C,h,w) to pixels B,3,T,H,W (or B,3,H,W), not clamped
    (`model.out_channels` channels, 4 for RGBA; H = h * spatial_factor * `model.decode_upscale`).

    `num_frames`, `height`, `width` trim the output (to undo `encode`'s padding); the decoded chunks
    are written straight into a preallocated buffer (`out`, or a new one on `out_device`), or, with
    `sink`, handed over as they are decoded: `sink(first, frames)` gets frames B,3,k,H,W (on the
    compute device, not clamped, to be copied before it returns) starting at frame `first`, and
    decode returns None. A rerun (fp16 overflow) starts again at frame 0; only exact tiling streams.
    `plan` or the settings it is made from (`tile_size` / `tile_overlap` in output pixels), and
    `opts`, as in `encode`.
    A latent with NaN/Inf values is an error naming its frames, unless `nonfinite="zero"`: the bad
    values are then replaced by 0 (with a warning) and the clip is decoded.
    """
    z, image = _as_video(z, "decode input")
    b, c, n_lat, h, w = z.shape
    if c != model.latent_channels:
        raise ValueError(
            f"this {model.family} VAE expects {model.latent_channels}-channel latents, got {c} channels "
            f"(shape {tuple(z.shape)}); was the latent made by another VAE family?")
    if n_lat < 1 or h < 1 or w < 1:
        raise ValueError(f"decode got an empty latent of shape {tuple(z.shape)}")
    if nonfinite not in NONFINITE_MODES:
        raise ValueError(f"nonfinite must be one of {NONFINITE_MODES}, got {nonfinite!r}")
    bad = _nonfinite_frames(z)
    if bad and nonfinite == "error":
        raise ValueError(f"the latent has NaN/Inf values in latent frame(s) {bad} (of {n_lat}): the sampler that made it "
                         "diverged (often fp16 overflow; try bf16/fp32 sampling). To decode anyway with those values "
                         "set to 0, pass nonfinite='zero' (StreamVAE Decode: nonfinite = zero).")
    if bad:
        message = f"StreamVAE: latent frame(s) {bad} have NaN/Inf values; decoding with them set to 0"
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        z = torch.nan_to_num(z, nan=0.0, posinf=0.0, neginf=0.0)
    opts = opts or Optimizations()
    where_out = out.device if out is not None else (z.device if out_device is None else out_device)
    settings = dict(temporal_chunk=temporal_chunk, tile_size=tile_size, tile_overlap=tile_overlap, tiling=tiling,
                    memory_budget=memory_budget, cache_offload=cache_offload)
    plan = _planned(model, "decode", z.shape, plan, settings, (z.device, where_out), opts)
    sf, of = model.spatial_factor, model.spatial_factor * model.decode_upscale  # of: output pixels per latent cell
    full_t, full_h, full_w = geometry.pixel_frames(n_lat, model.temporal_factor), h * of, w * of
    t_out = full_t if num_frames is None else num_frames
    h_out = full_h if height is None else height
    w_out = full_w if width is None else width
    for name, value, limit in (("num_frames", t_out, full_t), ("height", h_out, full_h), ("width", w_out, full_w)):
        if not 1 <= value <= limit:
            raise ValueError(f"{name}={value} is outside 1..{limit}, the size this latent decodes to")
    shape = (b, model.out_channels, t_out, h_out, w_out)
    grid = None
    if plan.tile_size and plan.tiling == "fast":
        grid = geometry.fast_grid(h, w, plan.tile_size, plan.tile_overlap, sf)
    if sink is not None and (out is not None or grid is not None):  # fast: each tile spans the clip
        raise ValueError("decode takes out or sink, not both, and streams to a sink with tiling='exact' only")
    if out is None and sink is None:
        dtype = out_dtype or (z.dtype if z.dtype.is_floating_point else torch.float32)
        out = torch.empty(shape, dtype=dtype, device=z.device if out_device is None else out_device)
    elif out is not None and tuple(out.shape) != shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {shape}")

    def run():
        if grid is None:
            steps = Steps(plan.grid[2], progress, cancel, _conv_count(model.decode_modules()))
            _decode_stream(model, z, shape[2:], sink or partial(_write_into, out), plan, opts, steps)
            return
        steps = Steps(plan.grid[2] * len(grid[0]) * len(grid[1]), progress, cancel)

        def decode_tile(zt):
            tile_out = torch.empty((b, model.out_channels, t_out, zt.shape[3] * of, zt.shape[4] * of), dtype=out.dtype,
                                   device=out.device)
            _decode_stream(model, zt, tile_out.shape[2:], partial(_write_into, tile_out), _stream_plan(plan, zt.shape),
                           opts, steps, count=False)
            return tile_out

        decode_fast(model, z, out, grid, decode_tile, steps.check)

    with torch.inference_mode():
        _with_half_fallback(model, "decode", run)
    return None if sink is not None else out.squeeze(2) if image else out


def _write_into(out: torch.Tensor, first: int, frames: torch.Tensor) -> None:
    out[:, :, first:first + frames.shape[2]] = frames


def _decode_stream(model, z, size_thw, deliver: SinkFn, plan: planning.Plan, opts, steps: Steps,
                   count: bool = True) -> None:
    """Temporal chunks of `z` through the decoder, cropped to `size_thw` (frames, height, width) and
    handed to `deliver(first, frames)`, exactly tiled when the plan's tile is smaller than the frame."""
    t_out, h_out, w_out = size_thw
    reference = (z.shape[3] * model.spatial_factor, z.shape[4] * model.spatial_factor)
    device, dtype = model.device, model.decode_dtype
    ctx = _context(model, plan, opts, steps, reference, count)
    pos = 0

    def step(first, n, write):
        nonlocal pos
        y = model.decode_chunk(z[:, :, first:first + n].to(device=device, dtype=dtype), ctx)
        if _overflowed(y):
            raise recovery.HalfOverflow("fp16 decode produced Inf/NaN")
        if not write:
            return True
        k = min(y.shape[2], t_out - pos)
        deliver(pos, y[:, :, :k, :h_out, :w_out])
        pos += k
        return pos < t_out

    _stream(model, ctx, steps, plan, z.shape[2], reference, step, count)
