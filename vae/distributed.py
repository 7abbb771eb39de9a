"""Several processes, one exact encode/decode: the frame split into row bands over a torch.distributed group.

An execution strategy of the same engine as exact tiling (`tiling.ExactTiling`): `BandExecution` is the
`ctx.tiling` every conv, norm and attention block consults. Where exact tiles keep whole frames between
layers and loop over tiles, here every layer's activations exist only as the calling rank's band of rows
(B,C,T,rows,W), so activation memory per rank shrinks with the number of ranks:

- bands: rank k owns latent rows [e_k, e_k+1) and, at a layer with s rows per latent row, rows
  [s*e_k, s*e_k+1). Every up- or downsampling maps a band onto the band at the other resolution, so the
  pointwise steps (residual adds, pixel shuffles, Wan2.2's patchify and stage shortcuts, RMSNorm) run
  on the band unchanged.
- convolutions: the rank writes [cached head | new frames] of its own rows into the conv's input buffer,
  receives from the owning ranks the halo rows its outputs read (all frames of the window; zero padding
  only at the frame border), sends them the rows they read, and convolves the buffer "valid": the same
  buffer and conv call as an exact tile. A conv's causal cache holds the rank's own rows only.
- GroupNorm (SeedVR2): per-band (mean, var) all-gathered and merged into whole-frame statistics;
  Wan's RMSNorm is per position and needs none.
- mid-block attention: its latent-resolution input is all-gathered (the smallest layer); each rank
  computes the queries of its own rows against every key of the frame.

`decode` / `encode` run the clip in temporal chunks (causal caches carried per band) on every rank of
the group (SPMD, e.g. under torchrun) and assemble the output on rank 0 (`gather=True`) or leave each
rank its band. Every rank must pass the same input and settings; a peer that dies makes the others'
next exchange fail (gloo at once, NCCL after the group's timeout), so nothing waits forever.
"""
import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import planning
from .blocks import StreamContext, zero_border
from .causal_cache import CausalCache
from .engine import _as_video
from .geometry import latent_frames, pixel_frames, pixel_span
from .layers import FrameGroupNorm
from .optimizations import Optimizations, group_norm_moments, merge_group_moments
from .progress import Cancelled

SinkFn = Callable[[int, torch.Tensor], None]  # (first frame index, frames B,C,k,H,W)
log = logging.getLogger("streamvae")


