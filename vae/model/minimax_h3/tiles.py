"""MiniMax-H3's own tiles and clips, as core 0.33.0 computes them (`MiniMaxH3VideoVAE.split_tiles`,
`blend`, `tiled_decode`, `tiled_encode`, `decode_temporal`, `encode_temporal`): a pure geometry of sizes,
positions and blend weights, no tensors. The decoder was trained on these tiles and clips, so they
define the model's output (an untiled decode is another, worse, function).

Spatial. An axis of `length` px is cut into tiles of `tile_size` px (one tile of the whole axis when it is
no longer) overlapping by at least `tile_overlap_min`, the slack spread over the overlaps one latent cell
at a time. Core blends each tile with the *raw* (unblended) tile above it over their overlap rows, then
with the raw tile to its left over the overlap columns (full height), keeps its rows and columns before
the next tiles' overlaps and writes them. That is a sum of raw tiles times fixed weights: the canvas is
sum_k W_k R_k, with, on tile k's own extent (`TileAxis.own`, `tail`, `kept`, per axis),

    W_k = outer(own_y + tail_y, own_x) + outer(kept_y, tail_x)

kept: 1 where core writes the tile (before the next tile's overlap), else 0; own: kept times the ramp
p/e over the leading overlap (p = 0..e-1); tail: 1 - p/e over the trailing overlap where the next tile
is written, else 0. The weights of every pixel sum to 1. A tile's contribution can therefore be added
the moment it is decoded, in any order, and any set of tiles decoded together.

Temporal (decode). The latent is padded at its end with copies of its last frame; clip c decodes
latent frames [c*5, c*5 + 7) (`chunk_tokens` + `overlap_tokens`) to 28 frames, of which it keeps
[3, 20) (the first 3 stand for the encoder's pre-padding) and [23, 28), which (but for the last clip's)
are blended linearly with the first 5 kept frames of the next clip (weights 1 - p/5 and p/5). Output frame
positions are contiguous per clip (`DecodeClip`); frames before the next clip's first position are final
once the clip is blended (`DecodePlan.final_after`), so clips stream out with one clip in memory.
One latent frame decodes to the last of its 4 frames.

Temporal (encode). Clips of 17 frames (the last one completed with copies of the last frame) are encoded
independently, 5 latent frames each, and the last `token_drop` latent frames are dropped. A single
frame is encoded alone to one latent frame.
"""
import math
from dataclasses import dataclass

from .config import MiniMaxH3Config


