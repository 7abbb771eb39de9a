"""Building blocks shared by the SeedVR2 and Wan families.

Layout everywhere: video tensors are B,C,T,H,W. Every block takes the `RunState` of the
encode/decode it is part of: it carries the run's optimization switches, the causal caches that let a
clip be processed in temporal chunks with exactly the whole-clip result, and the execution strategy
(`model.execution.Execution`: exact tiles, row bands) its convs, norms and attention run under.
"""
from typing import Callable

import torch
import torch.nn as nn

from ..kernels import conv3d
from ..kernels.activation_layout import PADDING_MODES, Fill, cat_frames, empty_video, interior, pad_border, padded_buffer
from .execution import RunState, TimeWindow


def _triple(v) -> tuple[int, int, int]:
    return (v, v, v) if isinstance(v, int) else tuple(v)


class ConvLayer:
    """The one implementation of `execution.Conv` for every conv of the pack: its frames per call
    (`time_window`) and their head and tail (`pad_in_time`), the same code for the whole-frame path
    and for every execution strategy, so the causal cache logic exists once.

    The temporal state is the class's: none by default (a frame-wise or a pointwise conv: no head, no
    tail, an output per new frame, nothing kept between calls); `CausalConv3d` sets its own (head
    frames of padding, a temporal kernel and stride, `lookahead`). No spatial padding by default."""

    head_frames = 0
    head_mode = "zeros"
    lookahead = 0
    temporal = False
    padding_mode = "zeros"
    spatial_pad = (0, 0, 0, 0)

    def time_window(self, ctx: RunState, new: int) -> TimeWindow | None:
        """The frames of a call on `new` new frames (`execution.TimeWindow`), or None when a conv that
        looks ahead has not started and gets none. The head: the previous call's kept input (its
        cache), or on the clip's first call `head_frames` frames of padding (a conv that looks ahead
        pads on its first call with frames: a lagging layer before it may give none at first); the
        tail: `lookahead` copies of the clip's last frame on the call with `ctx.last_chunk`."""
        cached = self.temporal and self in ctx.cache
        if self.lookahead and not new and not cached:
            return None
        if cached:
            head = ctx.cache.frames(self)
        else:
            head = self.head_frames if self.temporal and (ctx.first_chunk or self.lookahead) else 0
        # `last_chunk` is read only by a conv that looks ahead, so a compiled causal block does not
        # guard on it (a middle chunk would trace a third graph).
        tail = self.lookahead if self.lookahead and ctx.last_chunk else 0
        kt, st = (self.kernel_size[0], self.stride[0]) if len(self.kernel_size) == 3 else (1, 1)
        total = head + new + tail
        outputs = (total - kt) // st + 1 if total >= kt else 0
        return TimeWindow(head, new, tail, outputs, outputs * st, cached)

    def pad_in_time(self, frames: torch.Tensor, head: torch.Tensor | None, window: TimeWindow,
                    rows: slice = slice(None), cols: slice = slice(None)) -> None:
        """Fill the first `window.head` frames of `frames` (the unpadded frame region of a conv buffer,
        or rows x cols of it for a tile; the new frames written) from `head` (the cached frames: rows x
        cols of them are read) or with padding, zeros or copies of the first new frame; and the last
        `window.tail` frames with copies of the frame before them, the clip's last."""
        n_head, n_tail = window.head, window.tail
        if head is not None:
            frames[:, :, :n_head] = head[..., rows, cols]
        elif n_head and self.head_mode == "replicate":
            frames[:, :, :n_head] = frames[:, :, n_head:n_head + 1]
        elif n_head:
            frames[:, :, :n_head].zero_()
        if n_tail:
            last = frames.shape[2] - n_tail
            frames[:, :, last:] = frames[:, :, last - 1:last]

    def _no_output(self, like: torch.Tensor, shape) -> torch.Tensor:
        """The empty output (B,C',0,H',W') of a call on new frames of `shape` that convolves nothing."""
        (kh, kw), (sh, sw) = self.kernel_size[-2:], self.stride[-2:]
        h_out = (shape[3] + sum(self.spatial_pad[2:]) - kh) // sh + 1
        w_out = (shape[4] + sum(self.spatial_pad[:2]) - kw) // sw + 1
        return empty_video(like, (shape[0], self.out_channels, 0, h_out, w_out))


