"""MiniMax-H3's encode and decode as core defines them: the network run on core's tiles and clips
(`tiles.py`), blended with core's weights, one clip in memory at a time.

This is the model's own function, not an execution strategy: the tiles and clips are semantic (the
decoder was trained on them). How the tiles of a clip are batched and whether the decoder's weights are
streamed (`execution.OwnTiles`, the plan's) changes only float rounding. `decoded_clips` yields each
clip's frames once they are final (the next clip blends only frames after them), so a caller may write
them out and keep one clip's frames in memory; `encoded_clips` each clip's latent frames.
`model` is a `network.MiniMaxH3VAE` (its `encode_tiles`, `decode_tile_batches` and pixel conventions).
"""
from collections.abc import Callable, Iterator

import torch

from ..execution import ClipWork, OwnTiles
from .tiles import TileGrid, decode_plan, encode_plan

Step = Callable[[], None] | None  # one batch of tiles done (the run's progress and cancellation), or None
# Runs one clip's work of so many tiles: as the run's `OwnTiles` say, again with fewer after running out of
# memory (`execution.RunState.own_tile_clip`), or `as_given`.
ClipRun = Callable[[ClipWork, int], torch.Tensor]


def as_given(own: OwnTiles) -> ClipRun:
    """Every clip's work run with `own`."""
    return lambda work, tiles: work(own)


def tile_weights(grid: TileGrid, i: int, j: int) -> torch.Tensor:
    """Tile (i, j)'s blend weights over its own extent, rows x cols, float32 (tiles.py: W_k)."""
    rows, cols = grid.rows, grid.cols
    own_y = torch.tensor(rows.own(i)) + torch.tensor(rows.tail(i))
    return torch.outer(own_y, torch.tensor(cols.own(j))) + torch.outer(torch.tensor(rows.kept(i)), torch.tensor(cols.tail(j)))


def _blend_tiles(run: Callable[[Iterator[torch.Tensor]], Iterator[torch.Tensor]], x: torch.Tensor, grid_in: TileGrid,
                 grid_out: TileGrid, batch: int, step: Step) -> torch.Tensor:
    """sum_k W_k run(tile k of x): x B,C,T,H,W cut by `grid_in` into batches of `batch` tiles (0: all), `run`
    taking the batches in order (each len(batch)*B,C,T,tile rows,tile cols, made as it asks for them) and
    yielding their outputs in order, placed and weighted by `grid_out` (the same tiles in the output's units):
    float32 B,C',T',H',W'. `step()` after each batch placed (progress, cancellation), where given."""
    b, tiles = x.shape[0], grid_in.tiles
    size = batch or len(tiles)
    groups = [tiles[first:first + size] for first in range(0, len(tiles), size)]
    rows_in, cols_in = grid_in.rows, grid_in.cols
    cuts = (torch.cat([x[..., rows_in.starts[i]:rows_in.starts[i] + rows_in.size,
                         cols_in.starts[j]:cols_in.starts[j] + cols_in.size] for i, j in group]) for group in groups)
    canvas = None
    for group, out in zip(groups, run(cuts)):  # out: len(group)*B,C',T',tile rows,tile cols
        if canvas is None:
            canvas = out.new_zeros(b, *out.shape[1:3], grid_out.rows.length, grid_out.cols.length, dtype=torch.float32)
        for k, (i, j) in enumerate(group):
            y, x0 = grid_out.rows.starts[i], grid_out.cols.starts[j]
            region = canvas[..., y:y + grid_out.rows.size, x0:x0 + grid_out.cols.size]
            region += out[k * b:(k + 1) * b].float() * tile_weights(grid_out, i, j).to(canvas.device)
        if step is not None:
            step()
    return canvas


def decoded_clips(model, z: torch.Tensor, run_clip: ClipRun = as_given(OwnTiles()),
                  step: Step = None) -> Iterator[torch.Tensor]:
    """Raw latent B,24,T',h,w -> pixels B,3,n,16h,16w in [-1, 1] (float32), clip by clip in frame order:
    each clip's frames once the next clip can no longer change them. `run_clip` runs each clip's tiles as an
    `OwnTiles` says: tiles of a clip decoded together, and whether the transformer blocks' weights are
    streamed (`network.decode_tile_batches`); `step()` after each batch of tiles."""
    cfg = model.config
    plan = decode_plan(z.shape[2], cfg)
    grid = TileGrid.of(z.shape[3] * cfg.spatial_factor, z.shape[4] * cfg.spatial_factor, cfg)
    z = torch.cat([z, z[:, :, -1:].expand(-1, -1, plan.padded_frames - z.shape[2], -1, -1)], dim=2)
    carry = None  # the previous clip's weighted frames not final yet, from this clip's out_start on
    for c, clip in enumerate(plan.clips):
        if not clip.raw_frames:
            continue
        frames = list(clip.raw_frames)
        tokens = z[:, :, clip.token_start:clip.token_start + clip.tokens]
        part = run_clip(lambda own: _blend_tiles(
            lambda batches: (y[:, :, frames] for y in model.decode_tile_batches(batches, own)), tokens, grid.latent(),
            grid, own.batch, step), len(grid.tiles))
        part *= torch.tensor(clip.weights, device=part.device).view(1, 1, -1, 1, 1)  # B,3,n,H,W
        if carry is not None:
            part[:, :, :carry.shape[2]] += carry
        done = plan.final_after(c) - clip.out_start
        yield model.finish_pixels(part[:, :, :done])
        carry = part[:, :, done:].clone()  # not a view: the clip's canvas goes before the next clip's
        del part


def decode(model, z: torch.Tensor, own: OwnTiles = OwnTiles()) -> torch.Tensor:
    """Raw latent B,24,T',h,w -> pixels B,3,T,16h,16w in [-1, 1], float32 (T: core's frame count)."""
    return torch.cat(list(decoded_clips(model, z, as_given(own))), dim=2)


def encoded_clips(model, x: torch.Tensor, run_clip: ClipRun = as_given(OwnTiles()),
                  step: Step = None) -> Iterator[torch.Tensor]:
    """Pixels B,3,T,H,W in [-1, 1] (H, W multiples of 16) -> the posterior's moments (raw mean, then logvar)
    B,2*24,t,H/16,W/16, float32 (core keeps the mean), clip by clip in frame order (clips are independent);
    `run_clip` runs each clip as an `OwnTiles` says: its `batch` tiles of a clip encoded together (the encoder
    streams no weights); `step()` after each batch."""
    cfg = model.config
    plan = encode_plan(x.shape[2], cfg)
    grid = TileGrid.of(x.shape[3], x.shape[4], cfg)
    for c in range(plan.clips):
        clip = model.normalize_pixels(x[:, :, plan.clip_frames(c)])
        latent = run_clip(lambda own: _blend_tiles(lambda batches: map(model.encode_tiles, batches), clip, grid,
                                                   grid.latent(), own.batch, step), len(grid.tiles))
        yield latent[:, :, :plan.clip_tokens(c)]


def encode(model, x: torch.Tensor, own: OwnTiles = OwnTiles()) -> torch.Tensor:
    """`encoded_clips`, concatenated: moments B,2*24,T',H/16,W/16."""
    return torch.cat(list(encoded_clips(model, x, as_given(own))), dim=2)
