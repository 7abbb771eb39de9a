"""SeedVR2 causal 3-D VAE (`ema_vae_fp16.safetensors`): what the network is.

A re-implementation of ByteDance-Seed/SeedVR `VideoAutoencoderKLWrapper` (video_vae_v3) with the
released checkpoint's module names, so its 250 keys load strictly. Layout B,C,T,H,W; pixels in
[-1, 1]; 8x spatial and 4x temporal compression (T = 1 + 4k <-> 1 + k latent frames); 16 latent
channels. Every temporal conv is causal with replicate head padding (copies of frame 0), and every
GroupNorm has per-frame statistics, which is what lets the engine stream any temporal chunking.
How the network is run (chunks, tiles, devices) lives in the engine, not here.
"""
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn as nn

from .blocks import CausalConv3d, Conv3d, upsampling_fill
from .execution import RunState
from .layers import FrameGroupNorm, FrameSelfAttention, residual_convs
from .video_vae import Stage, VideoVAE, run_stages


@dataclass(frozen=True)
class SeedVR2Config:
    """Released config (`s8_c16_t4_inflation_sd3.yaml`); the tiny fixture scales channels by 1/8."""

    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    latent_channels: int = 16
    norm_num_groups: int = 32
    in_channels: int = 3
    out_channels: int = 3
    temporal_scale_num: int = 2
    scaling_factor: float = 0.9152
    shifting_factor: float = 0.0
    eps: float = 1e-6


def _conv(cin, cout, kernel=3, **kw) -> CausalConv3d:
    return CausalConv3d(cin, cout, kernel, head="replicate", **kw)


class SeedVR2ResnetBlock3D(nn.Module):
    """Pre-norm residual block: conv2(SiLU(GN2(conv1(SiLU(GN1(x)))))) + shortcut(x)."""

    def __init__(self, cin: int, cout: int, cfg: SeedVR2Config):
        super().__init__()
        self.norm1 = FrameGroupNorm(cfg.norm_num_groups, cin, eps=cfg.eps)
        self.conv1 = _conv(cin, cout)
        self.norm2 = FrameGroupNorm(cfg.norm_num_groups, cout, eps=cfg.eps)
        self.conv2 = _conv(cout, cout)
        self.conv_shortcut = Conv3d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return residual_convs(x, ctx, self.conv1, self.norm1, self.conv2, self.norm2, self.conv_shortcut)


class SeedVR2Attention(FrameSelfAttention):
    """diffusers `Attention` as converted from the old attention block: GroupNorm, 1 head of width C."""

    def __init__(self, channels: int, cfg: SeedVR2Config):
        super().__init__(channels)
        self.group_norm = FrameGroupNorm(cfg.norm_num_groups, channels, eps=cfg.eps)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels)])

    def normalize(self, x, ctx):
        return self.group_norm(x, ctx)

    def project_qkv(self, tokens):
        return self.to_q(tokens), self.to_k(tokens), self.to_v(tokens)

    def project_out(self, tokens):
        return self.to_out[0](tokens)


class SeedVR2MidBlock3D(nn.Module):
    def __init__(self, channels: int, cfg: SeedVR2Config):
        super().__init__()
        self.resnets = nn.ModuleList([SeedVR2ResnetBlock3D(channels, channels, cfg) for _ in range(2)])
        self.attentions = nn.ModuleList([SeedVR2Attention(channels, cfg)])

    def forward(self, x, ctx):
        x = self.resnets[0](x, ctx)
        x = self.attentions[0](x, ctx)
        return self.resnets[1](x, ctx)


class SeedVR2Downsample3D(nn.Module):
    """Zero pad right/bottom by 1, then a stride-2 conv: spatial only (k 1x3x3) or also temporal (causal k3 s2)."""

    def __init__(self, channels: int, temporal: bool):
        super().__init__()
        kernel, stride = ((3, 3, 3), (2, 2, 2)) if temporal else ((1, 3, 3), (1, 2, 2))
        self.conv = _conv(channels, channels, kernel, stride=stride, spatial_pad=(0, 1, 0, 1))

    def forward(self, x, ctx):
        return self.conv(x, ctx)


