"""The streaming engine: runs a whole clip through a `VideoVAE` in temporal chunks and spatial tiles.

Pixel frames and latent frames correspond as 0 <-> 0 and latent i <-> pixels 4i-3..4i, so a chunk of
c latent frames is 1 + 4(c-1) pixel frames for the first chunk and 4c afterwards. The causal caches
in the `StreamContext` make every chunking produce the whole-clip result; chunks are written into a
preallocated output (optionally on another device) or handed to a `sink` (a video file writer), and
encode reads its input chunk by chunk (also from a video file), so memory does not grow with clip
length beyond the output itself. Spatial tiling (`tiling.py`) composes with the chunking; a memory
budget picks chunk and tile (`memory.py`); out-of-memory and fp16 overflow are recovered from
(`recovery.py`).
"""
import logging
import warnings
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F

from . import memory, recovery
from . import tiling as tiles
from .blocks import CausalConv3d, FrameConv2d, StreamContext
from .causal_cache import CausalCache, check_offload
from .devices import is_oom, same_device

ProgressFn = Callable[[int, int], None]
CancelFn = Callable[[], bool]
SinkFn = Callable[[int, torch.Tensor], None]  # (first frame index, frames B,3,k,H,W)
TILING_MODES = ("exact", "fast")
NONFINITE_MODES = ("error", "zero")
log = logging.getLogger("streamvae")


class Cancelled(RuntimeError):
    """The `cancel` callback asked the encode/decode to stop (checked after every tile)."""


class Steps:
    """Counts units of work (tile x chunk), reports (done, total) and honours cancellation.

    A chunk is `per_chunk` units: one per tile of every tiled conv under exact tiling (`convs`
    tiled convs per chunk; `chunk_done` realigns the count at the end of each chunk), else one.
    """

    def __init__(self, chunks: int, progress: ProgressFn | None, cancel: CancelFn | None, convs: int = 0):
        self.chunks, self.chunks_done, self.per_chunk, self.done, self.convs = chunks, 0, 1, 0, convs
        self.progress, self.cancel = progress, cancel

    @property
    def total(self) -> int:
        return self.chunks * self.per_chunk

    def units_per_chunk(self, tiling) -> int:
        if tiling is None:
            return 1
        rows, cols = tiling.grid
        return max(1, self.convs * rows * cols)

    def replan(self, chunks_left: int, per_chunk: int) -> None:
        """Settings changed mid-stream (out-of-memory retry): recount what is left."""
        self.per_chunk, self.chunks = per_chunk, self.chunks_done + chunks_left
        self.done = self.chunks_done * per_chunk

    def check(self) -> None:
        if self.cancel is not None and self.cancel():
            raise Cancelled(f"cancelled after {self.done} of {self.total} steps")

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(self.done, self.total)

    def __call__(self) -> None:
        """One unit done (a tile of a conv, or a chunk of a fast-mode tile), then check cancellation.
        Under exact tiling the last unit of a chunk is left for `chunk_done`, as the estimate may be high."""
        if self.done % self.per_chunk != self.per_chunk - 1 or self.per_chunk == 1:
            self.done = min(self.done + 1, self.total)
            self._report()
        self.check()

    def chunk_done(self) -> None:
        self.chunks_done += 1
        self.done = self.chunks_done * self.per_chunk
        self._report()
        self.check()


def _conv_count(modules) -> int:
    return sum(isinstance(m, (CausalConv3d, FrameConv2d)) for root in modules for m in root.modules())


def _exact_tiling(reference_hw, size, steps: Steps):
    """An ExactTiling on the video size `reference_hw`, or None when one tile covers the frame."""
    if size is None or (size[0] >= reference_hw[0] and size[1] >= reference_hw[1]):
        return None
    tiling = tiles.ExactTiling(reference_hw, size, steps)
    steps.replan(steps.chunks, steps.units_per_chunk(tiling))
    return tiling


def latent_frames(num_frames: int, temporal_factor: int = 4) -> int:
    """Latent frames for `num_frames` pixel frames (after padding to the next 4n+1)."""
    return (num_frames - 1 + temporal_factor - 1) // temporal_factor + 1


def pixel_frames(num_latent: int, temporal_factor: int = 4) -> int:
    return temporal_factor * (num_latent - 1) + 1


def _pixel_span(first: int, count: int, temporal_factor: int) -> tuple[int, int]:
    """Pixel-frame range [start, stop) of latent frames [first, first + count)."""
    start = 0 if first == 0 else temporal_factor * (first - 1) + 1
    return start, temporal_factor * (first + count - 1) + 1


