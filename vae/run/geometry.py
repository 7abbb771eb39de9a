"""Frames, latent sizes and tiles: the arithmetic that the nodes, the web preview, the plan, the
engine and out-of-memory recovery share, so that each rule has one home.

Frames: pixel frames and latent frames correspond as 0 <-> 0 and latent i <-> pixels 4i-3..4i
(temporal factor 4), so a clip of T pixel frames is padded to the next 4n+1 and has (T-1)/4 + 1
latent frames. Sizes: a frame is padded to a multiple of the spatial factor f (8; 16 for Wan2.2).
A run derives these once from its input shape, as a `Clip`, which its plan carries.

Tiles are given in pixels of the video side (decode output, encode input), an int or an (h, w) pair.
Exact tiles cut every layer along the same grid (`exact_cuts`, mapped per layer by `layer_spans`);
fast tiles are overlapping latent tiles blended afterwards (`fast_grid`). One rule says which tiles
are valid (`tiling_error`): at least MIN_TILE_CELLS latent cells a side, and, for fast tiles (the only
ones that use it), an overlap smaller than the tile.
"""
from dataclasses import dataclass

TILING_MODES = ("exact", "fast")
# The smallest tile, in latent cells a side. Smaller exact tiles cost far more time than they save
# (each conv's halo becomes most of the tile); fast tiles of fewer cells are mostly overlap.
MIN_TILE_CELLS = 2
# The spatial factor of the family with the smallest latent cells: what a check that does not know
# the family yet (a node's inputs when the prompt is queued) must accept.
SMALLEST_SPATIAL_FACTOR = 8

Pair = tuple[int, int]


# --- frames ------------------------------------------------------------------------------------------

def latent_frames(num_frames: int, temporal_factor: int = 4) -> int:
    """Latent frames for `num_frames` pixel frames (after padding to the next 4n+1)."""
    return (num_frames - 1 + temporal_factor - 1) // temporal_factor + 1


def pixel_frames(num_latent: int, temporal_factor: int = 4) -> int:
    """Pixel frames that `num_latent` latent frames decode to (4n+1)."""
    return temporal_factor * (num_latent - 1) + 1


def pixel_span(first: int, count: int, temporal_factor: int = 4) -> tuple[int, int]:
    """Pixel-frame range [start, stop) of latent frames [first, first + count)."""
    start = 0 if first == 0 else temporal_factor * (first - 1) + 1
    return start, temporal_factor * (first + count - 1) + 1


def is_4n1(frames: int) -> bool:
    return frames >= 1 and (frames - 1) % 4 == 0


