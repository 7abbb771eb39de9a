"""Exact tiles: every convolution computes its output tile by tile, and the result equals the untiled one.

A tile reads its input region plus the conv's receptive-field halo (one pixel for 3x3 kernels) and the
conv computes exactly the tile's outputs from it ("valid", no padding), so every output pixel sees what
the untiled conv would; zero padding applies only at the frame border. Norms that need whole-frame
statistics (SeedVR2's per-frame GroupNorm) compute them over the whole input first, and the mid-block
attention runs untiled at latent resolution. What exists per tile only: the conv's input buffer
(normalised input, cached head frames) and its working space. Layer outputs are whole frames. The
causal caches are whole frames, unpadded; when they wait off the device, a conv reads and writes
them a band of rows at a time (the rows one row of tiles reads, halo included), so no whole-frame
cache is ever on the device.

With `chain` (the plans that stream frames to reach the lowest peak), a residual block's two convs run
chained (`residual`): the first conv's output never exists whole. A first pass computes it tile by
tile only for the second norm's whole-frame statistics (and the first conv's next cache); the second
conv's tiles then recompute it over their own input regions, and add the shortcut tile by tile. The
first conv costs twice, and a residual block holds its input and its output instead of three frames.
"""
import torch

from ...kernels.activation_layout import empty_video
from ...model.blocks import norm_fill
from ...model.execution import Attention, Conv, Norm, TimeWindow, require
from ...model.layers import residual_sequence
from ..clip_statistics import Gathered
from ..geometry import exact_cuts, layer_spans
from . import ConvWindow


