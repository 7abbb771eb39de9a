"""Building blocks shared by the SeedVR2 and Wan families.

Layout everywhere: video tensors are B,C,T,H,W. Every block takes the `StreamContext` of the
encode/decode it is part of: it carries the optimization switches and the causal caches that let a
clip be processed in temporal chunks with exactly the whole-clip result.
"""
import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

try:  # inside the ComfyUI pack, `optimizations` is a sibling subpackage
    from ..optimizations import Optimizations, group_norm_act, rms_norm_act
except ImportError:  # plain library use: the repository root is on sys.path
    from optimizations import Optimizations, group_norm_act, rms_norm_act


class StreamContext:
    """State of one streamed encode or decode.

    `cache` maps each temporal module to what it must remember between chunks (for causal convs: the
    input frames the next chunk still needs). `first_chunk` is True while the chunk that holds frame 0
    of the clip is processed; several upstream behaviours (head padding, frame-0 special cases) hinge
    on it.
    """

    def __init__(self, opts: Optimizations):
        self.opts = opts
        self.first_chunk = True
        self.cache: dict[nn.Module, torch.Tensor] = {}


def _triple(v) -> tuple[int, int, int]:
    return (v, v, v) if isinstance(v, int) else tuple(v)


class CausalConv3d(nn.Conv3d):
    """Conv3d that is causal in time: output frame t only sees input frames <= t.

    The temporal padding is not a conv padding: each call convolves [head | new frames], where head
    is what the previous chunk left unconsumed (its cache) or, on the first chunk, `head_frames`
    frames of padding: zeros (Wan) or copies of frame 0 (SeedVR2, head="replicate"). The cache after
    a call is exactly the input frames a whole-clip pass would still read, so any temporal chunking
    reproduces the whole-clip result, strided convs included.

    Spatial padding is zero padding, (left, right, top, bottom); symmetric padding is done by the
    conv itself, asymmetric padding (the downsamplers' right/bottom pad) inside the input buffer.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, *, head="zeros", head_frames=None, spatial_pad=None):
        kt, kh, kw = _triple(kernel_size)
        pad = spatial_pad if spatial_pad is not None else (kw // 2, kw // 2, kh // 2, kh // 2)
        symmetric = pad[0] == pad[1] and pad[2] == pad[3]
        super().__init__(in_channels, out_channels, (kt, kh, kw), _triple(stride), padding=(0, pad[2], pad[0]) if symmetric else 0)
        if head not in ("zeros", "replicate"):
            raise ValueError(f"head must be 'zeros' or 'replicate', got {head!r}")
        self.head_mode = head
        self.head_frames = kt - 1 if head_frames is None else head_frames
        self.buffer_pad = (0, 0, 0, 0) if symmetric else tuple(pad)
        self.temporal = kt > 1 or self.stride[0] > 1

    def forward(self, x: torch.Tensor, ctx: StreamContext, norm: nn.Module | None = None) -> torch.Tensor:
        """conv(x), or conv(SiLU(norm(x))) when `norm` is given."""
        opts = ctx.opts
        if norm is not None and not (opts.fused_norm_act and opts.buffered_causal_pad):
            x, norm = norm.act(x, ctx), None
        if not opts.buffered_causal_pad:
            return self._forward_concat(x, ctx)
        if norm is None:
            return self.run(ctx, x.shape, x, lambda body: body.copy_(x))
        return self.run(ctx, x.shape, x, lambda body: norm.act(x, ctx, out=body))

    def run(self, ctx: StreamContext, shape, like: torch.Tensor, fill: Callable[[torch.Tensor], object]) -> torch.Tensor:
        """Convolve new frames of `shape` (B,C,T,H,W) that `fill(view)` writes into the input buffer.

        The buffer holds [head | new frames] plus any asymmetric spatial padding, so neither the cache
        nor the padding is ever concatenated onto the input (one write instead of write + copy).
        """
        b, c, t, h, w = shape
        head = ctx.cache.get(self) if self.temporal else None
        n_head = head.shape[2] if head is not None else (self.head_frames if ctx.first_chunk else 0)
        left, right, top, bottom = self.buffer_pad
        buf = like.new_empty((b, c, n_head + t, h + top + bottom, w + left + right))
        fill(buf[:, :, n_head:, top:top + h, left:left + w])
        if right:
            buf[:, :, n_head:, :, left + w:].zero_()
        if bottom:
            buf[:, :, n_head:, top + h:, :].zero_()
        if left or top:
            buf[:, :, n_head:, :top].zero_()
            buf[:, :, n_head:, :, :left].zero_()
        if n_head:
            if head is not None:
                buf[:, :, :n_head] = head
            elif self.head_mode == "replicate":
                buf[:, :, :n_head] = buf[:, :, n_head:n_head + 1]
            else:
                buf[:, :, :n_head].zero_()
        return self._convolve(buf, ctx)

    def _forward_concat(self, x: torch.Tensor, ctx: StreamContext) -> torch.Tensor:
        """Straightforward path: F.pad + torch.cat of the head, as the upstream code does."""
        if any(self.buffer_pad):
            x = F.pad(x, self.buffer_pad)
        head = ctx.cache.get(self) if self.temporal else None
        if head is None and ctx.first_chunk and self.head_frames:
            first = x[:, :, :1]
            head = first.expand(-1, -1, self.head_frames, -1, -1) if self.head_mode == "replicate" else torch.zeros_like(first).expand(-1, -1, self.head_frames, -1, -1)
        if head is not None:
            x = torch.cat([head, x], dim=2)
        return self._convolve(x, ctx)

    def _convolve(self, buf: torch.Tensor, ctx: StreamContext) -> torch.Tensor:
        kt, st = self.kernel_size[0], self.stride[0]
        n = buf.shape[2]
        n_out = (n - kt) // st + 1 if n >= kt else 0
        if self.temporal:
            # Keep what the next window still reads; clone so the chunk's buffer can be freed.
            ctx.cache[self] = buf[:, :, n_out * st:].clone()
        if n_out == 0:
            h_out = (buf.shape[3] + 2 * self.padding[1] - self.kernel_size[1]) // self.stride[1] + 1
            w_out = (buf.shape[4] + 2 * self.padding[2] - self.kernel_size[2]) // self.stride[2] + 1
            return buf.new_empty((buf.shape[0], self.out_channels, 0, h_out, w_out))
        return F.conv3d(buf, self.weight, self.bias, self.stride, self.padding)


class FrameGroupNorm(nn.GroupNorm):
    """GroupNorm with per-frame statistics over (C/G, H, W) on B,C,T,H,W input (SeedVR2)."""

    def forward(self, x: torch.Tensor, ctx: StreamContext) -> torch.Tensor:
        return self._normalize(x, ctx, act=False)

    def act(self, x: torch.Tensor, ctx: StreamContext, out: torch.Tensor | None = None) -> torch.Tensor:
        """SiLU(GroupNorm(x)), written into `out` when given."""
        return self._normalize(x, ctx, act=True, out=out)

    def _normalize(self, x, ctx, act, out=None):
        if ctx.opts.fused_norm_act:
            return group_norm_act(x, self.num_groups, self.weight, self.bias, self.eps, act=act, out=out)
        b, c, t, h, w = x.shape
        frames = x.transpose(1, 2).reshape(b * t, c, h, w)
        y = F.group_norm(frames, self.num_groups, self.weight, self.bias, self.eps)
        y = y.reshape(b, t, c, h, w).transpose(1, 2)
        if act:
            y = F.silu(y)
        if out is None:
            return y.contiguous()
        return out.copy_(y)


class RMSNorm(nn.Module):
    """Wan RMS norm over channels: x / max(||x||_2, 1e-12) * sqrt(C) * gamma (no bias).

    `gamma` has shape (C, 1, 1, 1) in 3-D blocks and (C, 1, 1) in the attention norm, as in the
    released checkpoints.
    """

    def __init__(self, channels: int, spatial_dims: int = 3):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones((channels,) + (1,) * spatial_dims))

    def forward(self, x: torch.Tensor, ctx: StreamContext) -> torch.Tensor:
        return self._normalize(x, ctx, act=False)

    def act(self, x: torch.Tensor, ctx: StreamContext, out: torch.Tensor | None = None) -> torch.Tensor:
        return self._normalize(x, ctx, act=True, out=out)

    def _normalize(self, x, ctx, act, out=None):
        if ctx.opts.fused_norm_act:
            return rms_norm_act(x, self.gamma, act=act, out=out)
        y = F.normalize(x, dim=1) * math.sqrt(x.shape[1]) * self.gamma.view((1, -1) + (1,) * (x.dim() - 2))
        if act:
            y = F.silu(y)
        return y if out is None else out.copy_(y)


def residual_add(branch: torch.Tensor, skip: torch.Tensor, ctx: StreamContext) -> torch.Tensor:
    """branch + skip; in place into the freshly computed branch when allowed."""
    return branch.add_(skip) if ctx.opts.inplace_residual else branch + skip


class FrameSelfAttention(nn.Module):
    """Single-head self-attention among the H*W positions of each frame, plus the residual.

    Subclasses own the parameters (their names follow each checkpoint) and define `normalize`,
    `project_qkv` (tokens B*T,N,C -> q, k, v) and `project_out`.
    """

    def normalize(self, x: torch.Tensor, ctx: StreamContext) -> torch.Tensor:
        raise NotImplementedError

    def project_qkv(self, tokens: torch.Tensor):
        raise NotImplementedError

    def project_out(self, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, ctx: StreamContext) -> torch.Tensor:
        b, c, t, h, w = x.shape
        tokens = self.normalize(x, ctx).permute(0, 2, 3, 4, 1).reshape(b * t, h * w, c)
        q, k, v = self.project_qkv(tokens)
        if ctx.opts.sdpa_attention:
            o = F.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)
        else:
            weights = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * (c ** -0.5), dim=-1)
            o = torch.bmm(weights, v)
        o = self.project_out(o).reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3)
        return x + o
