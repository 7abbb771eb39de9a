"""Spatial tiling of encode and decode: execution strategy, independent of the family. The grids
themselves (which tiles, how they map onto each layer) are `geometry.py`'s.

- "fast" mode: the community SeedVR2 node's semantics. The latent grid is cut into overlapping
  tiles (tile = size // f, overlap = min(overlap // f, tile - 1), starts every tile - overlap, a tile
  that would only repeat the overlap is skipped); every tile is encoded/decoded on its own and the
  results are blended with separable raised-cosine ramps over interior edges only, accumulated into a
  preallocated output. Independent tiles are cheap on memory but not exact: the mid-block attention
  and the norms see only their tile.
- "exact" mode lives in `ExactTiling`: every large convolution processes its output in tiles with a
  one-conv halo, and normalisation statistics are computed over whole frames, so the result equals
  untiled execution up to float rounding.
"""
from functools import lru_cache

import torch

from .blocks import zero_border
from .geometry import exact_cuts, layer_spans

@lru_cache(maxsize=64)
def _ramp(n: int) -> torch.Tensor:
    """Raised-cosine ramp of n samples from exactly 0 to 1 (cached, float64 on the CPU)."""
    return 0.5 - 0.5 * torch.cos(torch.pi * torch.linspace(0, 1, n, dtype=torch.float64))


def edge_weights(start: int, stop: int, length: int, ramp: int) -> torch.Tensor:
    """1-D blend weights of a tile spanning [start, stop) of `length`: ramps on interior edges only."""
    weights = torch.ones(stop - start, dtype=torch.float64)
    ov = min(ramp, stop - start - 1)
    if ov > 0:
        r = _ramp(ramp)[:ov]
        if start > 0:
            weights[:ov] = r
        if stop < length:
            weights[-ov:] = 1 - r
    return weights


class SeparableBlend:
    """Weighted accumulation of tiles into `out` (..., H, W) with separable per-tile weights.

    Tiles form a product grid of row spans x column spans, so the sum of all tile weights is itself
    the product of two 1-D sums: no full-size weight buffer is needed.
    """

    def __init__(self, out: torch.Tensor, rows: list[tuple[int, int]], cols: list[tuple[int, int]], ramp_h: int, ramp_w: int):
        self.out = out.zero_()
        height, width = out.shape[-2:]
        self.row_w = [edge_weights(a, b, height, ramp_h) for a, b in rows]
        self.col_w = [edge_weights(a, b, width, ramp_w) for a, b in cols]
        self.rows, self.cols = rows, cols
        self.row_sum = torch.zeros(height, dtype=torch.float64)
        self.col_sum = torch.zeros(width, dtype=torch.float64)
        for (a, b), w in zip(rows, self.row_w):
            self.row_sum[a:b] += w
        for (a, b), w in zip(cols, self.col_w):
            self.col_sum[a:b] += w

    def add(self, i: int, j: int, tile: torch.Tensor) -> None:
        (y0, y1), (x0, x1) = self.rows[i], self.cols[j]
        weight = (self.row_w[i][:, None] * self.col_w[j][None, :]).to(device=tile.device, dtype=torch.float32)
        self.out[..., y0:y1, x0:x1] += (tile.float() * weight).to(device=self.out.device, dtype=self.out.dtype)

    def finish(self) -> torch.Tensor:
        total = (self.row_sum[:, None] * self.col_sum[None, :]).clamp_min(1e-6)
        self.out /= total.to(device=self.out.device, dtype=self.out.dtype)
        return self.out


def decode_fast(model, z, out, grid, decode_tile, step):
    """Decode independent latent tiles of z (B,C,T,h,w) and blend them into `out` (B,C',T,H,W).

    Ramps are as long as the tiles' real overlap in pixels (latent overlap x factor), so they line
    up for any overlap (the community node ramps over the requested pixels, which matches when the
    overlap is a multiple of the factor). `decode_tile(z_tile)` returns the tile's full pixels.
    """
    rows, cols, (ov_h, ov_w) = grid
    f = model.spatial_factor * model.decode_upscale  # output pixels per latent cell
    full_h, full_w = z.shape[-2] * f, z.shape[-1] * f
    cropped = out.shape[-2:] != (full_h, full_w)
    acc = out if not cropped else out.new_empty(out.shape[:-2] + (full_h, full_w))
    blend = SeparableBlend(acc, [(a * f, b * f) for a, b in rows], [(a * f, b * f) for a, b in cols], ov_h * f, ov_w * f)
    for i, (y0, y1) in enumerate(rows):
        for j, (x0, x1) in enumerate(cols):
            blend.add(i, j, decode_tile(z[..., y0:y1, x0:x1]))
            step()
    blend.finish()
    if cropped:
        out.copy_(acc[..., : out.shape[-2], : out.shape[-1]])
    return out


def encode_fast(video, mean, logvar, grid, factor, encode_tile, step):
    """Encode independent pixel tiles of video (B,3,T,H,W) and blend their moments into mean/logvar.

    `encode_tile(pixels)` returns (mean, logvar) of one tile; ramps are `overlap // factor` latents long.
    """
    rows, cols, (ov_h, ov_w) = grid
    height, width = video.shape[-2:]
    blends = [SeparableBlend(t, rows, cols, ov_h, ov_w) for t in (mean, logvar) if t is not None]
    for i, (y0, y1) in enumerate(rows):
        for j, (x0, x1) in enumerate(cols):
            tile = video[..., y0 * factor:min(y1 * factor, height), x0 * factor:min(x1 * factor, width)]
            for blend, part in zip(blends, encode_tile(tile)):
                blend.add(i, j, part)
            step()
    for blend in blends:
        blend.finish()