def _check_chunk(temporal_chunk: int | None, total: int) -> int:
    if temporal_chunk is None:
        return 1
    if isinstance(temporal_chunk, bool) or not isinstance(temporal_chunk, int) or temporal_chunk < 1:
        raise ValueError(f"temporal_chunk must be a positive number of latent frames, got {temporal_chunk!r}")
    return min(temporal_chunk, total)


def _check_tiling(model, tiling: str, tile_size, tile_overlap):
    if tiling not in TILING_MODES:
        raise ValueError(f"tiling must be one of {TILING_MODES}, got {tiling!r}")
    if tile_size is None:
        return None, None
    size, overlap = tiles.as_pair(tile_size), tiles.as_pair(tile_overlap)
    smallest = 2 * model.spatial_factor
    if min(size) < smallest:
        raise ValueError(f"tile_size {tile_size!r} is below {smallest} px (2 latent cells of this {model.family} VAE); "
                         "use a larger tile, or None for no tiling")
    if min(overlap) < 0 or overlap[0] >= size[0] or overlap[1] >= size[1]:
        raise ValueError(f"tile_overlap {tile_overlap!r} must be >= 0 and smaller than tile_size {tile_size!r}")
    return size, overlap


def _as_video(x: torch.Tensor, what: str) -> tuple[torch.Tensor, bool]:
    image = x.dim() == 4
    if image:
        x = x.unsqueeze(2)
    if x.dim() != 5:
        raise ValueError(f"{what} must be 5-D B,C,T,H,W or 4-D B,C,H,W; got shape {tuple(x.shape)}")
    return x, image


def _budgeted(model, op, shape, memory_budget, temporal_chunk, tile_size, tile_overlap, tiling, cache_offload,
              io_devices):
    """(temporal_chunk, tile_size, make_caches) to run with: the given ones, or the plan's for a
    memory budget. `make_caches()` makes a stream's `CausalCache`: where the plan (or the user) put
    them; cache_offload "auto" without a budget keeps them on the device, with offloading left to
    an out-of-memory retry. `io_devices`: where the whole input and output live."""
    check_offload(cache_offload)
    fallback = memory.offload_target(model.device) if cache_offload == "auto" else None
    offload = "none" if fallback else cache_offload
    if memory_budget is not None:
        try:
            plan = memory.plan(model, op, tuple(shape), temporal_chunk=temporal_chunk, tile_size=tile_size,
                               tile_overlap=tile_overlap, tiling=tiling, memory_budget=memory_budget,
                               cache_offload=cache_offload,
                               io_on_device=tuple(same_device(d, model.device) for d in io_devices))
        except KeyError as missing:  # no calibration for this family/op: run as given, OOM retry still guards
            log.warning("StreamVAE %s: memory budget ignored (%s)", op, missing.args[0] if missing.args else missing)
        else:
            if not plan.fits:
                log.warning("StreamVAE %s: even %s exceeds the memory budget of %.2f GiB; trying it anyway (an "
                            "out-of-memory error shrinks it further). Exact tiles keep whole frames between layers: "
                            "to fit, free memory, decode a smaller size, or use tiling='fast'", op, plan.describe(),
                            plan.budget_bytes / 2**30)
            elif plan.cache_offload != "none":
                log.info("StreamVAE %s: %s", op, plan.describe())
            temporal_chunk, tile_size, offload = plan.temporal_chunk, plan.tile_size, plan.cache_offload
    return temporal_chunk, tile_size, partial(CausalCache, offload, model.device, fallback=fallback)


