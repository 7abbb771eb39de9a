"""A conv's input buffer: the frames a call convolves, written in place, with the spatial padding around
them (zeros, or the reflection of the frame at its border), so a conv never concatenates its cached
frames or pads its input (`blocks.CausalConv3d`, and per tile or band `strategies.ConvWindow`).

Layout: B,C,T,H,W; pads are (left, right, top, bottom) columns and rows.
"""
from typing import Callable

import torch

from ..kernels.layout import empty_video

# A producer of conv input: fill(view, rows, cols) writes rows x cols (slices of the unpadded input
# frame) of the new frames into `view`. Producers are region-aware so exact tiling can ask for a
# tile plus its halo instead of the whole frame.
Fill = Callable[[torch.Tensor, slice, slice], object]


def padded_buffer(like: torch.Tensor, shape, head: int, pad, fill: Fill, tail: int = 0,
                  mode: str = "zeros") -> torch.Tensor:
    """A conv input buffer B,C,head+T+tail,H+top+bottom,W+left+right for new frames of `shape` (B,C,T,H,W).

    `fill` writes the frames into their place; with zero padding the spatial pads (left, right, top,
    bottom) are zeroed here for all frames. The head and tail frames' interior, and reflected pads
    (`reflect_border`, which read the interior), are left for the caller.
    """
    b, c, t, h, w = shape
    left, right, top, bottom = pad
    buf = empty_video(like, (b, c, head + t + tail, h + top + bottom, w + left + right))
    fill(buf[:, :, head:head + t, top:top + h, left:left + w], slice(0, h), slice(0, w))
    if mode == "zeros":
        zero_border(buf, pad)
    return buf


def zero_border(buf: torch.Tensor, pad) -> None:
    """Zero the outer `pad` = (left, right, top, bottom) columns/rows of a buffer (..., H, W): the
    zero padding around a frame (or around the part of a tile that lies in the frame)."""
    left, right, top, bottom = pad
    height, width = buf.shape[-2:]
    if right:
        buf[..., width - right:].zero_()
    if bottom:
        buf[..., height - bottom:, :].zero_()
    if left:
        buf[..., :left].zero_()
    if top:
        buf[..., :top, :].zero_()


def reflect_border(buf: torch.Tensor, pad) -> None:
    """Fill the outer `pad` = (left, right, top, bottom) columns/rows of a buffer (..., H, W) with the
    reflection of the rows/columns inside them (torch's "reflect": the edge row is not repeated, pad
    row -1 is row 1), rows first, then columns over the whole height, so corners reflect both ways."""
    left, right, top, bottom = pad
    height, width = buf.shape[-2:]
    for i in range(top):
        buf[..., top - 1 - i, :] = buf[..., top + 1 + i, :]
    for i in range(bottom):
        buf[..., height - bottom + i, :] = buf[..., height - bottom - 2 - i, :]
    for i in range(left):
        buf[..., left - 1 - i] = buf[..., left + 1 + i]
    for i in range(right):
        buf[..., width - right + i] = buf[..., width - right - 2 - i]


def pad_border(buf: torch.Tensor, pad, mode: str) -> None:
    """The spatial padding `pad` (left, right, top, bottom) of a buffer whose interior is written:
    zeros, or the reflection of the interior (`reflect_border`)."""
    if mode == "reflect":
        reflect_border(buf, pad)
    else:
        zero_border(buf, pad)


def interior(buf: torch.Tensor, pad) -> torch.Tensor:
    """The unpadded frame region of a padded conv buffer (what caches store)."""
    left, right, top, bottom = pad
    return buf[..., top:buf.shape[3] - bottom, left:buf.shape[4] - right]