class ExactTiling:
    """Exact spatial tiling: every convolution computes its output tile by tile.

    The tile grid is given at the reference resolution (the video: decode output or encode input)
    and mapped onto each layer's resolution. A low-resolution conv whose whole frame is no larger
    than the largest tile buffer used so far runs untiled (`Optimizations.whole_frame_small_convs`: a
    conv streams its weights once per call, so at low resolution, where the weights outweigh the
    activations, small tiles multiply the time, and the peak does not grow). A tile reads
    its input region plus the conv's receptive-field halo (one pixel for 3x3 kernels) and the conv
    computes exactly the tile's outputs from it, so every output pixel sees what the untiled conv
    would; zero padding applies only at the frame border. Norms that need whole-frame statistics
    (SeedVR2's per-frame GroupNorm) compute them over the whole input first, and the mid-block
    attention runs untiled at latent resolution. What exists
    per tile only: the conv's input buffer (normalised input, cached head frames) and the conv's
    working space; layer outputs are whole frames. Causal caches are stored whole-frame, unpadded.

    `step()` is called after every tile (progress and cancellation).
    """

    def __init__(self, reference_hw: tuple[int, int], tile_hw: tuple[int, int], step=None):
        (rh, rw), (th, tw) = reference_hw, tile_hw
        self.reference = (rh, rw)
        self.tile = (th, tw)
        self.row_cuts, self.col_cuts = exact_cuts(rh, th), exact_cuts(rw, tw)
        self.step = step or (lambda: None)
        self.largest_buffer = 0  # elements of the largest conv input buffer a tile has used so far

    @property
    def grid(self) -> tuple[int, int]:
        return len(self.row_cuts) + 1, len(self.col_cuts) + 1

    def spans(self, height: int, width: int, multiple: int = 1):
        """The tile grid mapped onto a layer of height x width: row spans, column spans."""
        return (layer_spans(self.row_cuts, self.reference[0], height, multiple),
                layer_spans(self.col_cuts, self.reference[1], width, multiple))

    def conv(self, conv, ctx, shape, like: torch.Tensor, fill) -> torch.Tensor:
        """A (causal) conv over new frames of `shape` (B,C,T,H,W), tile by tile.

        `conv` is a blocks.CausalConv3d or FrameConv2d, which owns the causal state (`head`,
        `write_head`, `kept_from`: the same code as its untiled path); `fill(view, rows, cols)` writes
        input rows/cols (slices of the unpadded frame) into `view`. A tile's buffer is exactly the
        input region its outputs read, [tile - halo, tile + halo), zero where it leaves the frame, and
        the conv runs on it unpadded ("valid"), so it computes nothing beyond the tile (Winograd has
        a valid mode for this: a same-padded conv of the region would also compute the halo).
        """
        b, c, t, h, w = shape
        kh, kw = conv.kernel_size[-2:]
        sh, sw = conv.stride[-2:]
        left, right, top, bottom = conv.spatial_pad
        ho, wo = (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1
        head, n_head = conv.head(ctx)
        n = n_head + t
        n_out, keep = conv.output_frames(n), conv.kept_from(n)
        out = like.new_empty((b, conv.out_channels, n_out, ho, wo))
        new_cache = like.new_empty((b, c, n - keep, h, w)) if conv.temporal else None
        rows, cols = self.spans(ho, wo)
        if ctx.opts.whole_frame_small_convs and b * c * n * h * w <= self.largest_buffer:
            rows, cols = [(0, ho)], [(0, wo)]
        for oy0, oy1 in rows:
            iy0, iy1 = oy0 * sh - top, (oy1 - 1) * sh + kh - top  # input rows the tile reads
            cy0, cy1 = max(iy0, 0), min(iy1, h)
            for ox0, ox1 in cols:
                ix0, ix1 = ox0 * sw - left, (ox1 - 1) * sw + kw - left
                cx0, cx1 = max(ix0, 0), min(ix1, w)
                buf = like.new_empty((b, c, n, iy1 - iy0, ix1 - ix0))
                zero_border(buf, (cx0 - ix0, ix1 - cx1, cy0 - iy0, iy1 - cy1))
                self.largest_buffer = max(self.largest_buffer, buf.numel())
                inner = buf[..., cy0 - iy0:cy1 - iy0, cx0 - ix0:cx1 - ix0]
                rows_in, cols_in = slice(cy0, cy1), slice(cx0, cx1)
                fill(inner[:, :, n_head:], rows_in, cols_in)
                conv.write_head(inner, head, n_head, rows_in, cols_in)
                if new_cache is not None:
                    new_cache[..., rows_in, cols_in] = inner[:, :, keep:]
                if n_out:
                    out[..., oy0:oy1, ox0:ox1] = conv.conv5d(buf, ctx, padded=False)
                self.step()
        if new_cache is not None:
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