@dataclass(frozen=True)
class Bands:
    """Row bands: rank k owns latent rows [edges[k], edges[k + 1]); at a layer with `s` rows per
    latent row (s = 8 at a decoder's output, 1/2 never occurs), rows [s * edges[k], s * edges[k + 1])."""

    edges: tuple[int, ...]

    @classmethod
    def split(cls, latent_rows: int, ranks: int, rows: Sequence[int] | None = None) -> "Bands":
        """Bands of `rows` latent rows per rank (uneven allowed), or as even as possible."""
        if rows is None:
            rows = [(k + 1) * latent_rows // ranks - k * latent_rows // ranks for k in range(ranks)]
        rows = [int(r) for r in rows]
        if len(rows) != ranks or sum(rows) != latent_rows or min(rows) < 1:
            raise ValueError(f"cannot split {latent_rows} latent rows over {ranks} ranks as {rows}: every rank needs at "
                             f"least one row and the bands must add up to {latent_rows}; use fewer ranks or a taller "
                             "frame (or pass rows=None for an even split)")
        edges = [0]
        for r in rows:
            edges.append(edges[-1] + r)
        return cls(tuple(edges))

    @property
    def latent_rows(self) -> int:
        return self.edges[-1]

    def rows(self, rank: int, scale: int) -> tuple[int, int]:
        return scale * self.edges[rank], scale * self.edges[rank + 1]

    def scale_of(self, height: int) -> int:
        """Rows per latent row of a layer `height` rows tall."""
        if height % self.latent_rows:
            raise ValueError(f"a layer of {height} rows is not a whole multiple of the {self.latent_rows} latent rows")
        return height // self.latent_rows


class BandExecution:
    """The `ctx.tiling` of a distributed run: this rank's band of every layer (see the module docstring)."""

    def __init__(self, bands: Bands, group=None):
        self.bands, self.group = bands, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.peers = [dist.get_global_rank(group, r) if group is not None else r for r in range(self.world)]
        self.sent_bytes = 0  # halo and gather traffic this rank sent (for the scaling model in bench/)

    def _scale(self, band_rows: int) -> int:
        lo, hi = self.bands.rows(self.rank, 1)
        if band_rows % (hi - lo):
            raise ValueError(f"a band of {band_rows} rows does not match this rank's {hi - lo} latent rows")
        return band_rows // (hi - lo)

    def _exchange(self, window: torch.Tensor, first_row: int, scale: int, wants: list[tuple[int, int]]) -> None:
        """Fill `window` (rows [first_row, first_row + n) of a layer at `scale` on dim -2, own rows already
        written) with the rows other ranks own, and send them the own rows they want (`wants[r]`: rows
        rank r needs, within the frame)."""
        lo, hi = self.bands.rows(self.rank, scale)
        ops, received = [], []
        for peer in range(self.world):
            if peer == self.rank:
                continue
            a, b = max(wants[peer][0], lo), min(wants[peer][1], hi)
            if a < b:
                part = window[..., a - first_row:b - first_row, :].contiguous()
                self.sent_bytes += part.numel() * part.element_size()
                ops.append(dist.P2POp(dist.isend, part, self.peers[peer], self.group))
            plo, phi = self.bands.rows(peer, scale)
            a, b = max(wants[self.rank][0], plo), min(wants[self.rank][1], phi)
            if a < b:
                part = window.new_empty(window.shape[:-2] + (b - a, window.shape[-1]))
                ops.append(dist.P2POp(dist.irecv, part, self.peers[peer], self.group))
                received.append((a - first_row, part))
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        for start, part in received:
            window[..., start:start + part.shape[-2], :] = part

    def conv(self, conv, ctx, shape, like: torch.Tensor, fill) -> torch.Tensor:
        """A (causal) conv over new frames of `shape` (B,C,T,rows,W: this rank's band), as
        `ExactTiling.conv` computes one tile: own rows from `fill`, halo rows from their owners."""
        b, c, t, band_rows, w = shape
        scale = self._scale(band_rows)
        height = scale * self.bands.latent_rows
        kh, kw = conv.kernel_size[-2:]
        sh, sw = conv.stride[-2:]
        left, right, top, bottom = conv.spatial_pad
        out_scale = self.bands.scale_of((height + top + bottom - kh) // sh + 1)
        wo = (w + left + right - kw) // sw + 1
        reads = []  # input rows each rank's output band reads, [a, b) (may reach into the zero padding)
        for r in range(self.world):
            oy0, oy1 = self.bands.rows(r, out_scale)
            reads.append((oy0 * sh - top, (oy1 - 1) * sh + kh - top))
        (iy0, iy1), (lo, hi) = reads[self.rank], self.bands.rows(self.rank, scale)
        if not iy0 <= lo < hi <= iy1:
            raise ValueError(f"{type(conv).__name__} reads rows {iy0}..{iy1} for its output band but the band is "
                             f"{lo}..{hi}: band execution needs convs whose outputs read their own band")
        ix1 = (wo - 1) * sw + kw - left  # columns read: [-left, ix1)
        head, n_head = conv.head(ctx)
        n = n_head + t
        n_out, keep = conv.output_frames(n), conv.kept_from(n)
        buf = like.new_empty((b, c, n, iy1 - iy0, ix1 + left))
        zero_border(buf, (left, ix1 - w, max(0, -iy0), max(0, iy1 - height)))
        own = buf[..., lo - iy0:hi - iy0, left:left + w]
        fill(own[:, :, n_head:], slice(0, band_rows), slice(0, w))
        conv.write_head(own, head, n_head)
        if conv.temporal:
            ctx.cache.put(conv, own[:, :, keep:])
        if not n_out:
            o0, o1 = self.bands.rows(self.rank, out_scale)
            return like.new_empty((b, conv.out_channels, 0, o1 - o0, wo))
        inside = [(max(a, 0), min(z, height)) for a, z in reads]
        top_in = max(0, -iy0)
        self._exchange(buf[..., top_in:top_in + inside[self.rank][1] - inside[self.rank][0], left:left + w],
                       inside[self.rank][0], scale, inside)
        return conv.conv5d(buf, ctx, padded=False)

    def local(self, fn, x: torch.Tensor, scale: int, halo: int) -> torch.Tensor:
        """fn(x) for a stateless, spatially local fn (radius `halo` input rows, output `scale` x the input
        resolution, zero padding at the frame border) on this rank's band x (B,C,T,rows,W)."""
        s = self._scale(x.shape[-2])
        height = s * self.bands.latent_rows
        wants = []
        for r in range(self.world):
            a, z = self.bands.rows(r, s)
            wants.append((max(a - halo, 0), min(z + halo, height)))
        (a, z), (lo, hi) = wants[self.rank], self.bands.rows(self.rank, s)
        window = x.new_empty(x.shape[:-2] + (z - a, x.shape[-1]))
        window[..., lo - a:hi - a, :] = x
        self._exchange(window, a, s, wants)
        return fn(window)[..., (lo - a) * scale:(hi - a) * scale, :]

    def norm_stats(self, norm, x: torch.Tensor, ctx):
        """Whole-frame statistics of `norm` from this rank's band x (B,C,T,rows,W): GroupNorm's per-band
        (mean, var) of every rank merged (in rank order, so every rank gets the same numbers)."""
        if not isinstance(norm, FrameGroupNorm):
            return norm.stats(x, ctx)  # per-position norms (Wan's RMSNorm) need no statistics
        mean, var = group_norm_moments(x, norm.num_groups, ctx.opts.triton_norm)
        mine = torch.stack([mean, var]).contiguous()
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(parts, mine, group=self.group)
        self.sent_bytes += mine.numel() * mine.element_size() * (self.world - 1)
        per_row = x.shape[-1] * (x.shape[1] // norm.num_groups)
        s = self._scale(x.shape[-2])
        counts = [per_row * (hi - lo) for lo, hi in (self.bands.rows(r, s) for r in range(self.world))]
        mean, var = merge_group_moments([(p[0], p[1], n) for p, n in zip(parts, counts)])
        return mean, torch.rsqrt(var + norm.eps)

    def attention(self, attention, x: torch.Tensor, ctx) -> torch.Tensor:
        """The mid-block attention for this rank's query rows against the whole frame's keys."""
        s = self._scale(x.shape[-2])
        lo, hi = self.bands.rows(self.rank, s)
        return attention.attend(self.all_rows(x, s), ctx, rows=slice(lo, hi))

    def all_rows(self, x: torch.Tensor, scale: int) -> torch.Tensor:
        """Every rank's band x (B,C,T,rows,W) of a layer at `scale`, as whole frames on every rank."""
        spans = [self.bands.rows(r, scale) for r in range(self.world)]
        tallest = max(hi - lo for lo, hi in spans)
        mine = F.pad(x, (0, 0, 0, tallest - x.shape[-2])).contiguous()
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(parts, mine, group=self.group)
        self.sent_bytes += x.numel() * x.element_size() * (self.world - 1)
        return torch.cat([p[..., :hi - lo, :] for p, (lo, hi) in zip(parts, spans)], dim=-2)

    def gather_rows(self, x: torch.Tensor, scale: int) -> torch.Tensor | None:
        """Every rank's band x (B,C,T,rows,W) as whole frames on rank 0 (None on the others)."""
        if self.rank:
            part = x.contiguous()
            self.sent_bytes += part.numel() * part.element_size()
            dist.send(part, self.peers[0], group=self.group)
            return None
        whole = x.new_empty(x.shape[:-2] + (scale * self.bands.latent_rows, x.shape[-1]))
        lo, hi = self.bands.rows(0, scale)
        whole[..., lo:hi, :] = x
        for r in range(1, self.world):
            lo, hi = self.bands.rows(r, scale)
            part = x.new_empty(x.shape[:-2] + (hi - lo, x.shape[-1]))
            dist.recv(part, self.peers[r], group=self.group)
            whole[..., lo:hi, :] = part
        return whole

    def agree(self, values: Sequence[int], device, what: str) -> None:
        """Raise on every rank unless every rank passed the same `values` (shapes and settings)."""
        mine = torch.tensor(list(values), dtype=torch.int64, device=device)
        low, high = mine.clone(), mine.clone()
        dist.all_reduce(low, dist.ReduceOp.MIN, group=self.group)
        dist.all_reduce(high, dist.ReduceOp.MAX, group=self.group)
        if not torch.equal(low, high):
            raise ValueError(f"the ranks of the group were given different {what} (rank {self.rank}: {list(values)}); "
                             "every rank must call with the same input and settings")

    def smallest(self, value: int, device) -> int:
        """The smallest `value` over the ranks."""
        tensor = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(tensor, dist.ReduceOp.MIN, group=self.group)
        return int(tensor.item())

    def any_rank(self, flag: bool, device) -> bool:
        """True on every rank when `flag` is True on any (cancellation agreed between the ranks)."""
        value = torch.tensor([int(flag)], device=device)
        dist.all_reduce(value, dist.ReduceOp.MAX, group=self.group)
        return bool(value.item())


def _setup(model, op: str, shape, n_rows: int, group, rows, temporal_chunk, memory_budget, cache_offload: str,
           opts: Optimizations):
    """(execution, context, latent chunk) of one distributed run on input `shape` (B,C,T,H,W; decode: the
    latent, H = `n_rows`). With `memory_budget` (bytes or "auto": this rank's free memory) the chunk and
    the cache offload are what the memory model fits for an untiled frame of the largest band; the
    ranks then run the smallest chunk any of them can afford."""
    if not dist.is_initialized():
        raise RuntimeError("vae.distributed needs an initialised process group: call torch.distributed."
                           "init_process_group (gloo on CPUs, nccl on GPUs) first, e.g. under torchrun")
    execution = BandExecution(Bands.split(n_rows, dist.get_world_size(group), rows), group)
    if temporal_chunk is not None and (isinstance(temporal_chunk, bool) or not isinstance(temporal_chunk, int)
                                       or temporal_chunk < 1):
        raise ValueError(f"temporal_chunk must be a positive number of latent frames, got {temporal_chunk!r}")
    n_lat = shape[2] if op == "decode" else latent_frames(shape[2], model.temporal_factor)
    chunk = n_lat if temporal_chunk is None else min(temporal_chunk, n_lat)
    if memory_budget is not None:
        chunk, cache_offload = _fit_band(model, op, shape, execution.bands, chunk, memory_budget, opts)
        chunk = execution.smallest(chunk, model.device)  # every rank must run the same chunks
    ctx = StreamContext(opts, execution, CausalCache(cache_offload, model.device))
    return execution, ctx, chunk


def _fit_band(model, op: str, shape, bands: Bands, chunk: int, memory_budget, opts: Optimizations) -> tuple[int, str]:
    """(temporal chunk, cache offload) the memory model fits in `memory_budget` for an untiled frame of
    the largest band of an input of `shape`; (chunk, "none") where the model is not calibrated."""
    tallest = max(b - a for a, b in zip(bands.edges, bands.edges[1:])) * (1 if op == "decode" else model.spatial_factor)
    plan = planning.plan(model, op, tuple(shape[:3]) + (tallest, shape[4]), temporal_chunk=chunk,
                         memory_budget=memory_budget, cache_offload="auto", io_on_device=(False, False), opts=opts)
    if plan.peak_bytes is None:  # no calibration for this family/op/device (planning warned): run as given
        return chunk, "none"
    if plan.tile_size is None and plan.fits:
        return plan.temporal_chunk, plan.cache_offload
    log.warning("StreamVAE %s: a band of %d rows does not fit the memory budget of %.2f GiB untiled, even one latent "
                "frame at a time (tiles inside a band are not implemented); trying it anyway: use more ranks or a "
                "smaller frame", op, tallest, plan.budget_bytes / 2**30)
    return 1, plan.cache_offload


def _deliver_to(out: torch.Tensor | None, sink: SinkFn | None) -> SinkFn:
    if sink is not None:
        return sink
    return lambda first, frames: out[:, :, first:first + frames.shape[2]].copy_(frames)


def _chunks(execution: BandExecution, ctx, n_lat: int, chunk: int, device, run, progress, cancel) -> None:
    """run(first, count) for consecutive latent chunks; cancellation is agreed between the ranks per chunk."""
    total = -(-n_lat // chunk)
    try:
        for i, first in enumerate(range(0, n_lat, chunk)):
            if execution.any_rank(cancel is not None and cancel(), device):
                raise Cancelled(f"cancelled after {i} of {total} chunks")
            run(first, min(chunk, n_lat - first))
            ctx.first_chunk = False
            if progress is not None:
                progress(i + 1, total)
    finally:
        ctx.cache.close()


def decode(model, z: torch.Tensor, group=None, *, temporal_chunk: int | None = None, rows: Sequence[int] | None = None,
           num_frames: int | None = None, height: int | None = None, width: int | None = None, gather: bool = True,
           out_device=None, out_dtype: torch.dtype | None = None, sink: SinkFn | None = None,
           memory_budget=None, cache_offload: str = "none", progress=None, cancel=None,
           opts: Optimizations | None = None) -> torch.Tensor | None:
    """Decode a raw latent B,C,T',h,w (or B,C,h,w) split by rows over the ranks of `group` (default: the
    world); call on every rank with the same arguments. Equals `engine.decode` (untiled) within float
    rounding, for any `temporal_chunk` and any bands (`rows`: latent rows per rank, default even).

    `gather=True`: rank 0 returns pixels B,3,T,H,W (trimmed by num_frames/height/width as in
    `engine.decode`), or hands each chunk to `sink(first, frames)`; the other ranks return None.
    `gather=False`: every rank returns (or sinks) its own band of output rows, B,3,T,rows,W (rows
    [8 e_k, 8 e_k+1) of the untrimmed frame, cut at `height`). `cancel()` is polled on every rank per chunk.
    `memory_budget` (bytes, or "auto" = this rank's free memory) picks the temporal chunk (at most
    `temporal_chunk`) and where the caches wait (`cache_offload` as in `engine.decode`) per rank. `opts`: the kernels (default `Optimizations()`).
    """
    z, image = _as_video(z, "decode input")
    b, c, n_lat, h, w = z.shape
    if c != model.latent_channels:
        raise ValueError(f"this {model.family} VAE expects {model.latent_channels}-channel latents, got {c}")
    execution, ctx, chunk = _setup(model, "decode", z.shape, h, group, rows, temporal_chunk, memory_budget, cache_offload,
                                   opts or Optimizations())
    execution.agree((b, c, n_lat, h, w, chunk, int(gather)), model.device, "latent shapes or settings")
    sf = model.spatial_factor
    t_out = pixel_frames(n_lat, model.temporal_factor) if num_frames is None else num_frames
    h_out, w_out = height or h * sf, width or w * sf
    lo, hi = execution.bands.rows(execution.rank, 1)
    band = (lo * sf, min(hi * sf, h_out))
    delivers = gather is False or execution.rank == 0
    out = None
    if delivers and sink is None:
        rows_out = h_out if gather else max(0, band[1] - band[0])
        out = torch.empty((b, 3, t_out, rows_out, w_out), dtype=out_dtype or z.dtype,
                          device=z.device if out_device is None else out_device)
    deliver, pos = _deliver_to(out, sink), 0

    def run(first, n):
        nonlocal pos
        y = model.decode_chunk(z[:, :, first:first + n, lo:hi].to(model.device, model.decode_dtype), ctx)
        k = max(0, min(y.shape[2], t_out - pos))
        y = y[:, :, :k, :, :w_out]
        if gather:
            frames = execution.gather_rows(y, sf)
            frames = frames[..., :h_out, :] if frames is not None else None
        else:
            frames = y[..., :max(0, band[1] - band[0]), :]
        if frames is not None and k:
            deliver(pos, frames)
        pos += k

    with torch.inference_mode():
        _chunks(execution, ctx, n_lat, chunk, model.device, run, progress, cancel)
    if out is None:
        return None
    return out.squeeze(2) if image else out


def encode(model, video, group=None, *, temporal_chunk: int | None = None, rows: Sequence[int] | None = None,
           gather: bool = True, return_logvar: bool = False, out_device=None, memory_budget=None,
           cache_offload: str = "none", progress=None, cancel=None, opts: Optimizations | None = None):
    """Encode pixels B,3,T,H,W (or B,3,H,W, or a frame source as `engine.encode` takes) in [-1, 1]
    split by rows over the ranks of `group`; call on every rank with the same arguments. Each rank reads
    only its band of pixel rows (padding as `engine.encode`: T to 4n+1, H and W to the spatial factor).

    `gather=True`: rank 0 returns the raw posterior mean B,C,T',h,w (with `return_logvar`: (mean,
    logvar)), the others None; `gather=False`: every rank returns its band of latent rows. `opts` as in `decode`.
    """
    video, image = _as_video(video, "encode input") if isinstance(video, torch.Tensor) else (video, False)
    b, c, t, h, w = video.shape
    if c != model.in_channels:
        raise ValueError(f"encode expects {model.in_channels} colour channels on dim 1, got {c}")
    sf, tf = model.spatial_factor, model.temporal_factor
    n_lat, h_lat, w_lat = latent_frames(t, tf), -(-h // sf), -(-w // sf)
    execution, ctx, chunk = _setup(model, "encode", video.shape, h_lat, group, rows, temporal_chunk, memory_budget,
                                   cache_offload, opts or Optimizations())
    execution.agree((b, c, t, h, w, chunk, int(gather)), model.device, "video shapes or settings")
    lo, hi = execution.bands.rows(execution.rank, 1)
    r0, r1 = lo * sf, min(hi * sf, h)  # a band starts inside the frame: the padding is under sf rows
    parts = None
    if gather is False or execution.rank == 0:
        shape = (b, model.latent_channels, n_lat, h_lat if gather else hi - lo, w_lat)
        dtype = video.dtype if video.dtype.is_floating_point else torch.float32
        device = video.device if out_device is None else out_device
        parts = [torch.empty(shape, dtype=dtype, device=device) for _ in range(2 if return_logvar else 1)]

    def run(first, n):
        start, stop = pixel_span(first, n, tf)
        frames = torch.arange(start, stop).clamp_(max=t - 1)
        frames = frames.to(video.device)
        if isinstance(video, torch.Tensor):
            x = video[..., r0:r1, :].index_select(2, frames)
        else:  # a frame source reads whole frames
            x = video.index_select(2, frames)[..., r0:r1, :]
        x = x.to(model.device, model.encode_dtype)
        if (r1 - r0, w) != ((hi - lo) * sf, w_lat * sf):  # edge replication, as engine.encode pads
            x = F.pad(x, (0, w_lat * sf - w, 0, (hi - lo) * sf - (r1 - r0), 0, 0), mode="replicate")
        moments = model.encode_chunk(x, ctx)[:2 if return_logvar else 1]
        for i, m in enumerate(moments):
            whole = execution.gather_rows(m, 1) if gather else m
            if whole is not None:
                parts[i][:, :, first:first + whole.shape[2]] = whole

    with torch.inference_mode():
        _chunks(execution, ctx, n_lat, chunk, model.device, run, progress, cancel)
    if parts is None:
        return None
    if image:
        parts = [p.squeeze(2) for p in parts]
    return tuple(parts) if return_logvar else parts[0]
