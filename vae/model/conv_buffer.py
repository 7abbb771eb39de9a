"""A conv's input buffer: the frames a call convolves, written in place, with the spatial padding around
them (zeros, the reflection of the frame at its border, or copies of its edge), so a conv never
concatenates its cached frames or pads its input (`blocks.CausalConv3d`, and per tile or band
`strategies.ConvWindow`).

Layout: B,C,T,H,W; pads are (left, right, top, bottom) columns and rows.
"""
from typing import Callable

import torch

from ..kernels.layout import empty_video

# The spatial padding a conv may have at the frame border (torch's names for them).
PADDING_MODES = ("zeros", "reflect", "replicate")

# A producer of conv input: fill(view, rows, cols) writes rows x cols (slices of the unpadded input
# frame) of the new frames into `view`. Producers are region-aware so exact tiling can ask for a
# tile plus its halo instead of the whole frame.
Fill = Callable[[torch.Tensor, slice, slice], object]


def padded_buffer(like: torch.Tensor, shape, head: int, pad, fill: Fill, tail: int = 0,
                  mode: str = "zeros") -> torch.Tensor:
    """A conv input buffer B,C,head+T+tail,H+top+bottom,W+left+right for new frames of `shape` (B,C,T,H,W).

    `fill` writes the frames into their place; with zero padding the spatial pads (left, right, top,
    bottom) are zeroed here for all frames. The head and tail frames' interior, and the other modes'
    pads (`pad_border`, which read the interior), are left for the caller.
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


def replicate_border(buf: torch.Tensor, pad) -> None:
    """Fill the outer `pad` = (left, right, top, bottom) columns/rows of a buffer (..., H, W) with copies
    of the nearest row or column inside them (torch's "replicate"), rows first, then columns over the
    whole height, so corners copy the corner pixel."""
    left, right, top, bottom = pad
    height, width = buf.shape[-2:]
    if top:
        buf[..., :top, :] = buf[..., top:top + 1, :]
    if bottom:
        buf[..., height - bottom:, :] = buf[..., height - bottom - 1:height - bottom, :]
    if left:
        buf[..., :left] = buf[..., left:left + 1]
    if right:
        buf[..., width - right:] = buf[..., width - right - 1:width - right]


def pad_border(buf: torch.Tensor, pad, mode: str) -> None:
    """The spatial padding `pad` (left, right, top, bottom) of a buffer whose interior is written, in
    one of `PADDING_MODES`: zeros, the reflection of the interior, or copies of its edge."""
    {"zeros": zero_border, "reflect": reflect_border, "replicate": replicate_border}[mode](buf, pad)


def interior(buf: torch.Tensor, pad) -> torch.Tensor:
    """The unpadded frame region of a padded conv buffer (what caches store)."""
    left, right, top, bottom = pad
    return buf[..., top:buf.shape[3] - bottom, left:buf.shape[4] - right]
