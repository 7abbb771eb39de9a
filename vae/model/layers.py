"""Per-frame layers shared by the SeedVR2 and Wan families: the norms (whose statistics are per
frame, so temporal chunks and exact tiles give the whole-clip result), the residual add and the
mid-block self-attention over the pixels of one frame.

Layout: video tensors are B,C,T,H,W; every layer takes the `blocks.RunState` of its run, whose
`opts` choose the kernels.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..kernels import (
    group_norm_act,
    group_norm_apply,
    group_norm_moments,
    group_norm_stats,
    merge_group_moments,
    rms_norm_act,
    sdpa,
)
from ..kernels.activation_layout import cat_frames, empty_video
from .execution import RunState


class FrameGroupNorm(nn.GroupNorm):
    """GroupNorm with per-frame statistics over (C/G, H, W) on B,C,T,H,W input (SeedVR2).

    The statistics span the whole frame, so a tiled caller computes them once (`stats`) and applies
    them to each tile (`act(tile, stats=...)`): tiles then see exactly the untiled normalisation.
    """

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return self._normalize(x, ctx, act=False)

    def stats(self, x: torch.Tensor, ctx: RunState):
        """Whole-frame (mean, rstd) of x, float32 B,G,T."""
        return group_norm_stats(x, self.num_groups, self.eps, triton=ctx.opts.triton_norm, log=ctx.kernel_log)

    def part_moments(self, x: torch.Tensor, ctx: RunState):
        """(mean, biased var, elements per group and frame) of a part of the frames (a tile, a band)."""
        mean, var = group_norm_moments(x, self.num_groups, ctx.opts.triton_norm, ctx.kernel_log)
        return mean, var, x.shape[1] // self.num_groups * x.shape[-2] * x.shape[-1]

    def stats_of_parts(self, parts: list, ctx: RunState):
        """Whole-frame (mean, rstd) from the `part_moments` of parts that cover the frames once."""
        mean, var = merge_group_moments(parts)
        return mean, torch.rsqrt(var + self.eps)

    def act(self, x: torch.Tensor, ctx: RunState, out: torch.Tensor | None = None, stats=None) -> torch.Tensor:
        """SiLU(GroupNorm(x)), written into `out` when given; `stats` from `stats()` when tiling."""
        if stats is not None:
            return group_norm_apply(x, *stats, self.weight, self.bias, True, out, triton=ctx.opts.triton_norm,
                                    log=ctx.kernel_log)
        return self._normalize(x, ctx, act=True, out=out)

    def _normalize(self, x, ctx, act, out=None):
        if ctx.opts.fused_norm_act:
            return group_norm_act(x, self.num_groups, self.weight, self.bias, self.eps, act=act, out=out,
                                  triton=ctx.opts.triton_norm, kernels=ctx.opts.kernel_choice, log=ctx.kernel_log)
        b, c, t, h, w = x.shape
        frames = x.transpose(1, 2).reshape(b * t, c, h, w)
        y = F.group_norm(frames, self.num_groups, self.weight, self.bias, self.eps)
        y = y.reshape(b, t, c, h, w).transpose(1, 2)
        if act:
            y = F.silu(y)
        return (empty_video(x, x.shape) if out is None else out).copy_(y)


class RMSNorm(nn.Module):
    """Wan RMS norm over channels: x / max(||x||_2, 1e-12) * sqrt(C) * gamma (no bias).

    `gamma` has shape (C, 1, 1, 1) in 3-D blocks and (C, 1, 1) in the attention norm, as in the
    released checkpoints.
    """

    def __init__(self, channels: int, spatial_dims: int = 3):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones((channels,) + (1,) * spatial_dims))

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return self._normalize(x, ctx, act=False)

    def stats(self, x: torch.Tensor, ctx: RunState):
        """None: the norm is per position, so tiles need no whole-frame statistics."""
        return None

    def part_moments(self, x: torch.Tensor, ctx: RunState):
        return None

    def stats_of_parts(self, parts: list, ctx: RunState):
        return None

    def act(self, x: torch.Tensor, ctx: RunState, out: torch.Tensor | None = None, stats=None) -> torch.Tensor:
        return self._normalize(x, ctx, act=True, out=out)

    def _normalize(self, x, ctx, act, out=None):
        if ctx.opts.fused_norm_act:
            return rms_norm_act(x, self.gamma, act=act, out=out, triton=ctx.opts.triton_norm,
                                kernels=ctx.opts.kernel_choice, log=ctx.kernel_log)
        y = F.normalize(x, dim=1) * math.sqrt(x.shape[1]) * self.gamma.view((1, -1) + (1,) * (x.dim() - 2))
        if act:
            y = F.silu(y)
        return y if out is None else out.copy_(y)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """b c t (h q) (w r) -> b (c r q) t h w: a p x p pixel block per position, channel order c, then the
    column offset r, then the row offset q (Wan2.2's and LTX's order)."""
    if p == 1:
        return x
    b, c, t, h, w = x.shape
    out = empty_video(x, (b, c * p * p, t, h // p, w // p))  # in x's layout
    out.view(b, c, p, p, t, h // p, w // p).copy_(  # b c r q t h w
        x.reshape(b, c, t, h // p, p, w // p, p).permute(0, 1, 6, 4, 2, 3, 5))  # b c t h q w r -> b c r q t h w
    return out


def unpatchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """Inverse of `patchify`: b (c r q) t h w -> b c t (h q) (w r)."""
    if p == 1:
        return x
    b, cpp, t, h, w = x.shape
    return x.reshape(b, cpp // (p * p), p, p, t, h, w).permute(0, 1, 4, 5, 3, 6, 2).reshape(b, cpp // (p * p), t, h * p, w * p)


def residual_add(branch: torch.Tensor, skip: torch.Tensor, ctx: RunState) -> torch.Tensor:
    """branch + skip; in place into the freshly computed branch when allowed."""
    return branch.add_(skip)


def lagged(ctx: RunState, key, frames: torch.Tensor, count: int) -> torch.Tensor:
    """The first `count` frames of [what waits under `key` | frames] (B,C,T,H,W), the rest left waiting
    in `ctx.cache`: a residual's shortcut waits there for a branch that gives its frames later (its
    convs look ahead in time), so the two meet frame by frame over the clip however it is chunked."""
    held = ctx.cache.pop(key)
    queue = frames if held is None else cat_frames([held, frames])
    if queue.shape[2] > count:
        ctx.cache.put(key, queue[:, :, count:])
    return queue[:, :, :count]


def residual_convs(x: torch.Tensor, ctx: RunState, conv1, norm1, conv2, norm2, shortcut=None) -> torch.Tensor:
    """conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))) + shortcut(x) (x itself without one), on B,C,T,H,W: the
    residual block of both families. An execution strategy may compute it without keeping conv1's
    output or the shortcut whole (`model.execution.Execution.residual`)."""
    if ctx.execution is not None:
        return ctx.execution.residual(x, ctx, conv1, norm1, conv2, norm2, shortcut)
    return residual_sequence(x, ctx, conv1, norm1, conv2, norm2, shortcut)


def residual_sequence(x: torch.Tensor, ctx: RunState, conv1, norm1, conv2, norm2, shortcut=None) -> torch.Tensor:
    """`residual_convs` conv by conv (each through the run's execution strategy, if any)."""
    h = conv1(x, ctx, norm=norm1)
    h = conv2(h, ctx, norm=norm2)
    return residual_add(h, shortcut(x, ctx) if shortcut is not None else x, ctx)


class FrameSelfAttention(nn.Module):
    """Single-head self-attention among the H*W positions of each frame, plus the residual.

    Subclasses own the parameters (their names follow each checkpoint) and define `normalize`,
    `project_qkv` (tokens B*T,N,C -> q, k, v) and `project_out`. The one head is `channels` wide.
    """

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels

    def normalize(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        raise NotImplementedError

    def project_qkv(self, tokens: torch.Tensor):
        raise NotImplementedError

    def project_out(self, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return ctx.execution.attention(self, x, ctx) if ctx.execution is not None else self.attend(x, ctx)

    def attend(self, x: torch.Tensor, ctx: RunState, rows: slice = slice(None)) -> torch.Tensor:
        """x (B,C,T,H,W, whole frames) + attention output, for the query positions in `rows` only
        (B,C,T,len(rows),W): a row band attends to every key of the frame (distributed bands)."""
        b, c, t, h, w = x.shape
        tokens = self.normalize(x, ctx).permute(0, 2, 3, 4, 1).reshape(b * t, h * w, c)
        q, k, v = self.project_qkv(tokens)
        x = x[..., rows, :]
        if x.shape[3] != h:
            q = q.reshape(b * t, h, w, c)[:, rows].reshape(b * t, -1, c)
        o = sdpa(q, k, v, ctx.opts.attention)
        o = self.project_out(o).reshape(b, t, x.shape[3], w, c).permute(0, 4, 1, 2, 3)
        return x + o


class FrameCausalAttention(FrameSelfAttention):
    """Single-head self-attention over every position of the clip in which frame t attends to the
    positions of frames <= t (HunyuanVideo 1.5's mid-block, the mask it was trained with), plus the
    residual; with `full`, to every frame of the clip (ComfyUI core's unmasked attention).

    Frame-causal, it runs chunk by chunk: a chunk's keys and values join those of the frames before it
    (`ctx.cache.keys_values`, kept where the run's causal caches are), and the queries of each of its
    frames attend to that prefix: exactly the masked attention, without the mask (at 720p and 121
    frames it would be 111,600^2 floats) and without recomputing a key. Full, it needs every frame's
    keys before the first query: the engine runs the stages up to here over the whole clip first
    (`VideoVAE.prefill_stages`, `ctx.prefill`), which only stores them, then the clip again.

    As `FrameSelfAttention`: subclasses own the parameters and define `normalize`, `project_qkv` and
    `project_out`; execution strategies call `attend` with whole frames.
    """

    def __init__(self, channels: int, full: bool = False):
        super().__init__(channels)
        self.full = full

    def attend(self, x: torch.Tensor, ctx: RunState, rows: slice = slice(None)) -> torch.Tensor:
        """x (B,C,t,H,W: the chunk's frames, whole) + attention output, for the query positions in `rows`
        only (B,C,t,len(rows),W): a row band's queries attend to every key (distributed bands)."""
        b, c, t, h, w = x.shape
        kv = ctx.cache.keys_values
        tokens = self.normalize(x, ctx).permute(0, 2, 3, 4, 1).reshape(b, t * h * w, c)  # B,t*h*w,C
        q, k, v = self.project_qkv(tokens)
        seen = kv.frames(self)
        if not self.full or ctx.prefill:
            kv.append(self, k, v, t)
        x = x[..., rows, :]
        if self.full and ctx.prefill:
            return x  # the prefill pass only gathers keys; what follows the attention is not run
        q = q.reshape(b, t, h, w, c)[:, :, rows].reshape(b, t, -1, c)  # B,t,queries per frame,C
        if self.full:  # every query attends to every frame's keys
            keys, values = kv.prefix(self, kv.frames(self))
            o = sdpa(q.reshape(b, -1, c), keys, values, ctx.opts.attention)
        else:  # frame j attends to the frames before the chunk and its own first j + 1
            keys, values = kv.prefix(self, seen + t)
            per_frame = keys.shape[1] // (seen + t)
            o = torch.cat([sdpa(q[:, j], keys[:, :(seen + j + 1) * per_frame], values[:, :(seen + j + 1) * per_frame],
                                ctx.opts.attention) for j in range(t)], dim=1)
        o = self.project_out(o).reshape(b, t, x.shape[3], w, c).permute(0, 4, 1, 2, 3)  # B,C,t,rows,W
        return x + o