class ExactTiles:
    """The `Execution` of exact tiles over a grid given at the reference resolution (the video: decode
    output, encode input) and mapped onto each layer's resolution.

    A low-resolution conv whose whole frame is no larger than the largest tile buffer used so far runs
    untiled (`Optimizations.whole_frame_small_convs`: a conv streams its weights once per call, so at low
    resolution, where the weights outweigh the activations, small tiles multiply the time, and the peak
    does not grow). `step()` is called after every tile (progress and cancellation).
    """

    eager_reason = "exact-tile steps"  # per-tile loops, progress and cancellation: nothing a graph replays

    def __init__(self, reference_hw: tuple[int, int], tile_hw: tuple[int, int], step, chain: bool = False):
        (rh, rw), (th, tw) = reference_hw, tile_hw
        self.reference = (rh, rw)
        self.row_cuts, self.col_cuts = exact_cuts(rh, th), exact_cuts(rw, tw)
        self.step = step
        self.chain = chain
        self.largest_buffer = 0  # elements of the largest conv input buffer a tile has used so far

    @property
    def grid(self) -> tuple[int, int]:
        return len(self.row_cuts) + 1, len(self.col_cuts) + 1

    def steps_per_conv(self) -> int:
        rows, cols = self.grid
        return rows * cols

    def spans(self, height: int, width: int, multiple: int = 1):
        """The tile grid mapped onto a layer of height x width: row spans, column spans."""
        return (layer_spans(self.row_cuts, self.reference[0], height, multiple),
                layer_spans(self.col_cuts, self.reference[1], width, multiple))

    def _grid_of(self, call: "_ConvCall", ctx):
        rows, cols = self.spans(*call.window.out_hw)
        if ctx.opts.whole_frame_small_convs and call.input_elements <= self.largest_buffer:
            return [(0, call.window.out_hw[0])], [(0, call.window.out_hw[1])]
        return rows, cols

    def conv(self, conv: Conv, ctx, shape, like: torch.Tensor, fill, epilogue=None) -> torch.Tensor:
        """A conv over new frames of `shape` (B,C,T,H,W), tile by tile.

        `conv` (an `execution.Conv`) owns the causal state (`time_window`, `pad_in_time`: the same code
        as its untiled path); `fill(view, rows, cols)` writes input rows/cols
        (slices of the unpadded frame) into `view`. A tile's buffer is exactly the input region its
        outputs read, and the conv runs on it unpadded, so it computes nothing beyond the tile (Winograd
        has a valid mode for this: a same-padded conv of the region would also compute the halo).
        `epilogue(tile, rows, cols)` may change each output tile in place (a residual added).
        """
        time = require(conv, Conv).time_window(ctx, shape[2])
        if time is None:  # a conv that looks ahead has not started: no output, nothing kept
            return empty_video(like, (shape[0], conv.out_channels, 0, *ConvWindow(conv, tuple(shape)).out_hw))
        call = _ConvCall(conv, ctx, shape, like, time)
        ho, wo = call.window.out_hw
        out = empty_video(like, (shape[0], conv.out_channels, call.n_out, ho, wo))
        rows, cols = self._grid_of(call, ctx)
        for out_rows in rows:
            call.start_row(out_rows)
            for out_cols in cols:
                tile = call.tile(out_rows, out_cols, fill, keep_cache=True)
                self.largest_buffer = max(self.largest_buffer, call.last_buffer)
                if call.n_out:
                    view = out[..., slice(*out_rows), slice(*out_cols)]
                    view.copy_(tile)
                    if epilogue is not None:
                        epilogue(view, slice(*out_rows), slice(*out_cols))
                self.step()
            call.end_row()
        call.finish()
        return out

    def residual(self, x: torch.Tensor, ctx, conv1, norm1, conv2, norm2, shortcut) -> torch.Tensor:
        """conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))) + shortcut(x) on x (B,C,T,H,W), chained when `chain`
        and conv2's frame is tiled (see the module docstring); else conv by conv."""
        time1 = require(conv1, Conv).time_window(ctx, x.shape[2])
        h, w = ConvWindow(conv1, tuple(x.shape)).out_hw
        if not self.chain or time1 is None or not time1.outputs or self.spans(h, w) == ([(0, h)], [(0, w)]):
            return residual_sequence(x, ctx, conv1, norm1, conv2, norm2, shortcut)
        call1 = _ConvCall(conv1, ctx, x.shape, x, time1)
        for layer, kind in ((norm1, Norm), (norm2, Norm), (conv2, Conv)) + (((shortcut, Conv),) if shortcut else ()):
            require(layer, kind)
        fill1 = norm_fill(x, norm1, ctx, norm1.stats(x, ctx))
        # Pass 1: conv1's output tile by tile, for norm2's statistics and conv1's next cache (stored
        # but not committed: pass 2 reads the cache this call started with).
        parts = []
        rows, cols = self._grid_of(call1, ctx)
        for out_rows in rows:
            call1.start_row(out_rows)
            for out_cols in cols:
                parts.append(norm2.part_moments(call1.tile(out_rows, out_cols, fill1, keep_cache=True), ctx))
                self.step()
            call1.end_row()
        try:
            stats2 = norm2.stats_of_parts(parts, ctx)
        except Gathered:  # a pass gathering norm2's statistics stops here (`run.clip_statistics`): conv1 ran
            call1.finish()
            raise

        def fill2(view, rows2, cols2):  # conv1's outputs over the region, again, normalised into view
            norm2.act(call1.region(rows2, cols2, fill1), ctx, out=view, stats=stats2)

        def add_shortcut(view, rows2, cols2):
            part = x[..., rows2, cols2]
            view.add_(shortcut.conv5d(part, ctx) if shortcut is not None else part)

        shape1 = (x.shape[0], conv1.out_channels, call1.n_out, h, w)
        out = self.conv(conv2, ctx, shape1, x, fill2, epilogue=add_shortcut)
        call1.finish()
        return out

    def norm_stats(self, norm: Norm, x: torch.Tensor, ctx):
        """Whole-frame statistics of a norm (None for per-position norms): layer outputs are whole frames."""
        return require(norm, Norm).stats(x, ctx)

    def attention(self, attention: Attention, x: torch.Tensor, ctx) -> torch.Tensor:
        """The mid-block attention, untiled: every position attends to the whole frame."""
        return require(attention, Attention).attend(x, ctx)

    def local(self, fn, x: torch.Tensor, scale: int, halo: int) -> torch.Tensor:
        """fn(x) for a stateless, spatially local fn (radius `halo` input pixels, output `scale` x the
        input resolution, zero padding at the frame border), tile by tile with a halo."""
        b, _, t, h, w = x.shape
        rows, cols = self.spans(h * scale, w * scale, multiple=scale)
        out = None
        for oy0, oy1 in rows:
            iy0, iy1 = max(oy0 // scale - halo, 0), min(oy1 // scale + halo, h)
            for ox0, ox1 in cols:
                ix0, ix1 = max(ox0 // scale - halo, 0), min(ox1 // scale + halo, w)
                y = fn(x[..., iy0:iy1, ix0:ix1])
                if out is None:
                    out = empty_video(y, y.shape[:3] + (h * scale, w * scale))
                dy, dx = oy0 - iy0 * scale, ox0 - ix0 * scale
                out[..., oy0:oy1, ox0:ox1] = y[..., dy:dy + oy1 - oy0, dx:dx + ox1 - ox0]
                self.step()
        return out


class _ConvCall:
    """One call of a conv over new frames of `shape` (B,C,T,H,W) under exact tiles: its spatial window,
    its frames in time (`time`, an `execution.TimeWindow`) and its next cache. An offloaded cache is
    read a band of rows at a time (the rows a row of tiles reads: one read per band) and the next one
    written a row of tiles at a time; on the device the next cache is gathered whole."""

    def __init__(self, conv: Conv, ctx, shape, like: torch.Tensor, time: TimeWindow):
        self.conv, self.ctx, self.like, self.time = conv, ctx, like, time
        self.shape = tuple(shape)
        self.window = ConvWindow(conv, self.shape)
        b, c, t, h, w = self.shape
        self.banded = conv.temporal and ctx.cache.offload != "none"
        self.head = ctx.cache.get(conv) if self.time.cached and not self.banded else None
        self.n_head, self.n_tail, self.n = self.time.head, self.time.tail, self.time.total
        self.n_out, self.keep = self.time.outputs, self.time.keep
        self.input_elements = b * c * self.n * h * w
        self.next_cache = empty_video(like, (b, c, self.n - self.keep, h, w)) if conv.temporal and not self.banded else None
        self.band = self.band_rows = None  # this row of tiles' rows and its part of the next cache
        self._read = (None, None)  # (rows, head band) of the last band read
        self.last_buffer = 0

    def _head(self, rows: slice):
        """(head frames covering `rows` of the frame, rows as a slice of them)."""
        if not self.banded:
            return self.head, rows
        if self._read[0] != (rows.start, rows.stop):
            self._read = ((rows.start, rows.stop), None)  # the old band goes before the new one is read
            self._read = ((rows.start, rows.stop), self.ctx.cache.rows(self.conv, rows.start, rows.stop))
        return self._read[1], slice(0, rows.stop - rows.start)

    def _buffer(self, out_rows, out_cols, fill):
        """The input buffer of outputs out_rows x out_cols: filled, head frames written."""
        reads = self.window.reads(out_rows, out_cols)
        buf, inner, rows_in, cols_in = self.window.buffer(self.like, self.n, *reads)
        self.last_buffer = buf.numel()
        fill(inner[:, :, self.n_head:self.n - self.n_tail], rows_in, cols_in)
        head, head_rows = self._head(rows_in)
        self.conv.pad_in_time(inner, head, self.time, head_rows, cols_in)
        self.window.pad(buf, *reads)
        return buf, inner, rows_in, cols_in

    def start_row(self, out_rows) -> None:
        """A row of tiles begins: the rows it reads (halo included) and, banded, its part of the next cache."""
        (iy0, iy1), _ = self.window.reads(out_rows, (0, self.window.out_hw[1]))
        self.band_rows = slice(max(iy0, 0), min(iy1, self.shape[3]))
        if self.banded:
            b, c, _, _, w = self.shape
            self.band = empty_video(self.like, (b, c, self.n - self.keep, self.band_rows.stop - self.band_rows.start, w))

    def tile(self, out_rows, out_cols, fill, keep_cache: bool) -> torch.Tensor:
        """The conv's outputs out_rows x out_cols (B,C',n_out,rows,cols); its input region goes into the
        next cache."""
        buf, inner, rows_in, cols_in = self._buffer(out_rows, out_cols, fill)
        if keep_cache and self.band is not None:
            self.band[..., rows_in.start - self.band_rows.start:rows_in.stop - self.band_rows.start, cols_in] = \
                inner[:, :, self.keep:]
        elif keep_cache and self.next_cache is not None:
            self.next_cache[..., rows_in, cols_in] = inner[:, :, self.keep:]
        return self.conv.conv5d(buf, self.ctx, padded=False) if self.n_out else buf[:, :0]

    def region(self, rows: slice, cols: slice, fill) -> torch.Tensor:
        """The conv's outputs over rows x cols of its output frame again (from the cache this call started
        with), without touching the next cache."""
        return self.tile((rows.start, rows.stop), (cols.start, cols.stop), fill, keep_cache=False)

    def end_row(self) -> None:
        if self.band is not None:
            self.ctx.cache.put_rows(self.conv, self.band, self.band_rows.start, self.shape[3])
            self.band = None  # before the next row's band is allocated

    def finish(self) -> None:
        """The next cache replaces this call's."""
        self._read = (None, None)
        if self.banded:
            self.ctx.cache.commit(self.conv)
        elif self.next_cache is not None:
            self.ctx.cache.put(self.conv, self.next_cache, owned=True)
