"""Row bands: one exact encode/decode over the ranks of a torch.distributed group, each holding a band
of the rows of every layer, so activation memory per rank shrinks with the number of ranks.

- bands: rank k owns latent rows [e_k, e_k+1) and, at a layer with s rows per latent row, rows
  [s*e_k, s*e_k+1). Every up- or downsampling maps a band onto the band at the other resolution, so the
  pointwise steps (residual adds, pixel shuffles, Wan2.2's patchify and stage shortcuts, RMSNorm) run
  on the band unchanged.
- convolutions: the rank writes [cached head | new frames] of its own rows into the conv's input buffer,
  receives from the owning ranks the halo rows its outputs read (all frames of the window; zero padding
  only at the frame border), sends them the rows they read, and convolves the buffer "valid": the same
  window and conv call as an exact tile (`ConvWindow`). A conv's causal cache holds the rank's own rows.
- GroupNorm (SeedVR2): per-band (mean, var) all-gathered and merged into whole-frame statistics; Wan's
  RMSNorm is per position and needs none.
- mid-block attention: its latent-resolution input is all-gathered (the smallest layer); each rank
  computes the queries of its own rows against every key of the frame.

`RowBands` is both the `Execution` the blocks consult and the engine's `Partition`: the engine runs the
clip in temporal chunks on every rank (SPMD, e.g. under torchrun) and the output is gathered on rank 0
(`gather=True`) or left to each rank as its band. Every rank must pass the same input and settings; a
peer that dies makes the others' next exchange fail (gloo at once, NCCL after the group's timeout), so
nothing waits forever.
"""
import dataclasses
import logging
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..kernels.activation_layout import empty_video
from ..model.blocks import CausalConv3d, FrameConv2d
from ..model.execution import Attention, Conv, Norm, require
from ..model.layers import residual_sequence
from ..run import planning
from ..run.strategies import ConvWindow

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

    @property
    def tallest(self) -> int:
        return max(b - a for a, b in zip(self.edges, self.edges[1:]))

    def rows(self, rank: int, scale: int) -> tuple[int, int]:
        return scale * self.edges[rank], scale * self.edges[rank + 1]

    def scale_of(self, height: int) -> int:
        """Rows per latent row of a layer `height` rows tall."""
        if height % self.latent_rows:
            raise ValueError(f"a layer of {height} rows is not a whole multiple of the {self.latent_rows} latent rows")
        return height // self.latent_rows


