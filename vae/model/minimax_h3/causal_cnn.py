"""MiniMax-H3's encoder: a 3-D causal CNN (core's `EncoderFCN3D`), run on one tile of one clip.

Layout B,C,T,H,W throughout. Every 3x3x3 conv pads by reflection in space and with two zero frames
before the clip's first in time (causal: output frame t reads input frames <= t), GroupNorms (32 groups,
eps 1e-6) take each frame's own statistics, and a downsampler reflects one row and column at the
bottom and right before its strided conv. Levels (released widths 128, 256, 256, 512, 512, 1024) halve
the frame at the first four and the frame rate at the second and third: 17 frames -> 5, 16x smaller.
Because every op is causal in time and per frame, latent frame k of a clip depends only on its frames
<= 4k (`tiles.EncodePlan.clip_frames` relies on it).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import MiniMaxH3Config


class MiniMaxH3CausalConv3d(nn.Conv3d):
    """Conv3d whose input is padded by `padding` = (t, h, w): h rows and w columns reflected on each side,
    2t zero frames before the first (a 3-frame kernel then gives one output frame per input frame)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride=1, padding=(0, 0, 0)):
        super().__init__(cin, cout, kernel, stride=stride)
        self.causal_padding = tuple(padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, h, w = self.causal_padding
        if h or w:
            x = F.pad(x, (w, w, h, h, 0, 0), mode="reflect")  # B,C,T,H+2h,W+2w
        if t:
            x = F.pad(x, (0, 0, 0, 0, 2 * t, 0))  # B,C,2t+T,H,W: zero frames before the clip
        return super().forward(x)


class MiniMaxH3FrameGroupNorm(nn.GroupNorm):
    """GroupNorm over (channels of a group, H, W) of each frame on its own."""

    def __init__(self, channels: int):
        super().__init__(32, channels, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        frames = x.transpose(1, 2).reshape(b * t, c, h, w)  # B*T,C,H,W
        out = F.group_norm(frames, self.num_groups, self.weight, self.bias, self.eps)
        return out.view(b, t, c, h, w).transpose(1, 2)  # B,C,T,H,W


class MiniMaxH3ResnetBlock(nn.Module):
    """conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))) + x, the shortcut a 1x1x1 conv where the width changes."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1, self.conv1 = MiniMaxH3FrameGroupNorm(cin), MiniMaxH3CausalConv3d(cin, cout, 3, padding=(1, 1, 1))
        self.norm2, self.conv2 = MiniMaxH3FrameGroupNorm(cout), MiniMaxH3CausalConv3d(cout, cout, 3, padding=(1, 1, 1))
        self.nin_shortcut = MiniMaxH3CausalConv3d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (self.nin_shortcut(x) if self.nin_shortcut is not None else x)


class MiniMaxH3Downsample(nn.Module):
    """A 3x3x3 conv of stride (time, space, space), causal in time; a spatial stride of 2 reflects one
    row and one column at the bottom and right first (H, W even -> H/2, W/2)."""

    def __init__(self, channels: int, time_stride: int, space_stride: int):
        super().__init__()
        self.space_stride = space_stride
        self.conv = MiniMaxH3CausalConv3d(channels, channels, 3, stride=(time_stride, space_stride, space_stride),
                                          padding=(1, 0, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.space_stride == 2:
            x = F.pad(x, (0, 1, 0, 1, 0, 0), mode="reflect")  # B,C,T,H+1,W+1
        return self.conv(x)


class MiniMaxH3EncoderLevel(nn.Module):
    """One level: residual blocks (`block`), then the level's downsampler where it has one."""

    def __init__(self, cin: int, cout: int, blocks: int, time_stride: int, space_stride: int):
        super().__init__()
        self.block = nn.ModuleList(MiniMaxH3ResnetBlock(cin if i == 0 else cout, cout) for i in range(blocks))
        self.downsample = MiniMaxH3Downsample(cout, time_stride, space_stride) if time_stride * space_stride > 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.block:
            x = block(x)
        return self.downsample(x) if self.downsample is not None else x


class MiniMaxH3Encoder(nn.Module):
    """Pixels B,in,T,H,W (ImageNet-normalised) -> moments B,2*z,(T-1)/4+1,H/16,W/16 (before `quant_conv`)."""

    def __init__(self, cfg: MiniMaxH3Config):
        super().__init__()
        widths = cfg.widths
        self.conv_in = MiniMaxH3CausalConv3d(cfg.in_channels, widths[0], 3, padding=(1, 1, 1))
        self.down = nn.ModuleList(
            MiniMaxH3EncoderLevel(widths[max(i - 1, 0)], widths[i], cfg.res_blocks[i], cfg.time_down[i],
                                  cfg.space_down[i]) for i in range(len(widths)))
        self.norm_out = MiniMaxH3FrameGroupNorm(widths[-1])
        self.conv_out = MiniMaxH3CausalConv3d(widths[-1], 2 * cfg.z_channels, 3, padding=(1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        for level in self.down:
            x = level(x)
        return self.conv_out(F.silu(self.norm_out(x)))
