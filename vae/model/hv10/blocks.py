"""The blocks of the HunyuanVideo 1.0 VAE, with the original module names (`checkpoint.py`).

Layout B,C,T,H,W. Every conv is causal in time and pads by replication in time (two copies of the
clip's frame 0) and in space (the frame's edge), as HunyuanVideo 1.5's: `hv15.network.hv15_conv`. Unlike 1.5's,
the norms are GroupNorms over the whole clip (`model.clip_norm.ClipGroupNorm`), resampling is a strided conv
down and nearest-neighbour up, and the mid-block attention is diffusers' `Attention` (GroupNorm, linear
q, k, v and out, one head) over every latent position of the clip, frame-causal as trained
(`layers.FrameCausalAttention`) or unmasked as ComfyUI core runs it.
"""
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..blocks import CausalConv3d, upsampling_fill
from ..clip_norm import ClipGroupNorm
from ..execution import RunState
from ..hv15.network import Hv15ConvSlot, hv15_conv
from ..layers import FrameCausalAttention, residual_convs
from ..video_vae import Stage

# A norm of `channels` channels at one layer of the network (its temporal factor and statistics span set).
NormFactory = Callable[[int], ClipGroupNorm]


class Hv10ResnetBlock(nn.Module):
    """`resnets.j`: conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))) + x, or + conv_shortcut(x) (1x1x1) when the
    width changes."""

    def __init__(self, cin: int, cout: int, norm: NormFactory):
        super().__init__()
        self.norm1, self.conv1 = norm(cin), hv15_conv(cin, cout)
        self.norm2, self.conv2 = norm(cout), hv15_conv(cout, cout)
        self.conv_shortcut = hv15_conv(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        shortcut = self.conv_shortcut.conv if self.conv_shortcut is not None else None
        return residual_convs(x, ctx, self.conv1.conv, self.norm1, self.conv2.conv, self.norm2, shortcut)


class Hv10Attention(FrameCausalAttention):
    """`mid_block.attentions.0`: GroupNorm, linear q, k, v (C -> C, one head) and `to_out.0`, plus the residual."""

    def __init__(self, channels: int, full: bool, norm: NormFactory):
        super().__init__(channels, full)
        self.group_norm = norm(channels)
        self.to_q, self.to_k, self.to_v = (nn.Linear(channels, channels) for _ in range(3))
        self.to_out = nn.ModuleList([nn.Linear(channels, channels)])

    def normalize(self, x, ctx):
        return self.group_norm(x, ctx)

    def project_qkv(self, tokens):
        return tuple(F.linear(tokens, p.weight, p.bias) for p in (self.to_q, self.to_k, self.to_v))

    def project_out(self, tokens):
        return F.linear(tokens, self.to_out[0].weight, self.to_out[0].bias)


class Hv10MidBlock(nn.Module):
    """`mid_block`: `resnets.0`, `attentions.0`, `resnets.1`."""

    def __init__(self, channels: int, full: bool, norm: NormFactory):
        super().__init__()
        self.resnets = nn.ModuleList([Hv10ResnetBlock(channels, channels, norm) for _ in range(2)])
        self.attentions = nn.ModuleList([Hv10Attention(channels, full, norm)])

    def stages(self) -> list[nn.Module]:
        return [self.resnets[0], self.attentions[0], self.resnets[1]]


class Hv10Downsample(nn.Module):
    """`downsamplers.0`: a causal conv of stride 2 in space (and in time): B,C,t,H,W -> B,C,t',H/2,W/2.

    In time the whole clip's conv pairs frames (x0, x0, x0), (x0, x1, x2), (x2, x3, x4), ... Core's carried
    chunks (the first one frame 0 alone) keep two frames of the padded input where the stride keeps one,
    which shifts the pairing to (x0, x0, x0), (x0, x0, x1), (x1, x2, x3), ...: the whole clip's conv with
    three copies of frame 0 before the clip (`core_pairs`)."""

    def __init__(self, channels: int, temporal: bool, core_pairs: bool):
        super().__init__()
        stride = (2 if temporal else 1, 2, 2)
        head = 3 if temporal and core_pairs else None
        self.conv = Hv15ConvSlot(CausalConv3d(channels, channels, 3, stride, head="replicate", head_frames=head,
                                              padding_mode="replicate"))

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return self.conv(x, ctx)


class Hv10Upsample(nn.Module):
    """`upsamplers.0`: nearest-neighbour 2x in space (and 2x in time, but for the clip's frame 0, which
    stays one frame), then a causal conv: B,C,t,H,W -> B,C,t',2H,2W with t' = 2t (2t - 1 on the clip's
    first chunk) in time, t in space only. The upsampled frames are written straight into the conv's
    input buffer (`blocks.upsampling_fill`): they never exist on their own."""

    def __init__(self, channels: int, temporal: bool):
        super().__init__()
        self.temporal = temporal
        self.conv = Hv15ConvSlot(CausalConv3d(channels, channels, 3, head="replicate", padding_mode="replicate"))

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        b, c, t, h, w = x.shape
        first = 1 if self.temporal and ctx.first_chunk and t else 0  # frame 0 of the clip is not doubled
        repeat = 2 if self.temporal else 1

        def produce(part: torch.Tensor, view: torch.Tensor) -> None:
            """view (B,C,t',2h',2w') = nearest upsample of part (B,C,t,h',w')."""
            hh, ww = part.shape[-2:]
            if first:
                view[:, :, :1].unflatten(4, (ww, 2)).unflatten(3, (hh, 2)).copy_(
                    part[:, :, :1, :, None, :, None])  # b c 1 h 2 w 2
            rest = view[:, :, first:].unflatten(4, (ww, 2)).unflatten(3, (hh, 2)).unflatten(2, (t - first, repeat))
            rest.copy_(part[:, :, first:, None, :, None, :, None])  # b c t r h 2 w 2

        shape = (b, c, first + repeat * (t - first), 2 * h, 2 * w)
        return self.conv.conv.run(ctx, shape, x, upsampling_fill(produce, x))


class Hv10Stage(nn.Module):
    """One encoder stage (`down_blocks.i`: `resnets`, then `downsamplers.0`) or decoder stage
    (`up_blocks.i`: `resnets`, then `upsamplers.0`)."""

    def __init__(self, widths: list[tuple[int, int]], norm: NormFactory, resample: nn.Module | None, name: str):
        super().__init__()
        self.resnets = nn.ModuleList([Hv10ResnetBlock(cin, cout, norm) for cin, cout in widths])
        if resample is not None:
            self.add_module(name, nn.ModuleList([resample]))
        self.resample_name = name if resample is not None else None

    def stages(self) -> list[Stage]:
        return [*self.resnets] + ([getattr(self, self.resample_name)[0]] if self.resample_name else [])