class SeedVR2Upsample3D(nn.Module):
    """MAGViT-v2 style upsampler: 1x1x1 conv to C*r channels, pixel shuffle, causal 3x3x3 conv.

    Channel index of the wide conv output = ((x * 2 + y) * z_factor + z) * C + c with x the H offset,
    y the W offset, z the T offset. A temporal upsampler turns latent frame 0 into two frames; on the
    first chunk the second of them is dropped ("remove_head"), so T -> 2T - 1 over the clip.
    """

    def __init__(self, channels: int, temporal: bool):
        super().__init__()
        self.temporal_up = temporal
        self.factor_t = 2 if temporal else 1
        self.upscale_conv = Conv3d(channels, channels * 4 * self.factor_t, 1)
        self.conv = _conv(channels, channels)

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        b, c, t, h, w = x.shape
        zt = self.factor_t
        drop = 1 if (self.temporal_up and ctx.first_chunk) else 0
        shape = (b, c, t * zt - drop, h * 2, w * 2)
        return self.conv.run(ctx, shape, x, upsampling_fill(lambda part, body: self._shuffle_into(part, body, drop, ctx), x))

    def _shuffle_into(self, x: torch.Tensor, body: torch.Tensor, drop: int, ctx: RunState) -> None:
        """Wide conv + shuffle a few latent frames at a time, writing straight into `body`.

        Working on small frame groups keeps the 4-8x wider conv output small (it would otherwise
        be the decoder's largest tensor).
        """
        b, c, t, h, w = x.shape
        zt = self.factor_t
        step = max(1, (1 << 22) // max(1, c * h * w))  # frames per group: about 4M input elements
        for start in range(0, t, step):
            stop = min(t, start + step)
            wide = self.upscale_conv(x[:, :, start:stop], ctx).view(b, 2, 2, zt, c, stop - start, h, w)
            src = wide.permute(0, 4, 5, 3, 6, 1, 7, 2)  # b, c, f, z, h, x, w, y
            first = start * zt - (drop if start else 0)
            if drop and start == 0:
                body[:, :, 0].view(b, c, h, 2, w, 2).copy_(src[:, :, 0, 0])
                src, first = src[:, :, 1:], 1
            n = stop - start - (1 if drop and start == 0 else 0)
            if n:
                body[:, :, first:first + n * zt].view(b, c, n, zt, h, 2, w, 2).copy_(src)


class SeedVR2DownBlock3D(nn.Module):
    def __init__(self, cin, cout, n_layers, downsample: str | None, cfg):
        super().__init__()
        self.resnets = nn.ModuleList([SeedVR2ResnetBlock3D(cin if i == 0 else cout, cout, cfg) for i in range(n_layers)])
        self.downsamplers = nn.ModuleList([SeedVR2Downsample3D(cout, downsample == "temporal")]) if downsample else None

    def stages(self) -> list[Stage]:
        return [*self.resnets, *(self.downsamplers or [])]

    def forward(self, x, ctx):
        return run_stages(self.stages(), x, ctx)


class SeedVR2UpBlock3D(nn.Module):
    def __init__(self, cin, cout, n_layers, upsample: str | None, cfg):
        super().__init__()
        self.resnets = nn.ModuleList([SeedVR2ResnetBlock3D(cin if i == 0 else cout, cout, cfg) for i in range(n_layers)])
        self.upsamplers = nn.ModuleList([SeedVR2Upsample3D(cout, upsample == "temporal")]) if upsample else None

    def stages(self) -> list[Stage]:
        return [*self.resnets, *(self.upsamplers or [])]

    def forward(self, x, ctx):
        return run_stages(self.stages(), x, ctx)


class SeedVR2Encoder3D(nn.Module):
    """B,3,T,H,W pixels -> B,2*latent,T',H/8,W/8 moments (mean then logvar channels)."""

    def __init__(self, cfg: SeedVR2Config):
        super().__init__()
        ch = cfg.block_out_channels
        n = len(ch)
        self.conv_in = _conv(cfg.in_channels, ch[0])
        blocks = []
        for i in range(n):
            last = i == n - 1
            temporal = i >= n - cfg.temporal_scale_num - 1
            downsample = None if last else ("temporal" if temporal else "spatial")
            blocks.append(SeedVR2DownBlock3D(ch[max(i - 1, 0)], ch[i], cfg.layers_per_block, downsample, cfg))
        self.down_blocks = nn.ModuleList(blocks)
        self.mid_block = SeedVR2MidBlock3D(ch[-1], cfg)
        self.conv_norm_out = FrameGroupNorm(cfg.norm_num_groups, ch[-1], eps=cfg.eps)
        self.conv_out = _conv(ch[-1], 2 * cfg.latent_channels)

    def stages(self) -> list[Stage]:
        # every resnet and resampler a stage of its own: a stage's input stays alive while it runs
        blocks = [stage for block in self.down_blocks for stage in block.stages()]
        return [self.conv_in, *blocks, self.mid_block, partial(self.conv_out, norm=self.conv_norm_out)]

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return run_stages(self.stages(), x, ctx)


class SeedVR2Decoder3D(nn.Module):
    """B,latent,T',h,w raw latent -> B,3,4(T'-1)+1,8h,8w pixels (not clamped)."""

    def __init__(self, cfg: SeedVR2Config):
        super().__init__()
        ch = tuple(reversed(cfg.block_out_channels))
        self.conv_in = _conv(cfg.latent_channels, ch[0])
        self.mid_block = SeedVR2MidBlock3D(ch[0], cfg)
        blocks = []
        for i in range(len(ch)):
            last = i == len(ch) - 1
            upsample = None if last else ("temporal" if i < cfg.temporal_scale_num else "spatial")
            blocks.append(SeedVR2UpBlock3D(ch[max(i - 1, 0)], ch[i], cfg.layers_per_block + 1, upsample, cfg))
        self.up_blocks = nn.ModuleList(blocks)
        self.conv_norm_out = FrameGroupNorm(cfg.norm_num_groups, ch[-1], eps=cfg.eps)
        self.conv_out = _conv(ch[-1], cfg.out_channels)

    def stages(self) -> list[Stage]:
        blocks = [stage for block in self.up_blocks for stage in block.stages()]
        return [self.conv_in, self.mid_block, *blocks, partial(self.conv_out, norm=self.conv_norm_out)]

    def forward(self, z: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return run_stages(self.stages(), z, ctx)


class SeedVR2VAE(VideoVAE):
    """The SeedVR2 family: raw posterior mean in, raw latent out; 0.9152 scaling in model space."""

    family = "seedvr2"
    spatial_factor = 8
    temporal_factor = 4
    comfy_latent_in_model_space = True
    probe_keys = ("decoder.up_blocks.2.upsamplers.0.upscale_conv.weight", "encoder.conv_out.weight", "decoder.conv_in.weight")

    @classmethod
    def config_from_state_dict(cls, sd, overrides):
        """Channels, depth and temporal stages from the shapes; GroupNorm groups are not in the file
        (released: 32), so they come from `overrides` when they differ."""
        channels, i = [], 0
        while f"encoder.down_blocks.{i}.resnets.0.conv1.weight" in sd:
            channels.append(sd[f"encoder.down_blocks.{i}.resnets.0.conv1.weight"].shape[0])
            i += 1
        layers = 0
        while f"encoder.down_blocks.0.resnets.{layers}.conv1.weight" in sd:
            layers += 1
        temporal = sum(
            1 for k, v in sd.items()
            if k.startswith("decoder.up_blocks.") and k.endswith("upsamplers.0.upscale_conv.weight") and v.shape[0] == 8 * v.shape[1])
        fields = dict(
            block_out_channels=tuple(channels),
            layers_per_block=layers,
            latent_channels=sd["decoder.conv_in.weight"].shape[1],
            in_channels=sd["encoder.conv_in.weight"].shape[1],
            out_channels=sd["decoder.conv_out.weight"].shape[0],
            temporal_scale_num=temporal,
        )
        fields.update(overrides)
        if isinstance(fields["block_out_channels"], list):
            fields["block_out_channels"] = tuple(fields["block_out_channels"])
        cfg = SeedVR2Config(**fields)
        bad = [c for c in cfg.block_out_channels if c % cfg.norm_num_groups]
        if bad:
            given = "as configured" if "norm_num_groups" in overrides else "the released files' count"
            raise ValueError(
                f"SeedVR2 channels {bad} are not divisible by {cfg.norm_num_groups} GroupNorm groups ({given}). A file "
                "trained with another group count does not say so in its shapes: write a copy that does, "
                "vae.save_checkpoint(vae.read_checkpoint(path)[0], 'fixed.safetensors', config={'norm_num_groups': N}) "
                f"with N dividing every channel count {list(cfg.block_out_channels)} (ComfyUI and python -m vae read it "
                "from there; "
                "vae.load takes config= too). Otherwise the file is damaged: download it again")
        return cfg

    def __init__(self, cfg: SeedVR2Config = SeedVR2Config()):
        super().__init__()
        self.config = cfg
        self.latent_channels = cfg.latent_channels
        self.encoder = SeedVR2Encoder3D(cfg)
        self.decoder = SeedVR2Decoder3D(cfg)

    def encode_stages(self) -> list[Stage]:
        return self.encoder.stages()

    def decode_stages(self) -> list[Stage]:
        return self.decoder.stages()

    def moments(self, h):
        c = self.latent_channels
        return h[:, :c], h[:, c:].clamp(-30.0, 20.0)

    def to_model_space(self, z: torch.Tensor) -> torch.Tensor:
        return (z - self.config.shifting_factor) * self.config.scaling_factor

    def from_model_space(self, z: torch.Tensor) -> torch.Tensor:
        return z / self.config.scaling_factor + self.config.shifting_factor
