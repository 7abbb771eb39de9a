"""MiniMax-H3's encode and decode as core defines them: the network run on core's tiles and clips
(`tiles.py`), blended with core's weights, one clip in memory at a time.

This is the model's own function, not an execution strategy: the tiles and clips are semantic (the
decoder was trained on them). How the tiles of a clip are batched (`tiles_per_batch`) changes only
float rounding. `decoded_clips` yields each clip's frames once they are final (the next clip blends
only frames after them), so a caller may write them out and keep one clip's frames in memory.
`model` is a `network.MiniMaxH3VAE` (its `encode_tiles`, `decode_tiles` and pixel conventions); its stages
call `encode` and `decode` on the whole clip.
"""
from collections.abc import Callable, Iterator

import torch

from .tiles import TileGrid, decode_plan, encode_plan


def tile_weights(grid: TileGrid, i: int, j: int) -> torch.Tensor:
    """Tile (i, j)'s blend weights over its own extent, rows x cols, float32 (tiles.py: W_k)."""
    rows, cols = grid.rows, grid.cols
    own_y = torch.tensor(rows.own(i)) + torch.tensor(rows.tail(i))
    return torch.outer(own_y, torch.tensor(cols.own(j))) + torch.outer(torch.tensor(rows.kept(i)), torch.tensor(cols.tail(j)))


def _blend_tiles(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grid_in: TileGrid, grid_out: TileGrid,
                 tiles_per_batch: int) -> torch.Tensor:
    """sum_k W_k run(tile k of x): x B,C,T,H,W cut by `grid_in`, `run`'s outputs placed and weighted by
    `grid_out` (the same tiles in the output's units), float32 B,C',T',H',W'."""
    b, tiles = x.shape[0], grid_in.tiles
    step, canvas = tiles_per_batch or len(tiles), None
    for first in range(0, len(tiles), step):
        group = tiles[first:first + step]
        cut = [x[..., grid_in.rows.starts[i]:grid_in.rows.starts[i] + grid_in.rows.size,
                 grid_in.cols.starts[j]:grid_in.cols.starts[j] + grid_in.cols.size] for i, j in group]
        out = run(torch.cat(cut))  # len(group)*B,C',T',tile rows,tile cols
        if canvas is None:
            canvas = out.new_zeros(b, *out.shape[1:3], grid_out.rows.length, grid_out.cols.length, dtype=torch.float32)
        for k, (i, j) in enumerate(group):
            y, x0 = grid_out.rows.starts[i], grid_out.cols.starts[j]
            region = canvas[..., y:y + grid_out.rows.size, x0:x0 + grid_out.cols.size]
            region += out[k * b:(k + 1) * b].float() * tile_weights(grid_out, i, j).to(canvas.device)
    return canvas


def decoded_clips(model, z: torch.Tensor, tiles_per_batch: int = 0) -> Iterator[torch.Tensor]:
    """Raw latent B,24,T',h,w -> pixels B,3,n,16h,16w in [-1, 1] (float32), clip by clip in frame order:
    each clip's frames once the next clip can no longer change them. `tiles_per_batch`: tiles of a clip
    decoded together (0: all)."""
    cfg = model.config
    plan = decode_plan(z.shape[2], cfg)
    grid = TileGrid.of(z.shape[3] * cfg.spatial_factor, z.shape[4] * cfg.spatial_factor, cfg)
    z = torch.cat([z, z[:, :, -1:].expand(-1, -1, plan.padded_frames - z.shape[2], -1, -1)], dim=2)
    carry = None  # the previous clip's weighted frames not final yet, from this clip's out_start on
    for c, clip in enumerate(plan.clips):
        if not clip.raw_frames:
            continue
        frames = list(clip.raw_frames)
        part = _blend_tiles(lambda tiles: model.decode_tiles(tiles)[:, :, frames],
                            z[:, :, clip.token_start:clip.token_start + clip.tokens], grid.latent(), grid, tiles_per_batch)
        part *= torch.tensor(clip.weights, device=part.device).view(1, 1, -1, 1, 1)  # B,3,n,H,W
        if carry is not None:
            part[:, :, :carry.shape[2]] += carry
        done = plan.final_after(c) - clip.out_start
        yield model.finish_pixels(part[:, :, :done])
        carry = part[:, :, done:]


def decode(model, z: torch.Tensor, tiles_per_batch: int = 0) -> torch.Tensor:
    """Raw latent B,24,T',h,w -> pixels B,3,T,16h,16w in [-1, 1], float32 (T: core's frame count)."""
    return torch.cat(list(decoded_clips(model, z, tiles_per_batch)), dim=2)


def encode(model, x: torch.Tensor, tiles_per_batch: int = 0) -> torch.Tensor:
    """Pixels B,3,T,H,W in [-1, 1] (H, W multiples of 16) -> the posterior's moments (raw mean, then logvar)
    B,2*24,T',H/16,W/16, float32 (core keeps the mean)."""
    cfg = model.config
    plan = encode_plan(x.shape[2], cfg)
    grid = TileGrid.of(x.shape[3], x.shape[4], cfg)
    parts = []
    for c in range(plan.clips):
        clip = model.normalize_pixels(x[:, :, plan.clip_frames(c)])
        latent = _blend_tiles(model.encode_tiles, clip, grid, grid.latent(), tiles_per_batch)
        parts.append(latent[:, :, :plan.clip_tokens(c)])
    return torch.cat(parts, dim=2)