class RowBands:
    """This rank's band of every layer (see the module docstring): an `Execution` and a `Partition`.

    `group`: the process group (None: the world); `rows`: latent rows per rank (None: even); `gather`:
    rank 0 receives whole frames (else every rank keeps its band). The bands are laid out when the
    engine knows the latent height (`start`)."""

    eager_reason = "row-band steps"  # halo exchanges and collectives per conv
    recoverable = False  # the ranks would have to agree on a smaller plan

    def __init__(self, group=None, rows: Sequence[int] | None = None, gather: bool = True):
        if not dist.is_initialized():
            raise RuntimeError("row bands need an initialised process group: call torch.distributed."
                               "init_process_group (gloo on CPUs, nccl on GPUs) first, e.g. under torchrun")
        self.group, self.wanted_rows, self.gather = group, rows, gather
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.peers = [dist.get_global_rank(group, r) if group is not None else r for r in range(self.world)]
        self.bands: Bands | None = None
        self.device: torch.device | None = None  # the run's (`agree`): every collective's tensors are there
        self.sent_bytes = 0  # halo and gather traffic this rank sent (for the scaling model in bench/)

    # -- the run: bands, plan, agreement ---------------------------------------------------------------
    @property
    def execution(self) -> "RowBands":
        """Every layer of the run computes this rank's band (the `Partition`'s strategy)."""
        return self

    def start(self, latent_rows: int) -> "RowBands":
        """Lay the bands out over a frame of `latent_rows` latent rows."""
        self.bands = Bands.split(latent_rows, self.world, self.wanted_rows)
        return self

    def agreed_plan(self, model, op: str, input_shape, settings: planning.Settings, opts) -> planning.Plan:
        """The run's plan: untiled bands, the settings' temporal chunk (default: the whole clip) and
        cache offload; with a memory budget, the chunk and offload the memory model fits for an untiled
        frame of the tallest band, the ranks then running the smallest chunk any of them can afford.
        Its peak is one rank's; an op that sees the whole clip (`VideoVAE.clip_extent`) keeps it in one
        chunk, and is refused where it takes no spatial parts. Convs that look ahead in time or pad by
        reflection (LTX-2's decoder) are refused: a band's conv knows no clip end, and a reflection may read
        past its halo."""
        modules = model.decode_modules() if op == "decode" else model.encode_modules()
        extent = model.clip_extent(op)
        if not extent.tiled:
            raise ValueError(f"row bands cannot run this {model.family} {op}: it sees the whole clip at once "
                             f"({extent.value}); {op} on one device")
        if model.looks_ahead(op) or any(m.padding_mode == "reflect" for root in modules for m in root.modules()
                                        if isinstance(m, (CausalConv3d, FrameConv2d))):
            raise ValueError(f"row bands cannot run this {model.family} {op} yet (its convs look ahead in time or pad "
                             f"by reflection): {op} on one device, with exact tiles for the memory")
        clip = planning.clip_of(model, op, input_shape)
        tallest = self.bands.tallest * (1 if op == "decode" else model.spatial_factor)
        band_shape = tuple(input_shape[:3]) + (tallest, input_shape[4])
        band = dataclasses.replace(settings, temporal_chunk=settings.temporal_chunk or clip.latent_frames,
                                   tile_size=None, tiling="exact", stream_frames=False)
        fitted = planning.plan(model, op, band_shape, band, io_on_device=(False, False), opts=opts)
        chunk = fitted.temporal_chunk
        if settings.memory_budget is not None:
            if fitted.tile_size is not None or fitted.fits is False:
                log.warning("StreamVAE %s: a band of %d rows does not fit the memory budget of %.2f GiB untiled, even "
                            "one latent frame at a time (tiles inside a band are not implemented); trying it anyway: "
                            "use more ranks or a smaller frame", op, tallest, fitted.budget_bytes / 2**30)
                chunk = 1 if extent.chunked else clip.latent_frames
            chunk = self._smallest(chunk, model.device)  # every rank must run the same chunks
        return dataclasses.replace(fitted, input_shape=tuple(input_shape), clip=clip, temporal_chunk=chunk,
                                   tile_size=None, frames_streamed=False, grid=(1, 1, clip.chunks(chunk)))

    def agree(self, values: Sequence[int], device, what: str) -> None:
        """Raise on every rank unless every rank passed the same `values` (shapes and settings). The engine
        asks before a run's first step, with the run's `device`, kept for the collectives of its steps (an
        NCCL group serves CUDA tensors only, and a tensor made without a device is on the CPU)."""
        self.device = torch.device(device)
        mine = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        low, high = mine.clone(), mine.clone()
        dist.all_reduce(low, dist.ReduceOp.MIN, group=self.group)
        dist.all_reduce(high, dist.ReduceOp.MAX, group=self.group)
        if not torch.equal(low, high):
            raise ValueError(f"the ranks of the group were given different {what} (rank {self.rank}: {list(values)}); "
                             "every rank must call with the same input and settings")

    def _smallest(self, value: int, device) -> int:
        tensor = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(tensor, dist.ReduceOp.MIN, group=self.group)
        return int(tensor.item())

    # -- Partition -----------------------------------------------------------------------------------
    def rows(self, scale: int) -> tuple[int, int]:
        return self.bands.rows(self.rank, scale)

    def delivers(self) -> bool:
        return not self.gather or self.rank == 0

    def output_rows(self, rows: int, scale: int) -> int:
        """Rows of a `rows`-row output this rank holds: all on rank 0 when gathering, else its band."""
        if self.gather:
            return rows
        lo, hi = self.bands.rows(self.rank, scale)
        return max(0, min(hi, rows) - lo)

    def collect(self, y: torch.Tensor, scale: int) -> torch.Tensor | None:
        """Whole frames on rank 0 (None elsewhere) when gathering, else this rank's band y."""
        return self._gather_rows(y, scale) if self.gather else y

    def cancelled(self, flag: bool) -> bool:
        """True on every rank when `flag` is True on any (cancellation agreed between the ranks)."""
        value = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(value, dist.ReduceOp.MAX, group=self.group)
        return bool(value.item())

    # -- Execution -----------------------------------------------------------------------------------
    def steps_per_conv(self) -> int:
        return 0  # progress and cancellation per chunk, agreed between the ranks

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

    def conv(self, conv: Conv, ctx, shape, like: torch.Tensor, fill) -> torch.Tensor:
        """A conv over new frames of `shape` (B,C,T,rows,W: this rank's band), as `ExactTiles.conv`
        computes one tile: own rows from `fill`, halo rows from their owners."""
        b, c, t, band_rows, w = shape
        scale = self._scale(band_rows)
        height = scale * self.bands.latent_rows
        window = ConvWindow(conv, (b, c, t, height, w))
        ho, wo = window.out_hw
        out_scale = self.bands.scale_of(ho)
        reads = [window.reads(self.bands.rows(r, out_scale), (0, wo)) for r in range(self.world)]
        (iy0, iy1), cols = reads[self.rank]
        lo, hi = self.bands.rows(self.rank, scale)
        if not iy0 <= lo < hi <= iy1:
            raise ValueError(f"{type(conv).__name__} reads rows {iy0}..{iy1} for its output band but the band is "
                             f"{lo}..{hi}: band execution needs convs whose outputs read their own band")
        time = require(conv, Conv).time_window(ctx, t)
        o0, o1 = self.bands.rows(self.rank, out_scale)
        if time is None:  # a conv that looks ahead has not started: no output, nothing kept
            return empty_video(like, (b, conv.out_channels, 0, o1 - o0, wo))
        buf, inner, rows_in, _ = window.buffer(like, time.total, (iy0, iy1), cols)
        own = inner[..., lo - rows_in.start:hi - rows_in.start, :]
        fill(own[:, :, time.head:time.head + t], slice(0, band_rows), slice(0, w))
        conv.pad_in_time(own, ctx.cache.get(conv) if time.cached else None, time)
        if conv.temporal:
            ctx.cache.put(conv, own[:, :, time.keep:])
        if not time.outputs:
            return empty_video(like, (b, conv.out_channels, 0, o1 - o0, wo))
        inside = [(max(a, 0), min(z, height)) for (a, z), _ in reads]
        self._exchange(inner, rows_in.start, scale, inside)
        window.pad(buf, (iy0, iy1), cols)  # replicated edges read the exchanged rows: after them
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
        window = empty_video(x, x.shape[:-2] + (z - a, x.shape[-1]))
        window[..., lo - a:hi - a, :] = x
        self._exchange(window, a, s, wants)
        return fn(window)[..., (lo - a) * scale:(hi - a) * scale, :]

    def norm_stats(self, norm: Norm, x: torch.Tensor, ctx):
        """Whole-frame statistics of `norm` from this rank's band x (B,C,T,rows,W): GroupNorm's per-band
        (mean, var) of every rank merged (in rank order, so every rank gets the same numbers)."""
        moments = require(norm, Norm).part_moments(x, ctx)
        if moments is None:
            return None  # per-position norms (Wan's RMSNorm) need no statistics
        mean, var, count = moments  # the other ranks' counts follow from their rows
        mine = torch.stack([mean, var]).contiguous()
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(parts, mine, group=self.group)
        self.sent_bytes += mine.numel() * mine.element_size() * (self.world - 1)
        per_row = count // x.shape[-2]  # elements per group, frame and row
        s = self._scale(x.shape[-2])
        counts = [per_row * (hi - lo) for lo, hi in (self.bands.rows(r, s) for r in range(self.world))]
        return norm.stats_of_parts([(p[0], p[1], n) for p, n in zip(parts, counts)], ctx)

    def residual(self, x: torch.Tensor, ctx, conv1, norm1, conv2, norm2, shortcut) -> torch.Tensor:
        """A residual block conv by conv, each over this rank's band."""
        return residual_sequence(x, ctx, conv1, norm1, conv2, norm2, shortcut)

    def attention(self, attention: Attention, x: torch.Tensor, ctx) -> torch.Tensor:
        """The mid-block attention for this rank's query rows against the whole frame's keys."""
        s = self._scale(x.shape[-2])
        lo, hi = self.bands.rows(self.rank, s)
        return require(attention, Attention).attend(self._all_rows(x, s), ctx, rows=slice(lo, hi))

    def _all_rows(self, x: torch.Tensor, scale: int) -> torch.Tensor:
        """Every rank's band x (B,C,T,rows,W) of a layer at `scale`, as whole frames on every rank."""
        spans = [self.bands.rows(r, scale) for r in range(self.world)]
        tallest = max(hi - lo for lo, hi in spans)
        mine = F.pad(x, (0, 0, 0, tallest - x.shape[-2])).contiguous()
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(parts, mine, group=self.group)
        self.sent_bytes += x.numel() * x.element_size() * (self.world - 1)
        return torch.cat([p[..., :hi - lo, :] for p, (lo, hi) in zip(parts, spans)], dim=-2)

    def _gather_rows(self, x: torch.Tensor, scale: int) -> torch.Tensor | None:
        """Every rank's band x (B,C,T,rows,W) as whole frames on rank 0 (None on the others)."""
        if self.rank:
            part = x.contiguous()
            self.sent_bytes += part.numel() * part.element_size()
            dist.send(part, self.peers[0], group=self.group)
            return None
        whole = empty_video(x, x.shape[:-2] + (scale * self.bands.latent_rows, x.shape[-1]))
        lo, hi = self.bands.rows(0, scale)
        whole[..., lo:hi, :] = x
        for r in range(1, self.world):
            lo, hi = self.bands.rows(r, scale)
            part = x.new_empty(x.shape[:-2] + (hi - lo, x.shape[-1]))
            dist.recv(part, self.peers[r], group=self.group)
            whole[..., lo:hi, :] = part
        return whole