def _stream(model, ctx: StreamContext, steps: Steps, n_lat: int, chunk: int, reference_hw, step, count: bool) -> None:
    """step(first, count, write) for consecutive runs of latent frames until done or step returns False.

    Out of memory inside a step shrinks tile then chunk (`recovery.Shrinker`) and retries. No copy of
    the causal caches is kept for that: it would double their memory, the largest part of a chunk's
    peak. Instead the caches are rebuilt by running the finished latent frames again with the new
    settings (`write=False`: their output is already written and stays). Every chunk after the first
    has the same size, so an out-of-memory error nearly always comes in the second chunk and the
    rebuild is the first chunk's single latent frame. The caches are closed at the end."""
    try:
        shrinker, lo, done = None, 0, 0  # caches hold frames [0, lo); output is written for [0, done)
        while lo < n_lat:
            replay = lo < done
            n = min(chunk, (done if replay else n_lat) - lo)
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
            ctx.cache.clear()
            ctx.first_chunk, lo = True, 0
            recovery.free_cached_memory(model.device)
            shrinker = shrinker or recovery.Shrinker(model, ctx, steps, reference_hw, chunk, count)
            chunk = shrinker.shrink(reason, n_lat - done)
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
    return_logvar: bool = False,
    out_device: torch.device | str | None = None,
    progress: ProgressFn | None = None,
    cancel: CancelFn | None = None,
):
    """Encode pixels B,3,T,H,W (or B,3,H,W) in [-1, 1] to the raw posterior mean B,C,T',h,w.

    `video` may also be a frame source read chunk by chunk (`video_reader.VideoReader`): `shape`,
    `dtype`, `device` and `index_select(2, ascending frame indices)` as a tensor has them.

    T is padded to 4n+1 by repeating the last frame and H, W to multiples of the spatial factor by
    edge replication, one chunk at a time (the padded clip is never materialised). `tile_size` and
    `tile_overlap` (pixels) tile the frame; `tiling` is "exact" (equals untiled) or "fast"
    (independent blended tiles). `memory_budget` (bytes or "auto") picks the largest chunk and tile
    that fit, the given ones acting as upper limits. `cache_offload` says where the causal caches
    wait between chunks: "none" (compute device), "host" (pinned CPU memory, for GPUs), "disk", or
    "auto" (offloaded when a memory budget or an out-of-memory retry needs it). Every setting gives
    the same result. With `return_logvar` the result is (mean, logvar).
    """
    video, image = _as_video(video, "encode input") if isinstance(video, torch.Tensor) else (video, False)
    b, c, t, h, w = video.shape
    if c != model.in_channels:
        raise ValueError(f"encode expects {model.in_channels} colour channels on dim 1, got {c} (shape {tuple(video.shape)})")
    if t < 1 or h < 1 or w < 1:
        raise ValueError(f"encode got an empty video of shape {tuple(video.shape)}")
    _check_tiling(model, tiling, tile_size, tile_overlap)
    out_device = video.device if out_device is None else torch.device(out_device)
    temporal_chunk, tile_size, make_caches = _budgeted(model, "encode", video.shape, memory_budget, temporal_chunk, tile_size,
                                                   tile_overlap, tiling, cache_offload, (video.device, out_device))
    size, overlap = _check_tiling(model, tiling, tile_size, tile_overlap)
    sf, tf = model.spatial_factor, model.temporal_factor
    n_lat = latent_frames(t, tf)
    chunk = _check_chunk(temporal_chunk, n_lat)
    out_dtype = video.dtype if video.dtype.is_floating_point else torch.float32
    shape = (b, model.latent_channels, n_lat, -(-h // sf), -(-w // sf))
    mean = torch.empty(shape, dtype=out_dtype, device=out_device)
    logvar = torch.empty(shape, dtype=out_dtype, device=out_device) if return_logvar else None
    n_chunks = -(-n_lat // chunk)
    grid = tiles.latent_grid(shape[3], shape[4], size, overlap, sf) if size and tiling == "fast" else None
    if grid is not None and not isinstance(video, torch.Tensor):  # each tile would read the whole clip
        raise ValueError("fast tiling cannot stream from a frame source; use tiling='exact'")

    def run():
        if grid is None:
            steps = Steps(n_chunks, progress, cancel, _conv_count(model.encode_modules()))
            _encode_stream(model, video, mean, logvar, chunk, steps, size, make_caches)
            return
        steps = Steps(n_chunks * len(grid[0]) * len(grid[1]), progress, cancel)

        def encode_tile(pixels):
            tile_shape = (b, model.latent_channels, n_lat, -(-pixels.shape[3] // sf), -(-pixels.shape[4] // sf))
            m = torch.empty(tile_shape, dtype=out_dtype, device=out_device)
            lv = torch.empty_like(m) if logvar is not None else None
            _encode_stream(model, pixels, m, lv, chunk, steps, None, make_caches, count=False)
            return (m, lv) if lv is not None else (m,)

        tiles.encode_fast(video, mean, logvar, grid, sf, encode_tile, steps.check)

    with torch.inference_mode():
        _with_half_fallback(model, "encode", run)
    if image:
        mean = mean.squeeze(2)
        logvar = logvar.squeeze(2) if logvar is not None else None
    return (mean, logvar) if return_logvar else mean


def _encode_stream(model, video, mean, logvar, chunk, steps: Steps, tile_size, make_caches, count: bool = True) -> None:
    """Temporal chunks of `video` through the encoder into the preallocated `mean` (and `logvar`),
    exactly tiled when `tile_size` is smaller than the (padded) frame."""
    t, h, w = video.shape[2:]
    sf, tf = model.spatial_factor, model.temporal_factor
    hp, wp = mean.shape[3] * sf, mean.shape[4] * sf
    device, dtype = model.device, model.encode_dtype
    ctx = StreamContext(model.opts, _exact_tiling((hp, wp), tile_size, steps) if count else None, make_caches())

    def step(first, n, write):
        start, stop = _pixel_span(first, n, tf)
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

    _stream(model, ctx, steps, mean.shape[2], chunk, (hp, wp), step, count)


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
    nonfinite: str = "error",
    out: torch.Tensor | None = None,
    out_device: torch.device | str | None = None,
    out_dtype: torch.dtype | None = None,
    sink: SinkFn | None = None,
    progress: ProgressFn | None = None,
    cancel: CancelFn | None = None,
) -> torch.Tensor | None:
    """Decode a raw latent B,C,T',h,w (or B,C,h,w) to pixels B,3,T,H,W (or B,3,H,W), not clamped.

    `num_frames`, `height`, `width` trim the output (to undo `encode`'s padding); the decoded chunks
    are written straight into a preallocated buffer (`out`, or a new one on `out_device`), or, with
    `sink`, handed over as they are decoded: `sink(first, frames)` gets frames B,3,k,H,W (on the
    compute device, not clamped, to be copied before it returns) starting at frame `first`, and
    decode returns None. A rerun (fp16 overflow) starts again at frame 0; only exact tiling streams.
    `tile_size` / `tile_overlap` (output pixels), `tiling`, `memory_budget` and `cache_offload` as
    in `encode`.
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
    _check_tiling(model, tiling, tile_size, tile_overlap)
    where_out = out.device if out is not None else (z.device if out_device is None else out_device)
    temporal_chunk, tile_size, make_caches = _budgeted(model, "decode", z.shape, memory_budget, temporal_chunk, tile_size,
                                                   tile_overlap, tiling, cache_offload, (z.device, where_out))
    size, overlap = _check_tiling(model, tiling, tile_size, tile_overlap)
    sf, tf = model.spatial_factor, model.temporal_factor
    full_t, full_h, full_w = pixel_frames(n_lat, tf), h * sf, w * sf
    t_out = full_t if num_frames is None else num_frames
    h_out = full_h if height is None else height
    w_out = full_w if width is None else width
    for name, value, limit in (("num_frames", t_out, full_t), ("height", h_out, full_h), ("width", w_out, full_w)):
        if not 1 <= value <= limit:
            raise ValueError(f"{name}={value} is outside 1..{limit}, the size this latent decodes to")
    chunk = _check_chunk(temporal_chunk, n_lat)
    shape = (b, 3, t_out, h_out, w_out)
    if sink is not None and (out is not None or (size and tiling == "fast")):  # fast: each tile spans the clip
        raise ValueError("decode takes out or sink, not both, and streams to a sink with tiling='exact' only")
    if out is None and sink is None:
        dtype = out_dtype or (z.dtype if z.dtype.is_floating_point else torch.float32)
        out = torch.empty(shape, dtype=dtype, device=z.device if out_device is None else out_device)
    elif out is not None and tuple(out.shape) != shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {shape}")
    n_chunks = -(-n_lat // chunk)
    grid = tiles.latent_grid(h, w, size, overlap, sf) if size and tiling == "fast" else None

    def run():
        if grid is None:
            steps = Steps(n_chunks, progress, cancel, _conv_count(model.decode_modules()))
            _decode_stream(model, z, shape[2:], sink or partial(_write_into, out), chunk, steps, size, make_caches)
            return
        steps = Steps(n_chunks * len(grid[0]) * len(grid[1]), progress, cancel)

        def decode_tile(zt):
            tile_out = torch.empty((b, 3, t_out, zt.shape[3] * sf, zt.shape[4] * sf), dtype=out.dtype, device=out.device)
            _decode_stream(model, zt, tile_out.shape[2:], partial(_write_into, tile_out), chunk, steps, None, make_caches,
                           count=False)
            return tile_out

        tiles.decode_fast(model, z, out, grid, decode_tile, steps.check)

    with torch.inference_mode():
        _with_half_fallback(model, "decode", run)
    return None if sink is not None else out.squeeze(2) if image else out


def _write_into(out: torch.Tensor, first: int, frames: torch.Tensor) -> None:
    out[:, :, first:first + frames.shape[2]] = frames


def _decode_stream(model, z, size_thw, deliver: SinkFn, chunk, steps: Steps, tile_size, make_caches, count: bool = True) -> None:
    """Temporal chunks of `z` through the decoder, cropped to `size_thw` (frames, height, width) and
    handed to `deliver(first, frames)`, exactly tiled when `tile_size` is smaller than the frame."""
    t_out, h_out, w_out = size_thw
    reference = (z.shape[3] * model.spatial_factor, z.shape[4] * model.spatial_factor)
    device, dtype = model.device, model.decode_dtype
    ctx = StreamContext(model.opts, _exact_tiling(reference, tile_size, steps) if count else None, make_caches())
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

    _stream(model, ctx, steps, z.shape[2], chunk, reference, step, count)
