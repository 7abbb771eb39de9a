"""A run's activation buffers: their memory layout, NCDHW (channel planes) or NDHWC (channels last),
and a conv's padded input buffer.

The tensors keep their logical B,C,T,H,W shape either way; only the strides differ. cuDNN's fast
conv3d kernels and oneDNN's native plain format are NDHWC: with NCDHW activations cuDNN converts the
input and the output of every conv, and channels-last weights alone are slower still, because each
activation is then converted. So a run is in one layout from the first conv to the last (measured on
CPUs and on an H100: bench/RESULTS.md sections 0, 11 and 12):

- the planner records the run's layout in its `Plan` (`run.kernel_plan`); the engine puts the conv
  weights in it before the run (`weights_in`, a no-op when they are) and each chunk's input, and the
  output is copied into the caller's NCDHW tensor;
- every buffer a block allocates takes the layout of the tensor it is made from (`empty_video`), and
  convs, norms, adds and copies keep the layout of their input, so the activations never fall back.

Which layout a run takes is `Optimizations.activation_layout`: "ncdhw", "ndhwc", or "auto"
(`run.kernel_plan`).

A conv's input buffer (`padded_buffer`): the frames a call convolves, written in place, with the
spatial padding around them (zeros, the reflection of the frame at its border, or copies of its edge),
so a conv never concatenates its cached frames or pads its input (`model.blocks.CausalConv3d`, and
per tile or band `run.strategies.ConvWindow`). Pads are (left, right, top, bottom) columns and rows.
"""
from typing import Callable

import torch

LAYOUTS = ("auto", "ncdhw", "ndhwc")
FORMATS = {"ncdhw": torch.contiguous_format, "ndhwc": torch.channels_last_3d}
WEIGHT_FORMATS = {"ncdhw": {4: torch.contiguous_format, 5: torch.contiguous_format},
                  "ndhwc": {4: torch.channels_last, 5: torch.channels_last_3d}}


def is_ndhwc(x: torch.Tensor) -> bool:
    """Whether x (B,C,T,H,W, or a view of one such as a tile) has its channels innermost."""
    return x.dim() == 5 and x.shape[1] > 1 and x.stride(1) == 1


def empty_video(like: torch.Tensor, shape, dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
    """An uninitialised B,C,T,H,W tensor of `shape` on like's device (or `device`), in like's dtype (or
    `dtype`) and layout: what a block allocates for activations made from `like`."""
    fmt = torch.channels_last_3d if is_ndhwc(like) else torch.contiguous_format
    return torch.empty(shape, dtype=dtype or like.dtype, device=device or like.device, memory_format=fmt)


def layout_of(x: torch.Tensor) -> str:
    """"ndhwc" or "ncdhw": the layout x (B,C,T,H,W) is in."""
    return "ndhwc" if is_ndhwc(x) else "ncdhw"


def dense_copy(x: torch.Tensor) -> torch.Tensor:
    """A dense copy of x (a view such as a tile) in x's layout (`.contiguous()` would make it NCDHW)."""
    return empty_video(x, x.shape).copy_(x)


def cat_frames(parts: list[torch.Tensor]) -> torch.Tensor:
    """parts (each B,C,T_i,H,W) joined along T, in the first non-empty part's layout. torch.cat falls back
    to NCDHW when the parts' layouts look different, as an empty part's does (a chunk that yields no
    frame yet), so an NDHWC run would feed its next conv NCDHW activations."""
    full = [part for part in parts if part.shape[2]] or parts[:1]
    like = full[0]
    out = empty_video(like, (*like.shape[:2], sum(part.shape[2] for part in full), *like.shape[3:]))  # B,C,sum T_i,H,W
    return torch.cat(full, dim=2, out=out)


def to_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x (B,C,T,H,W) in `layout` (itself when it already is)."""
    return x.contiguous(memory_format=FORMATS[layout])


def weights_in(module: torch.nn.Module, layout: str) -> None:
    """Store the 4-D and 5-D weights of `module` in `layout` (NDHWC: channels last), so convs on
    activations of that layout read them without a per-call conversion. `.to(device)` and `.to(dtype)`
    keep the layout."""
    for param in module.parameters():
        fmt = WEIGHT_FORMATS[layout].get(param.dim())
        if fmt is not None and not param.is_contiguous(memory_format=fmt):
            with torch.inference_mode(False):  # a run is under inference mode; the weights outlive it
                param.data = param.data.contiguous(memory_format=fmt)


# --- a conv's input buffer --------------------------------------------------------------------------

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


def by_output_channels(conv: Callable, weight: torch.Tensor, bias: torch.Tensor | None, group: int) -> torch.Tensor:
    """conv(weight, bias) (B,Cout,T',H',W') computed `group` output channels at a time, conv(weight[g], bias[g])
    for each group, written into one output in the layout of the parts: what a conv whose per-call work
    grows with the whole weight bounds that work by (each output channel is the same sum either way)."""
    out = None
    for c in range(0, weight.shape[0], group):
        part = conv(weight[c:c + group], None if bias is None else bias[c:c + group])  # B,group,T',H',W'
        if out is None:
            out = empty_video(part, (part.shape[0], weight.shape[0], *part.shape[2:]))
        out[:, c:c + part.shape[1]] = part
    return out
