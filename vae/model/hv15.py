"""HunyuanVideo 1.5 causal 3-D VAE (ComfyUI `hunyuanvideo15_vae_fp16.safetensors`; also the Hunyuan
Image 2.1 refiner's weights, which core loads as this network).

A re-implementation of the network diffusers calls `AutoencoderKLHunyuanVideo15` and ComfyUI core
`comfy/ldm/hunyuan_video/vae_refiner.py`, with core's module names (those of the released file), so
its keys load strictly; diffusers' names are mapped on load (`hv15_layout.py`, which also reads every
size from the shapes). Layout B,C,T,H,W; pixels in [-1, 1]; 16x spatial and 4x temporal compression
(T = 1 + 4k <-> 1 + k latent frames); 32 latent channels; `encode` returns the raw posterior mean.

- Every conv is causal in time and pads by replication, in time (two copies of frame 0) and in space
  (the frame's edge: `blocks.CausalConv3d(padding_mode="replicate")`); norms are per-voxel RMS norms.
- Resampling is DC-AE style: a conv to (or from) a multiple of the channels, then depth-to-space (or
  space-to-depth), plus a shortcut that repeats (or averages) channels. In time, frame 0 of the clip
  is resampled on its own: not doubled by the upsamplers, not paired by the downsamplers; the others
  go in pairs (a frame waits in `ctx.cache` for its partner when a chunk holds an odd count).
- The decoder's first conv adds its input repeated across the channels; the encoder's last conv adds
  its input averaged over channel groups.
- The mid-block of encoder and decoder has one attention over every latent position of the clip,
  frame-causal (`layers.FrameCausalAttention`, chunk by chunk with a key/value cache); with
  `Hv15Config.attention = "full"` unmasked, as ComfyUI core runs it (docs/families.md).
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..kernels.activation_layout import cat_frames, empty_video
from .blocks import CausalConv3d, Conv3d
from .execution import RunState
from .layers import FrameCausalAttention, RMSNorm, residual_convs
from .video_vae import Stage, VideoVAE

# ComfyUI's latent format `HunyuanVideo15` (and diffusers' config): the diffusion model sees raw * 1.03682.
HV15_SCALING_FACTOR = 1.03682
ATTENTION_MODES = ("causal", "full")


@dataclass(frozen=True)
class Hv15Config:
    """Released config (diffusers `AutoencoderKLHunyuanVideo15()`); every size is read from the weights,
    `attention` is a choice: "causal" (the frame-causal mask the model was trained with) or "full"
    (ComfyUI core's unmasked attention)."""

    block_out_channels: tuple[int, ...] = (128, 256, 512, 1024, 1024)
    layers_per_block: int = 2
    latent_channels: int = 32
    in_channels: int = 3
    out_channels: int = 3
    spatial_compression: int = 16
    temporal_compression: int = 4
    downsample_match_channel: bool = True
    upsample_match_channel: bool = True
    attention: str = "causal"

    def __post_init__(self):
        if self.attention not in ATTENTION_MODES:
            raise ValueError(f"hv15 attention must be one of {ATTENTION_MODES}, got {self.attention!r}")

    def downsamples(self) -> list[tuple[int, bool] | None]:
        """Per encoder stage: (output channels, temporal) of its downsampler, or None (the last stages)."""
        spatial, temporal = self.spatial_compression.bit_length() - 1, self.temporal_compression.bit_length() - 1
        widths = self.block_out_channels
        return [((widths[i + 1] if self.downsample_match_channel else width), i >= spatial - temporal)
                if i < spatial else None for i, width in enumerate(widths)]

    def upsamples(self) -> list[tuple[int, bool] | None]:
        """Per decoder stage (widths reversed): (output channels, temporal) of its upsampler, or None."""
        spatial, temporal = self.spatial_compression.bit_length() - 1, self.temporal_compression.bit_length() - 1
        widths = tuple(reversed(self.block_out_channels))
        return [((widths[i + 1] if self.upsample_match_channel else width), i < temporal)
                if i < spatial else None for i, width in enumerate(widths)]


class Hv15ConvSlot(nn.Module):
    """The `conv` attribute a checkpoint key passes through (`conv_in.conv.weight`); the blocks call the
    conv itself, so exact tiles and row bands see a `blocks.CausalConv3d`."""

    def __init__(self, conv: nn.Module):
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor, ctx: RunState, norm: nn.Module | None = None) -> torch.Tensor:
        return self.conv(x, ctx, norm=norm) if norm is not None else self.conv(x, ctx)