class Conv3d(nn.Conv3d, ConvLayer):
    """A pointwise (1x1x1) conv through the pack's conv dispatch (fast half precision where the CPU
    lacks it; the run's PyTorch 2.9 cuDNN workaround): no Winograd, nothing to measure. No temporal
    state, no padding (`ConvLayer`)."""

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return self.conv5d(x, ctx)

    def conv5d(self, x: torch.Tensor, ctx: RunState, padded: bool = True) -> torch.Tensor:
        """The convolution of x (B,C,T,H,W) or of any region of it (a residual's shortcut, tile by tile)."""
        return conv3d(x, self.weight, self.bias, self.stride, self.padding if padded else (0, 0, 0),
                      cudnn_workaround=ctx.opts.conv3d_workaround, log=ctx.kernel_log)


class CausalConv3d(Conv3d):
    """Conv3d that is causal in time: output frame t only sees input frames <= t + `lookahead`.

    The temporal padding is not a conv padding: each call convolves [head | new frames], where head
    is what the previous chunk left unconsumed (its cache) or, on the first chunk, `head_frames`
    frames of padding: zeros (Wan) or copies of frame 0 (SeedVR2, head="replicate"). The cache after
    a call is exactly the input frames a whole-clip pass would still read, so any temporal chunking
    reproduces the whole-clip result, strided convs included (`ConvLayer.time_window`).

    `lookahead` > 0 makes a conv centred in time (LTX-2's decoder): each output reads `lookahead` later
    frames, the clip's start gets `kt - 1 - lookahead` copies of frame 0 and its end `lookahead`
    copies of the last frame (on the call with `ctx.last_chunk`). Such a conv emits its outputs
    `lookahead` frames late: a call gives the outputs its frames complete, the last call the rest, so
    its output over a clip is the whole-clip one however the input is cut. Its start is its first
    call with frames (not `ctx.first_chunk`: a lagging layer before it may give none at first).

    Spatial padding (left, right, top, bottom) is `padding_mode` "zeros", "reflect" (LTX-2) or
    "replicate" (HunyuanVideo 1.5's copies of the frame's edge), torch's modes (`kernels.activation_layout`);
    symmetric zero padding is done by the conv itself, asymmetric, reflected or replicated padding
    inside the input buffer (the downsamplers' right/bottom pad; every other mode's pad), after the
    frames are written, only at the frame border: a tile's halo inside the frame is the frame's pixels.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, *, head="zeros", head_frames=None,
                 spatial_pad=None, lookahead: int = 0, padding_mode: str = "zeros"):
        kt, kh, kw = _triple(kernel_size)
        pad = spatial_pad if spatial_pad is not None else (kw // 2, kw // 2, kh // 2, kh // 2)
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {', '.join(map(repr, PADDING_MODES))}, got {padding_mode!r}")
        symmetric = pad[0] == pad[1] and pad[2] == pad[3] and padding_mode == "zeros"
        super().__init__(in_channels, out_channels, (kt, kh, kw), _triple(stride), padding=(0, pad[2], pad[0]) if symmetric else 0)
        if head not in ("zeros", "replicate"):
            raise ValueError(f"head must be 'zeros' or 'replicate', got {head!r}")
        if lookahead and (head != "replicate" or self.stride[0] != 1 or not 0 < lookahead < kt):
            raise ValueError("a conv that looks ahead pads both ends with copies: head='replicate', temporal stride 1, "
                             f"lookahead below the kernel's {kt} frames")
        self.head_mode = head
        self.lookahead = lookahead
        self.head_frames = kt - 1 - lookahead if head_frames is None else head_frames
        self.padding_mode = padding_mode
        self.spatial_pad = tuple(pad)
        self.buffer_pad = (0, 0, 0, 0) if symmetric else tuple(pad)
        self.temporal = kt > 1 or self.stride[0] > 1

    def forward(self, x: torch.Tensor, ctx: RunState, norm: nn.Module | None = None) -> torch.Tensor:
        """conv(x), or conv(SiLU(norm(x))) when `norm` is given."""
        if not x.shape[2] and self.lookahead and self not in ctx.cache:
            return self._no_output(x, x.shape)  # nothing to normalise: a conv that looks ahead has not started
        if ctx.execution is not None:
            # Whole-frame statistics first (per-frame GroupNorm), then tile by tile (or band by band).
            stats = ctx.execution.norm_stats(norm, x, ctx) if norm is not None else None
            fill = norm_fill(x, norm, ctx, stats) if norm is not None else _copy_fill(x)
            return ctx.execution.conv(self, ctx, x.shape, x, fill)
        if norm is not None and not ctx.opts.fused_norm_act:
            x, norm = norm.act(x, ctx), None
        if norm is None and not self.temporal and not any(self.buffer_pad):
            return self._convolve(x, ctx)  # nothing to prepend or pad (1x1x1 convs): no buffer copy
        return self.run(ctx, x.shape, x, norm_fill(x, norm, ctx) if norm is not None else _copy_fill(x))

    def run(self, ctx: RunState, shape, like: torch.Tensor, fill: Fill) -> torch.Tensor:
        """Convolve new frames of `shape` (B,C,T,H,W) that `fill` writes into the input buffer.

        The buffer holds [head | new frames | tail] plus any asymmetric or reflected spatial padding,
        so neither the cache nor the padding is ever concatenated onto the input (one write instead of
        write + copy).
        """
        if ctx.execution is not None:
            return ctx.execution.conv(self, ctx, shape, like, fill)
        window = self.time_window(ctx, shape[2])
        if window is None:
            return self._no_output(like, shape)
        if (not window.cached and window.head and self.head_mode == "zeros" and self.stride[0] == 1
                and window.head + shape[2] >= self.kernel_size[0] and self.padding_mode == "zeros"):
            return self._convolve_after_zeros(padded_buffer(like, shape, 0, self.buffer_pad, fill), window.head, ctx)
        buf = padded_buffer(like, shape, window.head, self.buffer_pad, fill, window.tail, self.padding_mode)
        self.pad_in_time(interior(buf, self.buffer_pad), ctx.cache.get(self) if window.cached else None, window)
        if self.padding_mode != "zeros":  # read the written frames: after them
            pad_border(buf, self.buffer_pad, self.padding_mode)
        return self._convolve(buf, ctx)

    def _convolve_after_zeros(self, buf: torch.Tensor, n_head: int, ctx: RunState) -> torch.Tensor:
        """`_convolve` of [n_head zero frames | buf] (temporal stride 1) without multiplying the zeros.

        Output frame j < n_head reads the zeros through its first n_head - j taps, so it is computed
        from the remaining taps over buf's first frames; the other outputs are one plain conv of buf.
        """
        kt, t = self.kernel_size[0], buf.shape[2]
        n_out = n_head + t - kt + 1
        keep = kt - 1  # what the next window still reads: the last kt - 1 frames of [zeros | buf]
        tail = interior(buf, self.buffer_pad)[:, :, max(t - keep, 0):]
        missing = keep - tail.shape[2]
        if missing:
            zeros = empty_video(tail, tail.shape[:2] + (missing,) + tail.shape[3:]).zero_()  # B,C,missing,H,W
            ctx.cache.put(self, cat_frames([zeros, tail]), owned=True)
        else:
            ctx.cache.put(self, tail)
        outs = []
        for j in range(min(n_head, n_out)):
            taps = self.weight[:, :, n_head - j:].clone(memory_format=torch.preserve_format)  # dense, the weight's layout
            outs.append(conv3d(buf[:, :, :kt - n_head + j], taps, self.bias, self.stride, self.padding, **ctx.conv_options))
        if t >= kt:
            outs.append(conv3d(buf, self.weight, self.bias, self.stride, self.padding, **ctx.conv_options))
        return cat_frames(outs) if len(outs) > 1 else outs[0]

    def _convolve(self, buf: torch.Tensor, ctx: RunState) -> torch.Tensor:
        """conv5d of a buffer that holds a call's whole window, keeping what the next call reads."""
        (kt, kh, kw), (st, sh, sw) = self.kernel_size, self.stride
        n_out = (buf.shape[2] - kt) // st + 1 if buf.shape[2] >= kt else 0
        if self.temporal:
            # Keep what the next window still reads (unpadded, as exact tiling stores it too); a
            # copy, so the chunk's buffer can be freed.
            ctx.cache.put(self, interior(buf, self.buffer_pad)[:, :, n_out * st:])
        if n_out == 0:
            h_out = (buf.shape[3] + 2 * self.padding[1] - kh) // sh + 1
            w_out = (buf.shape[4] + 2 * self.padding[2] - kw) // sw + 1
            return empty_video(buf, (buf.shape[0], self.out_channels, 0, h_out, w_out))
        return conv3d(buf, self.weight, self.bias, self.stride, self.padding, **ctx.conv_options)  # conv5d's

    def conv5d(self, buf: torch.Tensor, ctx: RunState, padded: bool = True) -> torch.Tensor:
        """The raw convolution of a prepared buffer (with the conv's own symmetric padding, or none)."""
        padding = self.padding if padded else (0, 0, 0)
        return conv3d(buf, self.weight, self.bias, self.stride, padding, **ctx.conv_options)


