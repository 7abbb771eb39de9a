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
"""
import torch

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

    def __init__(self, reference_hw: tuple[int, int], tile_hw: tuple[int, int], step):
        (rh, rw), (th, tw) = reference_hw, tile_hw
        self.reference = (rh, rw)
        self.row_cuts, self.col_cuts = exact_cuts(rh, th), exact_cuts(rw, tw)
        self.step = step
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

    def conv(self, conv, ctx, shape, like: torch.Tensor, fill) -> torch.Tensor:
        """A (causal) conv over new frames of `shape` (B,C,T,H,W), tile by tile.

        `conv` (a blocks.CausalConv3d or FrameConv2d) owns the causal state (`head`, `write_head`,
        `kept_from`: the same code as its untiled path); `fill(view, rows, cols)` writes input rows/cols
        (slices of the unpadded frame) into `view`. A tile's buffer is exactly the input region its
        outputs read, and the conv runs on it unpadded, so it computes nothing beyond the tile (Winograd
        has a valid mode for this: a same-padded conv of the region would also compute the halo).
        """
        b, c, t, h, w = shape
        window = ConvWindow(conv, tuple(shape))
        ho, wo = window.out_hw
        banded = conv.temporal and ctx.cache.offload != "none"  # the cache read and written by bands of rows
        head, n_head = (None, conv.head_count(ctx)) if banded else conv.head(ctx)
        n = n_head + t
        n_out, keep = conv.output_frames(n), conv.kept_from(n)
        out = like.new_empty((b, conv.out_channels, n_out, ho, wo))
        new_cache = like.new_empty((b, c, n - keep, h, w)) if conv.temporal and not banded else None
        rows, cols = self.spans(ho, wo)
        if ctx.opts.whole_frame_small_convs and b * c * n * h * w <= self.largest_buffer:
            rows, cols = [(0, ho)], [(0, wo)]
        for i, out_rows in enumerate(rows):
            (iy0, iy1), _ = window.reads(out_rows, (0, wo))
            band_rows = slice(max(iy0, 0), min(iy1, h))  # the input rows this row of tiles reads
            if banded:
                head = ctx.cache.rows(conv, band_rows.start, band_rows.stop)  # B,C,n_head,band,W
                new_cache = like.new_empty((b, c, n - keep, band_rows.stop - band_rows.start, w))
            for out_cols in cols:
                buf, inner, rows_in, cols_in = window.buffer(like, n, *window.reads(out_rows, out_cols))
                self.largest_buffer = max(self.largest_buffer, buf.numel())
                fill(inner[:, :, n_head:], rows_in, cols_in)
                in_band = slice(0, band_rows.stop - band_rows.start) if banded else rows_in
                conv.write_head(inner, head, n_head, in_band, cols_in)
                if new_cache is not None:
                    new_cache[..., in_band, cols_in] = inner[:, :, keep:]
                if n_out:
                    out[..., slice(*out_rows), slice(*out_cols)] = conv.conv5d(buf, ctx, padded=False)
                self.step()
            if banded:
                ctx.cache.put_rows(conv, new_cache, band_rows.start, h)
                head = new_cache = None  # before the next row's bands are read and allocated
        if banded:
            ctx.cache.commit(conv)
        elif new_cache is not None:
            ctx.cache.put(conv, new_cache, owned=True)
        return out

    def norm_stats(self, norm, x: torch.Tensor, ctx):
        """Whole-frame statistics of a norm (None for per-position norms): layer outputs are whole frames."""
        return norm.stats(x, ctx)

    def attention(self, attention, x: torch.Tensor, ctx) -> torch.Tensor:
        """The mid-block attention, untiled: every position attends to the whole frame."""
        return attention.attend(x, ctx)

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
                    out = y.new_empty(y.shape[:3] + (h * scale, w * scale))
                dy, dx = oy0 - iy0 * scale, ox0 - ix0 * scale
                out[..., oy0:oy1, ox0:ox1] = y[..., dy:dy + oy1 - oy0, dx:dx + ox1 - ox0]
                self.step()
        return out