def hv15_conv(cin: int, cout: int, kernel: int = 3) -> Hv15ConvSlot:
    """A causal conv padded by replication in time and space (a 1x1x1 one is a plain conv)."""
    if kernel == 1:
        return Hv15ConvSlot(Conv3d(cin, cout, 1))
    return Hv15ConvSlot(CausalConv3d(cin, cout, kernel, head="replicate", padding_mode="replicate"))


class Hv15ResnetBlock(nn.Module):
    """conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))) + x, or + nin_shortcut(x) when the width changes."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1, self.conv1 = RMSNorm(cin), hv15_conv(cin, cout)
        self.norm2, self.conv2 = RMSNorm(cout), hv15_conv(cout, cout)
        self.nin_shortcut = hv15_conv(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        shortcut = self.nin_shortcut.conv if self.nin_shortcut is not None else None
        return residual_convs(x, ctx, self.conv1.conv, self.norm1, self.conv2.conv, self.norm2, shortcut)


class Hv15Attention(FrameCausalAttention):
    """The mid-block attention (`mid.attn_1`): RMS norm, 1x1x1 q, k, v and proj_out convs, one head."""

    def __init__(self, channels: int, full: bool):
        super().__init__(channels, full)
        self.norm = RMSNorm(channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv3d(channels, channels, 1) for _ in range(4))

    def normalize(self, x, ctx):
        return self.norm(x, ctx)

    def project_qkv(self, tokens):
        return tuple(F.linear(tokens, p.weight.flatten(1), p.bias) for p in (self.q, self.k, self.v))

    def project_out(self, tokens):
        return F.linear(tokens, self.proj_out.weight.flatten(1), self.proj_out.bias)


class Hv15MidBlock(nn.Module):
    """`mid.block_1`, `mid.attn_1`, `mid.block_2`."""

    def __init__(self, channels: int, full: bool):
        super().__init__()
        self.block_1 = Hv15ResnetBlock(channels, channels)
        self.attn_1 = Hv15Attention(channels, full)
        self.block_2 = Hv15ResnetBlock(channels, channels)

    def stages(self) -> list[Stage]:
        return [self.block_1, self.attn_1, self.block_2]


def _depth_to_space_into(out: torch.Tensor, h: torch.Tensor, r1: int) -> None:
    """out (B,C,t*r1,2H,2W) = h (B,r1*4*C',t,H,W) with channel ((i*2 + j)*2 + k)*C' + c (c < C) going to
    frame offset i, row offset j, column offset k (C' = C, or 2C for frame 0 of a temporal upsampler,
    which keeps the first half)."""
    b, c = out.shape[:2]
    _, ch, t, hh, ww = h.shape
    src = h.view(b, r1, 2, 2, ch // (4 * r1), t, hh, ww)[:, :, :, :, :c]  # b i j k c t h w
    out.view(b, c, t, r1, hh, 2, ww, 2).copy_(src.permute(0, 4, 5, 1, 6, 2, 7, 3))  # b c t i h j w k


def _add_repeated_up(out: torch.Tensor, x: torch.Tensor, r1: int) -> None:
    """out (B,C,t*r1,2H,2W) += depth_to_space of x (B,Cin,t,H,W) with every channel repeated C*4*r1/Cin
    times (the upsamplers' shortcut), as a broadcast view: Cin = 4*r1*G and channel c of the output
    reads input channel ((i*2 + j)*2 + k)*G + c // (C/G)."""
    b, cin, t, hh, ww = x.shape
    groups = cin // (4 * r1)
    src = x.view(b, r1, 2, 2, groups, 1, t, hh, ww).permute(0, 4, 5, 6, 1, 7, 2, 8, 3)  # b g 1 t i h j w k
    out.view(b, groups, out.shape[1] // groups, t, r1, hh, 2, ww, 2).add_(src)


class Hv15Upsample(nn.Module):
    """DC-AE upsampler (`up.i.upsample`): causal conv to C*f channels (f = 8 in time and space, 4 in
    space), depth-to-space, plus the repeated-channel shortcut. B,Cin,t,H,W -> B,C,2t (2t - 1 on the
    clip's first chunk),2H,2W in time, B,C,t,2H,2W in space only."""

    def __init__(self, cin: int, cout: int, temporal: bool):
        super().__init__()
        self.cout, self.r1 = cout, 2 if temporal else 1
        self.conv = hv15_conv(cin, cout * 4 * self.r1)

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        h = self.conv(x, ctx)
        b, _, t, hh, ww = h.shape
        first = 1 if self.r1 == 2 and ctx.first_chunk and t else 0  # frame 0 is not doubled
        out = empty_video(h, (b, self.cout, first + self.r1 * (t - first), 2 * hh, 2 * ww))
        if first:
            _depth_to_space_into(out[:, :, :1], h[:, :, :1], 1)
            _add_repeated_up(out[:, :, :1], x[:, :, :1], 1)
        _depth_to_space_into(out[:, :, first:], h[:, :, first:], self.r1)
        _add_repeated_up(out[:, :, first:], x[:, :, first:], self.r1)
        return out


def _space_to_depth_into(out: torch.Tensor, x: torch.Tensor, r1: int) -> None:
    """out (B,s*4*C,t,H/2,W/2) = x (B,C,t*r1,H,W) with frame offset i, row offset j, column offset k of
    channel c going to channel ((i*2 + j)*2 + k)*C + c; with r1 = 1 and s = 2 (frame 0 of a temporal
    downsampler) the 4C channels are written twice."""
    b, c, t, hh, ww = x.shape
    slots = out.shape[1] // (4 * c)
    src = x.view(b, c, t // r1, r1, hh // 2, 2, ww // 2, 2).permute(0, 3, 5, 7, 1, 2, 4, 6)  # b i j k c t h w
    out.view(b, slots, 2, 2, c, t // r1, hh // 2, ww // 2).copy_(src)


class Hv15Downsample(nn.Module):
    """DC-AE downsampler (`down.i.downsample`): causal conv to C/f channels, space-to-depth, plus the
    shortcut averaging groups of the space-to-depth input channels. B,Cin,t,H,W -> B,C,t/2,H/2,W/2 in
    time (frame 0 of the clip alone, then pairs), B,C,t,H/2,W/2 in space only."""

    def __init__(self, cin: int, cout: int, temporal: bool):
        super().__init__()
        self.cout, self.r1 = cout, 2 if temporal else 1
        self.conv = hv15_conv(cin, cout // (4 * self.r1))

    def _paired(self, x: torch.Tensor, ctx: RunState) -> tuple[torch.Tensor, int]:
        """(the frames to downsample now, 1 if the first is the clip's frame 0): a temporal downsampler
        pairs frames 1,2 / 3,4 / ...; a frame whose partner is in the next call waits in the cache."""
        if self.r1 == 1:
            return x, 0
        held = ctx.cache.pop(self)
        frames = x if held is None else cat_frames([held, x])
        lead = 1 if ctx.first_chunk else 0
        usable = lead + (frames.shape[2] - lead) // 2 * 2
        if usable < frames.shape[2]:
            ctx.cache.put(self, frames[:, :, usable:])
        return frames[:, :, :usable], lead

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        x, lead = self._paired(x, ctx)
        b, _, t, hh, ww = x.shape
        out = empty_video(x, (b, self.cout, lead + (t - lead) // self.r1, hh // 2, ww // 2))
        if t:
            h = self.conv(x, ctx)
            if lead:  # frame 0 alone: its 4 * C/8 channels twice, the shortcut over half-size groups
                self._resample_into(out[:, :, :1], h[:, :, :1], x[:, :, :1], 1)
            if t > lead:
                self._resample_into(out[:, :, lead:], h[:, :, lead:], x[:, :, lead:], self.r1)
        return out

    def _resample_into(self, out: torch.Tensor, h: torch.Tensor, x: torch.Tensor, r1: int) -> None:
        """out = space_to_depth(h) + the mean of each group of space_to_depth(x)'s channels."""
        b, cin, t, hh, ww = x.shape
        _space_to_depth_into(out, h, r1)
        grouped = empty_video(x, (b, cin * 4 * r1, t // r1, hh // 2, ww // 2))
        _space_to_depth_into(grouped, x, r1)
        out.add_(grouped.view(b, self.cout, -1, *grouped.shape[2:]).mean(dim=2))


class Hv15Stage(nn.Module):
    """One encoder stage (`down.i`: `block`, then `downsample`) or decoder stage (`up.i`: `block`, then `upsample`)."""

    def __init__(self, widths: list[tuple[int, int]], resample: nn.Module | None, name: str):
        super().__init__()
        self.block = nn.ModuleList([Hv15ResnetBlock(cin, cout) for cin, cout in widths])
        if resample is not None:
            self.add_module(name, resample)
        self.resample_name = name if resample is not None else None

    def stages(self) -> list[Stage]:
        return [*self.block] + ([getattr(self, self.resample_name)] if self.resample_name else [])


class Hv15Encoder(nn.Module):
    """B,Cin,T,H,W pixels -> B,2z,T',H/16,W/16 (mean then logvar)."""

    def __init__(self, cfg: Hv15Config):
        super().__init__()
        widths = cfg.block_out_channels
        self.conv_in = hv15_conv(cfg.in_channels, widths[0])
        self.down = nn.ModuleList()
        ch = widths[0]
        for width, resample in zip(widths, cfg.downsamples()):
            blocks = [(ch if j == 0 else width, width) for j in range(cfg.layers_per_block)]
            down = Hv15Downsample(width, *resample) if resample else None
            self.down.append(Hv15Stage(blocks, down, "downsample"))
            ch = resample[0] if resample else width
        self.mid = Hv15MidBlock(ch, cfg.attention == "full")
        self.norm_out = RMSNorm(ch)
        self.conv_out = hv15_conv(ch, 2 * cfg.latent_channels)

    def head(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        """conv_out(SiLU(norm_out(x))) + the mean of each group of x's channels (one per output channel)."""
        b, c, t, h, w = x.shape
        out = self.conv_out(x, ctx, norm=self.norm_out)
        return out.add_(x.view(b, out.shape[1], c // out.shape[1], t, h, w).mean(dim=2))

    def stages(self) -> list[Stage]:
        return [self.conv_in, *[s for stage in self.down for s in stage.stages()], *self.mid.stages(), self.head]


class Hv15Decoder(nn.Module):
    """B,z,T',h,w -> B,Cout,4(T'-1)+1,16h,16w pixels, not clamped."""

    def __init__(self, cfg: Hv15Config):
        super().__init__()
        widths = tuple(reversed(cfg.block_out_channels))
        self.conv_in = hv15_conv(cfg.latent_channels, widths[0])
        self.mid = Hv15MidBlock(widths[0], cfg.attention == "full")
        self.up = nn.ModuleList()
        ch = widths[0]
        for width, resample in zip(widths, cfg.upsamples()):
            blocks = [(ch if j == 0 else width, width) for j in range(cfg.layers_per_block + 1)]
            up = Hv15Upsample(width, *resample) if resample else None
            self.up.append(Hv15Stage(blocks, up, "upsample"))
            ch = resample[0] if resample else width
        self.norm_out = RMSNorm(ch)
        self.conv_out = hv15_conv(ch, cfg.out_channels)

    def tail(self, z: torch.Tensor, ctx: RunState) -> torch.Tensor:
        """conv_in(z) + z with every channel repeated to the width."""
        b, c, t, h, w = z.shape
        out = self.conv_in(z, ctx)
        out.view(b, c, out.shape[1] // c, t, h, w).add_(z.unsqueeze(2))
        return out

    def head(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return self.conv_out(x, ctx, norm=self.norm_out)

    def stages(self) -> list[Stage]:
        return [self.tail, *self.mid.stages(), *[s for stage in self.up for s in stage.stages()], self.head]


class Hv15VAE(VideoVAE):
    """The HunyuanVideo 1.5 VAE: raw mean out, raw latent in; 32 channels, 16x / 4x."""

    family = "hv15"
    spatial_factor = 16
    latent_channels = 32
    probe_keys = ("encoder.conv_in.conv.weight", "encoder.down.0.block.0.conv1.conv.weight", "encoder.mid.attn_1.q.weight",
                  "decoder.conv_in.conv.weight", "decoder.mid.attn_1.q.weight", "decoder.up.0.block.0.conv1.conv.weight")
    load_choices = {"attention": ATTENTION_MODES}  # the trained frame-causal mask, or core's unmasked attention

    def __init__(self, cfg: Hv15Config = Hv15Config()):
        super().__init__()
        self.config = cfg
        self.latent_channels, self.in_channels, self.out_channels = cfg.latent_channels, cfg.in_channels, cfg.out_channels
        self.spatial_factor, self.temporal_factor = cfg.spatial_compression, cfg.temporal_compression
        self.encoder = Hv15Encoder(cfg)
        self.decoder = Hv15Decoder(cfg)

    @classmethod
    def native_state_dict(cls, state_dict):
        from . import hv15_layout

        return hv15_layout.native(state_dict, cls.probe_keys)

    @classmethod
    def config_from_state_dict(cls, sd, overrides):
        from . import hv15_layout

        return Hv15Config(**{**hv15_layout.read(sd), **overrides})

    def encode_stages(self) -> list[Stage]:
        return self.encoder.stages()

    def decode_stages(self) -> list[Stage]:
        return self.decoder.stages()

    def prefill_stages(self, op: str) -> list[Stage]:
        """Full attention needs every frame's keys first: the stages up to the mid-block attention."""
        if self.config.attention != "full":
            return []
        stages = self.decode_stages() if op == "decode" else self.encode_stages()
        attention = (self.decoder if op == "decode" else self.encoder).mid.attn_1
        return stages[:stages.index(attention) + 1]

    def attention_cache_elements(self, op: str, batch: int, latent_frames: int, latent_hw: tuple[int, int]) -> int:
        """The mid-block attention's keys and values of the whole clip (at the latent resolution)."""
        width = self.decoder.mid.attn_1.channels if op == "decode" else self.encoder.mid.attn_1.channels
        return 2 * batch * latent_frames * latent_hw[0] * latent_hw[1] * width

    def moments(self, h):
        mean, logvar = h.chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)  # the clamp diffusers' DiagonalGaussianDistribution applies

    def to_model_space(self, z: torch.Tensor) -> torch.Tensor:
        """raw * 1.03682: what the HunyuanVideo 1.5 DiT sees (ComfyUI `HunyuanVideo15.process_in`)."""
        return z * HV15_SCALING_FACTOR

    def from_model_space(self, z: torch.Tensor) -> torch.Tensor:
        return z / HV15_SCALING_FACTOR

    def memory_calibration(self, op):
        """The released model's coefficients, scaled by the width (1024 channels at latent resolution released)."""
        return self.family, max(w / r for w, r in zip(self.config.block_out_channels, Hv15Config.block_out_channels))
