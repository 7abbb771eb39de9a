"""Execution strategies: how the layers of one chunk cover the frame, and which part of it this process runs.

A family's blocks never loop over tiles or talk to other processes themselves. Every causal conv, norm,
attention and upsampler asks its run's `RunContext.execution`: None runs whole frames in one call
(the blocks' own path); otherwise an `Execution` that computes the same numbers another way:

- `ExactTiles` (exact_tiles.py): every conv computes its output tile by tile, each from its input
  region plus the receptive-field halo; layer outputs stay whole frames on the device.
- `RowBands` (row_bands.py): every layer exists only as this process's band of rows; halo rows come
  from the ranks that own them over torch.distributed.

The engine (`engine.py`) runs a clip through one loop whatever the strategy. Which part of every frame
this process computes, and how the parts come together, is its `Partition`: `WHOLE_FRAME` in one
process, or `RowBands` across the ranks of a group. Fast tiles (`fast_tiles.py`) are not an execution
of the layers: they are independent runs on overlapping tiles, blended afterwards.

The window arithmetic every strategy shares (which input region a conv's output region reads, and its
buffer) is `ConvWindow` below.
"""
from dataclasses import dataclass
from typing import Protocol

import torch

from ...kernels.activation_layout import empty_video, pad_border, zero_border
from ...model.execution import Execution


class Partition(Protocol):
    """Which rows of every frame this process computes, and how the processes' results come together."""

    # Whether an out-of-memory error may shrink the plan mid-run (not when other processes must agree).
    recoverable: bool

    @property
    def execution(self) -> Execution | None:
        """The strategy every layer runs under to compute only this process's rows (None: whole frames,
        or whatever the plan's tiles say)."""

    def rows(self, scale: int) -> tuple[int, int] | None:
        """This process's rows of a layer with `scale` rows per latent row ([lo, hi)), or None for all."""

    def collect(self, y: torch.Tensor, scale: int) -> torch.Tensor | None:
        """The output rows this process delivers from its part y (None: it delivers nothing)."""

    def delivers(self) -> bool:
        """Whether this process receives output (and allocates it)."""

    def output_rows(self, rows: int, scale: int) -> int:
        """How many rows of a `rows`-row output (at `scale` rows per latent row) this process holds."""

    def cancelled(self, flag: bool) -> bool:
        """`flag` as every process agrees on it."""


class WholeFrame:
    """The partition of a run in one process: it computes and delivers every row."""

    recoverable = True
    execution = None

    def rows(self, scale: int) -> None:
        return None

    def collect(self, y: torch.Tensor, scale: int) -> torch.Tensor:
        return y

    def delivers(self) -> bool:
        return True

    def output_rows(self, rows: int, scale: int) -> int:
        return rows

    def cancelled(self, flag: bool) -> bool:
        return flag


WHOLE_FRAME = WholeFrame()


class Bands(Protocol):
    """A group of processes that split every frame's rows between them (`distributed.RowBands`): what
    `encode`/`decode` ask of the `bands=` they are given."""

    gather: bool  # whether one process receives whole frames

    def start(self, latent_rows: int) -> Partition:
        """This process's `Partition` of a frame of `latent_rows` latent rows."""

    def agreed_plan(self, model, op: str, input_shape, settings, opts):
        """The plan every process runs (its band's), agreed between them."""

    def agree(self, values, device, what: str) -> None:
        """Raise unless every process gives the same `values` (`what` names them)."""


@dataclass(frozen=True)
class ConvWindow:
    """A conv's spatial arithmetic on new frames of `shape` (B,C,T,H,W): its output size, and the input
    region [i0, i1) x [j0, j1) an output region reads (the halo included; it may reach into the zero
    padding). The one home of this arithmetic for exact tiles and row bands alike."""

    conv: object
    shape: tuple[int, ...]

    @property
    def out_hw(self) -> tuple[int, int]:
        _, _, _, h, w = self.shape
        (kh, kw), (sh, sw) = self.conv.kernel_size[-2:], self.conv.stride[-2:]
        left, right, top, bottom = self.conv.spatial_pad
        return (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1

    def reads(self, out_rows: tuple[int, int], out_cols: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
        """Input rows and columns [start, stop) that outputs out_rows x out_cols read."""
        (kh, kw), (sh, sw) = self.conv.kernel_size[-2:], self.conv.stride[-2:]
        left, _, top, _ = self.conv.spatial_pad
        (oy0, oy1), (ox0, ox1) = out_rows, out_cols
        return (oy0 * sh - top, (oy1 - 1) * sh + kh - top), (ox0 * sw - left, (ox1 - 1) * sw + kw - left)

    def _outside(self, rows: tuple[int, int], cols: tuple[int, int]) -> tuple[int, int, int, int]:
        """How far the input region rows x cols leaves the frame: (left, right, top, bottom) pixels."""
        _, _, _, h, w = self.shape
        (iy0, iy1), (ix0, ix1) = rows, cols
        return max(-ix0, 0), max(ix1 - w, 0), max(-iy0, 0), max(iy1 - h, 0)

    def buffer(self, like: torch.Tensor, frames: int, rows: tuple[int, int], cols: tuple[int, int]):
        """(buffer B,C,frames,rows,cols of the input region, its in-frame part as a view, that part's
        row and column slices of the frame); zero where the region leaves the frame (a conv with
        another padding mode: left to `pad`, once the in-frame part is written)."""
        b, c, _, h, w = self.shape
        (iy0, iy1), (ix0, ix1) = rows, cols
        cy0, cy1, cx0, cx1 = max(iy0, 0), min(iy1, h), max(ix0, 0), min(ix1, w)
        buf = empty_video(like, (b, c, frames, iy1 - iy0, ix1 - ix0))
        if self.conv.padding_mode == "zeros":
            zero_border(buf, self._outside(rows, cols))
        inner = buf[..., cy0 - iy0:cy1 - iy0, cx0 - ix0:cx1 - ix0]
        return buf, inner, slice(cy0, cy1), slice(cx0, cx1)

    def pad(self, buf: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int]) -> None:
        """The part of `buffer`'s region outside the frame, for a conv that pads by reflection or by
        copies of the edge: read from the in-frame part, which is written (zeros were set by `buffer`)."""
        if self.conv.padding_mode != "zeros":
            pad_border(buf, self._outside(rows, cols), self.conv.padding_mode)