def _copy_fill(x: torch.Tensor) -> Fill:
    return lambda view, rows, cols: view.copy_(x[..., rows, cols])


def norm_fill(x: torch.Tensor, norm: nn.Module, ctx: RunState, stats=None) -> Fill:
    """SiLU(norm(x)) of a region, with whole-frame statistics `stats` when tiling (or banding)."""
    return lambda view, rows, cols: norm.act(x[..., rows, cols], ctx, out=view, stats=stats)


class FrameConv2d(nn.Conv2d, ConvLayer):
    """A 2-D conv applied to every frame of B,C,T,H,W input; the weight keeps its 4-D checkpoint shape.
    A conv without temporal state (`ConvLayer`): nothing is carried between chunks.

    `spatial_pad` is zero padding (left, right, top, bottom) as in `CausalConv3d`: symmetric padding
    is done by the conv, asymmetric padding (Wan's right/bottom downsampler pad) in the input buffer.
    The optimized path convolves the 5-D tensor with a (1, k, k) view of the weight, so frames are
    never folded into the batch (no transpose copies).
    """

    def __init__(self, in_channels, out_channels, kernel_size: int, stride: int = 1, *, spatial_pad=None):
        pad = spatial_pad if spatial_pad is not None else (kernel_size // 2,) * 4
        symmetric = pad[0] == pad[1] and pad[2] == pad[3]
        super().__init__(in_channels, out_channels, kernel_size, stride, padding=(pad[2], pad[0]) if symmetric else 0)
        self.spatial_pad = tuple(pad)
        self.buffer_pad = (0, 0, 0, 0) if symmetric else tuple(pad)

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        if ctx.execution is not None:
            return ctx.execution.conv(self, ctx, x.shape, x, _copy_fill(x))
        if not any(self.buffer_pad):
            return self.conv5d(x, ctx)
        return self.conv5d(padded_buffer(x, x.shape, 0, self.buffer_pad, _copy_fill(x)), ctx)

    def conv5d(self, buf: torch.Tensor, ctx: RunState, padded: bool = True) -> torch.Tensor:
        """The raw per-frame convolution of a B,C,T,H,W buffer (own symmetric padding, or none)."""
        padding = (0,) + (self.padding if padded else (0, 0))
        return conv3d(buf, self.weight.unsqueeze(2), self.bias, (1,) + self.stride, padding, **ctx.conv_options)

    def upsampled(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        """conv(nearest 2x upsample of x); tile by tile (each with a one-pixel halo) when tiling."""
        if ctx.execution is not None:
            return ctx.execution.local(lambda part: self._upsampled(part, ctx), x, scale=2, halo=1)
        return self._upsampled(x, ctx)

    def _upsampled(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        """conv(nearest 2x upsample of x) for a 3x3, stride-1, padding-1 conv: B,C,T,H,W -> B,C',T,2H,2W.

        Output pixel (2i + a, 2j + b) reads upsampled rows 2i + a - 1 .. 2i + a + 1, i.e. input rows
        i - 1, i, i (a = 0) or i, i, i + 1 (a = 1), and likewise columns: each of the four phases
        (a, b) is a 2x2 conv of x whose taps are sums of the 3x3 taps. All four run as one conv
        with 4C' outputs over x padded by 1 (each phase reads its own 2x2 offset); the results are
        interleaved into the 2x output. 16 instead of 36 multiply-adds per input pixel per channel pair.
        """
        assert self.kernel_size == (3, 3) and self.stride == (1, 1) and self.padding == (1, 1), "3x3 same convs only"
        b, _, t, h, w = x.shape
        bias = None if self.bias is None else self.bias.repeat(4)
        y = conv3d(x, self._phase_weight(x.dtype).unsqueeze(2), bias, (1, 1, 1), (0, 1, 1),
                   cudnn_workaround=ctx.opts.conv3d_workaround, log=ctx.kernel_log)
        y = y.view(b, 2, 2, self.out_channels, t, h + 1, w + 1)
        out = empty_video(x, (b, self.out_channels, t, 2 * h, 2 * w))
        phases = out.view(b, self.out_channels, t, h, 2, w, 2)
        for a in (0, 1):
            for c in (0, 1):
                phases[:, :, :, :, a, :, c] = y[:, a, c, :, :, a:a + h, c:c + w]
        return out

    def _phase_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The (4C', C, 2, 2) phase kernels of `upsampled`, summed in float32, cached per weight version."""
        w = self.weight
        if torch.compiler.is_compiling():  # a traced block computes them in its graph (no cache state)
            return self._phase_kernels(dtype)
        # inference tensors (weights loaded under torch.inference_mode) carry no version counter
        key = (w.data_ptr(), 0 if w.is_inference() else w._version, w.device, dtype)
        cached = getattr(self, "_phase_cache", None)
        if cached is None or cached[0] != key:
            cached = self._phase_cache = (key, self._phase_kernels(dtype))
        return cached[1]

    def _phase_kernels(self, dtype: torch.dtype) -> torch.Tensor:
        w = self.weight
        rows = w.new_tensor([[[1, 0, 0], [0, 1, 1]], [[1, 1, 0], [0, 0, 1]]], dtype=torch.float32)  # phase, tap, 3x3 row
        phase = torch.einsum("apk,oikl,cql->acoipq", rows, w.float(), rows).reshape(4 * self.out_channels, self.in_channels, 2, 2)
        return phase.to(dtype).contiguous()


def upsampling_fill(produce: Callable[[torch.Tensor, torch.Tensor], object], x: torch.Tensor, factor: int = 2) -> Fill:
    """A `Fill` for frames at `factor` x the resolution of x, from `produce(part, view)`, which writes
    the whole upsampled image of a region `part` of x into `view`. Regions that do not start and end
    on the factor grid (tiles with a halo) go through a temporary one source pixel larger."""

    def fill(view: torch.Tensor, rows: slice, cols: slice) -> None:
        r0, r1 = rows.start // factor, -(-rows.stop // factor)
        c0, c1 = cols.start // factor, -(-cols.stop // factor)
        part = x[..., r0:r1, c0:c1]
        if (r0 * factor, r1 * factor, c0 * factor, c1 * factor) == (rows.start, rows.stop, cols.start, cols.stop):
            produce(part, view)
            return
        full = empty_video(view, view.shape[:-2] + ((r1 - r0) * factor, (c1 - c0) * factor))
        produce(part, full)
        dy, dx = rows.start - r0 * factor, cols.start - c0 * factor
        view.copy_(full[..., dy:dy + view.shape[-2], dx:dx + view.shape[-1]])

    return fill