@dataclass(frozen=True)
class TileAxis:
    """One axis of core's tile grid: `length` cut into tiles of `size` at `starts`, tile i overlapping tile
    i + 1 by `overlaps[i]` (units: pixels, or latent cells after `scaled`)."""

    length: int
    size: int
    starts: tuple[int, ...]
    overlaps: tuple[int, ...]

    def scaled(self, cell: int) -> "TileAxis":
        """The same tiles in units of `cell` (pixels -> latent cells)."""
        return TileAxis(self.length // cell, self.size // cell, tuple(s // cell for s in self.starts),
                        tuple(o // cell for o in self.overlaps))

    def _lead(self, i: int) -> int:
        return self.overlaps[i - 1] if i > 0 else 0

    def _trail(self, i: int) -> int:
        return self.overlaps[i] if i < len(self.overlaps) else 0

    def kept(self, i: int) -> list[float]:
        """1 where core writes tile i (before the next tile's overlap), else 0."""
        trail = self._trail(i)
        return [1.0] * (self.size - trail) + [0.0] * trail

    def own(self, i: int) -> list[float]:
        """Tile i's weight where core writes it: p/e over the leading overlap, then 1 (an overlap may be
        longer than half a tile: the ramp then ends where the next tile's overlap begins)."""
        lead = self._lead(i)
        return [(p / lead if p < lead else 1.0) * keep for p, keep in enumerate(self.kept(i))]

    def tail(self, i: int) -> list[float]:
        """Tile i's weight where the next tile blends it in (its trailing overlap): 1 - p/e, where the
        next tile is written."""
        trail = self._trail(i)
        after = self.kept(i + 1) if trail else []
        return [0.0] * (self.size - trail) + [(1 - p / trail) * after[p] for p in range(trail)]


def split_axis(length: int, tile: int, overlap_min: int, cell: int) -> TileAxis:
    """Core's `split_tiles`: the fewest tiles of `tile` px covering `length` px with overlaps of at least
    `overlap_min`, the slack added to the overlaps `cell` px at a time, round robin. `length` must be a
    whole number of cells (core's tiles would otherwise overrun the frame)."""
    if length % cell:
        raise ValueError(f"{length} px is not a multiple of the {cell} px latent cell: crop the frames to "
                         f"multiples of {cell} (core's VAE Encode crops them)")
    if tile >= length:
        return TileAxis(length, length, (0,), ())
    count = math.ceil(length / tile)
    while tile * count - overlap_min * (count - 1) < length:
        count += 1
    overlaps = [overlap_min] * (count - 1)
    for i in range((tile * count - overlap_min * (count - 1) - length) // cell):
        overlaps[i % (count - 1)] += cell
    starts = [0]
    for overlap in overlaps:
        starts.append(starts[-1] + tile - overlap)
    return TileAxis(length, tile, tuple(starts), tuple(overlaps))


@dataclass(frozen=True)
class TileGrid:
    """Core's tiles of a frame: rows x cols, in pixels (`cell` px per latent cell), or in latent cells
    (`latent`, `cell` 1)."""

    rows: TileAxis
    cols: TileAxis
    cell: int

    @classmethod
    def of(cls, height: int, width: int, cfg: MiniMaxH3Config) -> "TileGrid":
        """The grid core cuts a `height` x `width` px frame into."""
        axes = (split_axis(n, cfg.tile_size, cfg.tile_overlap_min, cfg.spatial_factor) for n in (height, width))
        return cls(*axes, cfg.spatial_factor)

    @property
    def tiles(self) -> list[tuple[int, int]]:
        """(row, col) of every tile, row-major."""
        return [(i, j) for i in range(len(self.rows.starts)) for j in range(len(self.cols.starts))]

    def latent(self) -> "TileGrid":
        return TileGrid(self.rows.scaled(self.cell), self.cols.scaled(self.cell), 1)


@dataclass(frozen=True)
class DecodeClip:
    """One clip of a decode: latent frames [token_start, token_start + tokens) of the padded latent; of
    its decoded frames, `raw_frames` (in order) go to output frames out_start, out_start + 1, ... with
    `weights` (the temporal blend)."""

    token_start: int
    tokens: int
    raw_frames: tuple[int, ...]
    out_start: int
    weights: tuple[float, ...]


@dataclass(frozen=True)
class DecodePlan:
    """Core's temporal plan of decoding `latent_frames` latent frames to `frames` frames."""

    latent_frames: int
    padded_frames: int  # after the copies of the last latent frame
    frames: int  # core's `decode_output_shape`
    clips: tuple[DecodeClip, ...]

    def final_after(self, c: int) -> int:
        """Output frames [0, n) are final once clip c is blended in."""
        return min(self.clips[c + 1].out_start, self.frames) if c + 1 < len(self.clips) else self.frames


def _clip_constants(cfg: MiniMaxH3Config) -> tuple[int, int, int, int]:
    """(chunk_tokens, pre_padding, overlap_tokens, overlap_frames) of core's clips: 5, 3, 2, 5."""
    tf = cfg.temporal_factor
    chunk_tokens = math.ceil(cfg.clip_length / tf)
    pre_padding = (-cfg.clip_length) % tf
    overlap_tokens = (-cfg.token_drop) % chunk_tokens
    return chunk_tokens, pre_padding, overlap_tokens, max(overlap_tokens * tf - pre_padding, 0)


def _output_frames(cfg: MiniMaxH3Config, latent_frames: int, pad: int, parts: list[tuple[int, int]]) -> int:
    """Core's `decode_output_shape` frames: the parts written, less the frames of the padding tokens."""
    tf, chunk_tokens = cfg.temporal_factor, _clip_constants(cfg)[0]
    tail = cfg.clip_length % tf
    pad_frames = sum(tail if tail and (latent_frames + k) % chunk_tokens == 0 else tf for k in range(pad))
    return sum(p0 for p0, _ in parts) + parts[-1][1] - pad_frames


def decode_plan(latent_frames: int, cfg: MiniMaxH3Config) -> DecodePlan:
    """Which latent frames each clip decodes, which of its frames go where with what weight."""
    tf = cfg.temporal_factor
    if latent_frames == 1:
        return DecodePlan(1, 1, 1, (DecodeClip(0, 1, (tf - 1,), 0, (1.0,)),))
    chunk_tokens, pre, overlap_tokens, blend = _clip_constants(cfg)
    pad = (-(latent_frames + cfg.token_drop)) % chunk_tokens
    count = (latent_frames + cfg.token_drop + pad) // chunk_tokens - int(cfg.token_drop > 0)
    if count < 1:  # too few latent frames for one clip: core pads a whole clip more
        pad, count = pad + chunk_tokens, count + 1
    padded = latent_frames + pad
    chunk_frames = chunk_tokens * tf
    spans, parts = [], []  # per clip: its token span; (kept frames of part 0, frames of part 1)
    for c in range(count):
        start = c * chunk_tokens
        tokens = min(start + chunk_tokens + overlap_tokens, padded) - start
        raw = tokens * tf
        parts.append((max(min(chunk_frames, raw) - pre, 0),
                      max(min(2 * chunk_frames, raw) - chunk_frames - pre, 0) if cfg.token_drop > 0 else 0))
        spans.append((start, tokens))
    frames = _output_frames(cfg, latent_frames, pad, parts)
    clips, out = [], 0
    for c, ((start, tokens), (first, second)) in enumerate(zip(spans, parts)):
        head = min(parts[c - 1][1], first, blend) if c > 0 else 0  # blended with the previous clip's tail
        weights = [p / head for p in range(head)] + [1.0] * (first - head)
        raw = list(range(pre, pre + first))
        if c + 1 < count:  # core blends the last `e` frames of the tail into the next clip's head
            e = min(second, parts[c + 1][0], blend)
            raw += list(range(chunk_frames + pre + second - e, chunk_frames + pre + second))
            weights += [1 - p / e for p in range(e)]
        else:
            raw += list(range(chunk_frames + pre, chunk_frames + pre + second))
            weights += [1.0] * second
        keep = max(0, min(len(raw), frames - out))  # core writes no frame past `frames`
        clips.append(DecodeClip(start, tokens, tuple(raw[:keep]), out, tuple(weights[:keep])))
        out += first
    return DecodePlan(latent_frames, padded, frames, tuple(clips))


@dataclass(frozen=True)
class EncodePlan:
    """Core's temporal plan of encoding `frames` frames: clip c encodes `clip_frames(c)` (input frame
    indices, the last frame repeated past the end) to `clip_tokens(c)` latent frames, concatenated."""

    frames: int
    clip_length: int
    tokens_per_clip: int
    clips: int
    latent_frames: int
    temporal_factor: int

    def clip_tokens(self, c: int) -> int:
        """Latent frames of clip c that are kept (the last clip loses `token_drop`)."""
        return min(self.tokens_per_clip, self.latent_frames - c * self.tokens_per_clip)

    def clip_frames(self, c: int) -> list[int]:
        """The frames clip c encodes. The encoder is causal (latent frame k reads frames <= 4k of its clip),
        so the last clip stops at the last frame its kept latent frames read."""
        last = c == self.clips - 1
        length = (self.clip_tokens(c) - 1) * self.temporal_factor + 1 if last else self.clip_length
        return [min(c * self.clip_length + f, self.frames - 1) for f in range(length)]


def encode_plan(frames: int, cfg: MiniMaxH3Config) -> EncodePlan:
    tf = cfg.temporal_factor
    if frames == 1:
        return EncodePlan(1, 1, 1, 1, 1, tf)
    tokens = (cfg.clip_length - 1) // tf + 1  # the causal encoder's latent frames of one clip
    clips = math.ceil(frames / cfg.clip_length)
    return EncodePlan(frames, cfg.clip_length, tokens, clips, clips * tokens - cfg.token_drop, tf)
