"""Fast tiles: the community SeedVR2 node's semantics, cheap on memory and not exact.

The latent grid is cut into overlapping tiles (`geometry.fast_grid`: tile = size // f, overlap =
min(overlap // f, tile - 1), starts every tile - overlap, a tile that would only repeat the overlap is
skipped); every tile is encoded/decoded on its own, as a stream of its own (`engine`), and the results
are blended with separable raised-cosine ramps over interior edges only, accumulated into a
preallocated output. The mid-block attention and the norms see only their tile, hence the seams that
exact tiles (`exact_tiles.py`) do not have.
"""
from functools import lru_cache

import torch


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


def encode_fast(video, outputs, grid, factor, encode_tile, step):
    """Encode independent pixel tiles of video (B,C,T,H,W) and blend their moments into `outputs`
    (the mean, and the logvar when asked for). `encode_tile(pixels)` returns the tile's moments in
    the same order; ramps are `overlap // factor` latents long."""
    rows, cols, (ov_h, ov_w) = grid
    height, width = video.shape[-2:]
    blends = [SeparableBlend(t, rows, cols, ov_h, ov_w) for t in outputs]
    for i, (y0, y1) in enumerate(rows):
        for j, (x0, x1) in enumerate(cols):
            tile = video[..., y0 * factor:min(y1 * factor, height), x0 * factor:min(x1 * factor, width)]
            for blend, part in zip(blends, encode_tile(tile)):
                blend.add(i, j, part)
            step()
    for blend in blends:
        blend.finish()