def padded(size: int, factor: int) -> int:
    """`size` pixels rounded up to whole latent cells of `factor` pixels."""
    return -(-size // factor) * factor


@dataclass(frozen=True)
class Clip:
    """The frames and sizes of one encode/decode, derived once from its engine input (encode: pixels
    B,3,T,H,W; decode: a latent B,C,T',h,w) and carried by its plan, so nothing derives them again."""

    op: str
    batch: int
    frames: int         # pixel frames: the encode input's T (before 4n+1 padding), or what a decode makes
    latent_frames: int  # (a network with its own frame rule replaces them: `planning.clip_of`)
    height: int         # video rows and columns, padded to whole latent cells
    width: int
    spatial_factor: int
    temporal_factor: int

    @classmethod
    def of(cls, op: str, input_shape, spatial_factor: int, temporal_factor: int = 4) -> "Clip":
        b, _, t, h, w = input_shape
        if op == "decode":
            return cls(op, b, pixel_frames(t, temporal_factor), t, h * spatial_factor, w * spatial_factor,
                       spatial_factor, temporal_factor)
        return cls(op, b, t, latent_frames(t, temporal_factor), padded(h, spatial_factor), padded(w, spatial_factor),
                   spatial_factor, temporal_factor)

    @property
    def latent_hw(self) -> Pair:
        return self.height // self.spatial_factor, self.width // self.spatial_factor

    def chunks(self, temporal_chunk: int) -> int:
        """Steps of `temporal_chunk` latent frames over the clip."""
        return -(-self.latent_frames // temporal_chunk)


def input_shape(op: str, frames: int, height: int, width: int, latent_channels: int, spatial_factor: int,
                temporal_factor: int = 4, batch: int = 1) -> tuple[int, int, int, int, int]:
    """The engine input for a clip of `frames` pixel frames of height x width: the pixels B,3,T,H,W
    (encode) or the latent B,C,T',h,w they encode to (decode)."""
    if op == "encode":
        return batch, 3, frames, height, width
    return (batch, latent_channels, latent_frames(frames, temporal_factor), -(-height // spatial_factor),
            -(-width // spatial_factor))


# --- tiles -------------------------------------------------------------------------------------------

def as_pair(value) -> Pair:
    """An int or an (h, w) pair of pixels -> (h, w)."""
    if isinstance(value, int):
        return value, value
    h, w = value
    return int(h), int(w)


def min_tile(spatial_factor: int) -> int:
    """The smallest valid tile edge in pixels for a family with this spatial factor."""
    return MIN_TILE_CELLS * spatial_factor


def tiling_error(tile_size, tile_overlap=0, tiling: str = "exact", spatial_factor: int = SMALLEST_SPATIAL_FACTOR) -> str | None:
    """Why these tile settings are not valid (a message saying what to do), or None. `tile_size` None
    (or 0) means untiled. Without the family's `spatial_factor` the smallest one is assumed."""
    if tiling not in TILING_MODES:
        return f"tiling must be one of {TILING_MODES}, got {tiling!r}"
    if not tile_size:
        return None
    size, overlap = as_pair(tile_size), as_pair(tile_overlap or 0)
    smallest = min_tile(spatial_factor)
    if min(size) < smallest:
        return (f"tile_size {tile_size!r} is below {smallest} px ({MIN_TILE_CELLS} latent cells of {spatial_factor} px): "
                f"use a larger tile (256-512 px is typical), or none for no tiling")
    if tiling == "exact":  # exact tiles share every halo with their neighbours: the overlap is not used
        return None
    if min(overlap) < 0 or overlap[0] >= size[0] or overlap[1] >= size[1]:
        return (f"tile_overlap {tile_overlap!r} must be smaller than tile_size {tile_size!r} (and not negative) with "
                f"fast tiling: a quarter of the tile is typical (exact tiling does not use it)")
    return None


def exact_cuts(reference: int, tile: int) -> list[int]:
    """Interior cut positions of an exact tile grid along one axis of `reference` pixels."""
    return list(range(tile, reference, tile))


def layer_spans(cuts: list[int], reference: int, size: int, multiple: int = 1) -> list[tuple[int, int]]:
    """The exact grid's cuts (given at the reference resolution) mapped onto a layer of `size` cells,
    rounded to a multiple of `multiple`, as [start, stop) spans covering the layer."""
    mapped = sorted({c for c in (round(c * size / reference / multiple) * multiple for c in cuts) if 0 < c < size})
    edges = [0, *mapped, size]
    return list(zip(edges, edges[1:]))


def tile_spans(length: int, tile: int, overlap: int) -> list[tuple[int, int]]:
    """Overlapping [start, stop) spans covering `length` cells, fast-mode grid.

    Starts are 0, s, 2s, ... with s = tile - overlap; a span past the first whose extent would be no
    larger than the overlap is skipped, because the previous span already covers it.
    """
    stride = tile - overlap
    spans = []
    for start in range(0, length, stride):
        stop = min(start + tile, length)
        if spans and stop - start <= overlap:
            continue
        spans.append((start, stop))
    return spans


def fast_grid(latent_h: int, latent_w: int, tile_size, tile_overlap, factor: int):
    """Fast-mode latent (row spans, column spans, (overlap h, overlap w)) for pixel tile settings, or
    None when one tile covers the frame."""
    (th, tw), (oh, ow) = as_pair(tile_size), as_pair(tile_overlap)
    tile_h, tile_w = max(1, th // factor), max(1, tw // factor)
    if latent_h <= tile_h and latent_w <= tile_w:
        return None
    ov_h, ov_w = min(oh // factor, tile_h - 1), min(ow // factor, tile_w - 1)
    return tile_spans(latent_h, tile_h, ov_h), tile_spans(latent_w, tile_w, ov_w), (ov_h, ov_w)


def tile_grid(height: int, width: int, tile_size, tile_overlap, tiling: str, factor: int) -> tuple[int, int]:
    """Rows and columns of tiles over a frame of height x width pixels ((1, 1) untiled)."""
    if not tile_size:
        return 1, 1
    if tiling == "fast":
        grid = fast_grid(height // factor, width // factor, tile_size, tile_overlap, factor)
        return (len(grid[0]), len(grid[1])) if grid else (1, 1)
    th, tw = as_pair(tile_size)
    return -(-height // th), -(-width // tw)
