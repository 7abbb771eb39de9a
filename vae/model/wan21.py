"""Wan2.1 causal 3-D VAE (`Wan2.1_VAE.pth`, ComfyUI `wan_2.1_vae.safetensors`), plus the Wan blocks
that Wan2.2 (`wan22.py`) shares.

A re-implementation of Wan-Video/Wan2.1 `wan/modules/vae.py` (`WanVAE_`) with the released module
names, so the 194 keys load strictly; diffusers `AutoencoderKLWan` names are mapped on load. Layout
B,C,T,H,W; pixels in [-1, 1]; 8x spatial and 4x temporal compression (T = 1 + 4k <-> 1 + k latent
frames); 16 latent channels; `encode` returns the raw posterior mean (what ComfyUI's VAE returns).

Upstream runs a clip in chunks (encode 1, 4, 4, ... frames; decode one latent frame per call) and
some blocks act differently on the first chunk. Each quirk is written here as a whole-clip rule on
`ctx.first_chunk` and the causal caches, so any temporal chunking, the whole clip in one pass
included, reproduces upstream:
- every CausalConv3d pads 2 zero frames in front (never copies of frame 0, unlike SeedVR2);
- up3d: the layer's frame 0 bypasses `time_conv` (it is not doubled in time); `time_conv` runs on
  frames 1.. with its own fresh zero padding, so frame 0 never enters its cache;
- down3d: after the spatial step, frame 0 passes through and `time_conv` (k3 s2, no padding) reads
  the windows [0,1,2], [2,3,4], ... of the layer's frames.
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..kernels.activation_layout import cat_frames, empty_video
from . import wan_layout
from .blocks import CausalConv3d, FrameConv2d
from .execution import RunState
from .layers import FrameSelfAttention, RMSNorm, patchify, residual_convs, unpatchify
from .video_vae import Stage, VideoVAE, run_stages

# Per-channel latent statistics of the released model (Wan's `WanVAE` wrapper, ComfyUI
# `latent_formats.Wan21`); not stored in the checkpoint. Model space = (raw - mean) / std.
WAN21_LATENT_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
WAN21_LATENT_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160)


@dataclass(frozen=True)
class Wan21Config:
    """Released config (`WanVAE_(dim=96, z_dim=16)`); the tiny fixture uses dim 8."""

    dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temperal_downsample: tuple[bool, ...] = (False, True, True)  # upstream's spelling; decoder uses the reverse
    in_channels: int = 3  # image channels: 3 RGB, 4 RGBA (Qwen-Image-Layered)
    out_channels: int = 3  # the decoder's last conv (ComfyUI's conv_out_channels): in_channels * upscale^2

    @property
    def upscale(self) -> int:
        """2 for the 2x upscale decoders (12 = 3 * 2 * 2 output channels, pixel-shuffled)."""
        return round((self.out_channels / self.in_channels) ** 0.5)


def wan_conv(cin: int, cout: int, kernel=3, **kw) -> CausalConv3d:
    """Wan's CausalConv3d: zero head padding (kt - 1 frames), symmetric spatial zero padding."""
    return CausalConv3d(cin, cout, kernel, head="zeros", **kw)


class WanSequence(nn.ModuleList):
    """Blocks run one after another; list indices are the checkpoint's (upstream nn.Sequential)."""

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return run_stages(list(self), x, ctx)


class WanEncoderStages(nn.Module):
    """The order of a Wan encoder's stages (Wan2.1 and Wan2.2): `conv1`, every down block, `middle`, `head`."""

    def stages(self) -> list[Stage]:
        return [self.conv1, *self.downsamples, self.middle, self.head]

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return run_stages(self.stages(), x, ctx)


class WanDecoderStages(nn.Module):
    """The order of a Wan decoder's stages (Wan2.1 and Wan2.2): `conv1`, `middle`, every up block, `head`."""

    def stages(self) -> list[Stage]:
        return [self.conv1, self.middle, *self.upsamples, self.head]

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return run_stages(self.stages(), x, ctx)


class WanResidualBlock(nn.Module):
    """conv(SiLU(RMS(conv(SiLU(RMS(x)))))) + shortcut(x), on B,C,T,H,W.

    `residual` keeps the checkpoint indices (0 norm, 2 conv, 3 norm, 6 conv); 1, 4 and 5 hold
    upstream's parameter-free SiLU, SiLU and Dropout(0), which the convs apply themselves.
    """

    def __init__(self, cin: int, cout: int, temporal_kernel: int = 3):
        super().__init__()
        k = (temporal_kernel, 3, 3)
        self.residual = nn.ModuleList([
            RMSNorm(cin), nn.SiLU(), wan_conv(cin, cout, k), RMSNorm(cout), nn.SiLU(), nn.Identity(), wan_conv(cout, cout, k)])
        self.shortcut = wan_conv(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        r = self.residual
        return residual_convs(x, ctx, r[2], r[0], r[6], r[3], self.shortcut)


class WanAttentionBlock(FrameSelfAttention):
    """Per-frame single-head attention: RMS norm, 1x1 conv `to_qkv` (output channels [q | k | v]), 1x1 `proj`."""

    def __init__(self, channels: int):
        super().__init__(channels)
        self.norm = RMSNorm(channels, spatial_dims=2)
        self.to_qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.proj = nn.Conv2d(channels, channels, 1)

    def normalize(self, x, ctx):
        return self.norm(x, ctx)

    def project_qkv(self, tokens):
        return F.linear(tokens, self.to_qkv.weight.flatten(1), self.to_qkv.bias).chunk(3, dim=-1)

    def project_out(self, tokens):
        return F.linear(tokens, self.proj.weight.flatten(1), self.proj.bias)


class WanMidBlock(WanSequence):
    """`middle.0` residual, `middle.1` attention, `middle.2` residual, all at C channels."""

    def __init__(self, channels: int, temporal_kernel: int = 3):
        super().__init__([WanResidualBlock(channels, channels, temporal_kernel), WanAttentionBlock(channels),
                          WanResidualBlock(channels, channels, temporal_kernel)])


class WanHead(nn.ModuleList):
    """RMS norm, SiLU, causal 3x3x3 conv (keys `head.0`, `head.2`)."""

    def __init__(self, cin: int, cout: int, temporal_kernel: int = 3):
        super().__init__([RMSNorm(cin), nn.SiLU(), wan_conv(cin, cout, (temporal_kernel, 3, 3))])

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return self[2](x, ctx, norm=self[0])


class StoredConvWeights(nn.Module):
    """The weight and bias a checkpoint holds for a conv that the network never runs: kept so the
    checkpoint still loads strictly, its shapes checked."""

    def __init__(self, cin: int, cout: int, kernel: tuple[int, ...]):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cout, cin, *kernel))
        self.bias = nn.Parameter(torch.empty(cout))


class WanResample(nn.Module):
    """Wan's resampler, mode "down2d" | "down3d" | "up2d" | "up3d", on B,C,T,H,W.

    down: zero pad right/bottom + 3x3 stride-2 conv per frame, then for down3d the temporal k3 s2
    `time_conv` (frame 0 passes through): T -> (T + 1) / 2 over the clip.
    up: for up3d, `time_conv` C -> 2C first (at low resolution; channel half s becomes frame 2t + s,
    frame 0 bypasses it: T -> 2T - 1 over the clip), then nearest 2x + 3x3 conv per frame to
    `out_channels` (Wan2.1 halves the channels here, Wan2.2 keeps them).
    `resample.0` is upstream's parameter-free ZeroPad2d / Upsample slot; `resample.1` is the conv.
    With `temporal_kernel` 1 (an image network, Qwen-Image 2.1) every frame is a clip's first frame,
    which upstream passes by `time_conv` (down3d) or does not double (up3d): the mode acts as its 2d
    one and the checkpoint's `time_conv` is held, never run.
    """

    def __init__(self, channels: int, mode: str, out_channels: int | None = None, temporal_kernel: int = 3):
        super().__init__()
        if mode not in ("down2d", "down3d", "up2d", "up3d"):
            raise ValueError(f"unknown Wan resample mode {mode!r}")
        self.mode = mode.replace("3d", "2d") if temporal_kernel == 1 else mode
        if mode.startswith("down"):
            conv = FrameConv2d(channels, channels, 3, stride=2, spatial_pad=(0, 1, 0, 1))
        else:
            conv = FrameConv2d(channels, out_channels or channels, 3)
        self.resample = nn.ModuleList([nn.Identity(), conv])
        time_out = {"down3d": channels, "up3d": 2 * channels}.get(mode)
        if time_out is None:
            self.time_conv = None
        elif temporal_kernel == 1:
            self.time_conv = StoredConvWeights(channels, time_out, (1, 1, 1))
        elif mode == "down3d":
            self.time_conv = wan_conv(channels, channels, (3, 1, 1), stride=(2, 1, 1), head_frames=0)
        else:
            self.time_conv = wan_conv(channels, 2 * channels, (3, 1, 1))

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        if self.mode.startswith("up"):
            return self._up(x, ctx)
        x = self.resample[1](x, ctx)
        if self.mode != "down3d":
            return x
        # No head padding: the windows start at frame 0, and the cache keeps the frames the next
        # window still reads, so chunks of any length (even ones yielding no frame) stay exact.
        y = self.time_conv(x, ctx)
        return cat_frames([x[:, :, :1], y]) if ctx.first_chunk else y

    def _up(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        conv = self.resample[1]
        if self.mode == "up3d":
            n_kept = 1 if ctx.first_chunk else 0
            # On a 1-frame first chunk time_conv gets no frames: it only seeds its cache with zeros.
            x = self._interleave(x[:, :, :n_kept], self.time_conv(x[:, :, n_kept:], ctx))
        return conv.upsampled(x, ctx)

    @staticmethod
    def _interleave(kept: torch.Tensor, doubled: torch.Tensor) -> torch.Tensor:
        """[kept frames | frames 2i, 2i + 1 = channel halves 0, 1 of doubled's frame i]: B,C,k+2n,h,w."""
        b, c2, n, h, w = doubled.shape
        halves = doubled.reshape(b, 2, c2 // 2, n, h, w)
        k = kept.shape[2]
        out = empty_video(doubled, (b, c2 // 2, k + 2 * n, h, w))
        out[:, :, :k] = kept
        out[:, :, k:].unflatten(2, (n, 2)).copy_(halves.permute(0, 2, 3, 1, 4, 5))
        return out


class Wan21Encoder(WanEncoderStages):
    """B,3,T,H,W pixels -> B,2z,T',H/8,W/8 (mu then logvar channels, before the top-level `conv1`).

    `downsamples` is one flat list: per stage `num_res_blocks` residual blocks, then a resampler
    (all stages but the last).
    """

    def __init__(self, cfg: Wan21Config):
        super().__init__()
        dims = [cfg.dim * m for m in (1,) + tuple(cfg.dim_mult)]
        self.conv1 = wan_conv(cfg.in_channels, dims[0])
        blocks = []
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            for _ in range(cfg.num_res_blocks):
                blocks.append(WanResidualBlock(cin, cout))
                cin = cout
            if i < len(cfg.dim_mult) - 1:
                blocks.append(WanResample(cout, "down3d" if cfg.temperal_downsample[i] else "down2d"))
        self.downsamples = WanSequence(blocks)
        self.middle = WanMidBlock(dims[-1])
        self.head = WanHead(dims[-1], 2 * cfg.z_dim)


class Wan21Decoder(WanDecoderStages):
    """B,z,T',h,w (after the top-level `conv2`) -> B,3,4(T'-1)+1,8h,8w pixels, not clamped.

    `upsamples` is one flat list: per stage `num_res_blocks + 1` residual blocks, then a resampler
    that halves the channels (so every stage after the first starts at half width).
    """

    def __init__(self, cfg: Wan21Config):
        super().__init__()
        dims = [cfg.dim * m for m in (cfg.dim_mult[-1],) + tuple(reversed(cfg.dim_mult))]
        temporal_up = tuple(reversed(cfg.temperal_downsample))
        self.conv1 = wan_conv(cfg.z_dim, dims[0])
        self.middle = WanMidBlock(dims[0])
        blocks = []
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            if i > 0:
                cin //= 2
            for _ in range(cfg.num_res_blocks + 1):
                blocks.append(WanResidualBlock(cin, cout))
                cin = cout
            if i < len(cfg.dim_mult) - 1:
                blocks.append(WanResample(cout, "up3d" if temporal_up[i] else "up2d", cout // 2))
        self.upsamples = WanSequence(blocks)
        self.head = WanHead(dims[-1], cfg.out_channels)


# --- the model -----------------------------------------------------------------------------------

class WanVAEBase(VideoVAE):
    """What Wan2.1 and Wan2.2 share: top-level `conv1` (2z -> 2z, split into mu | logvar) after the
    encoder and `conv2` (z -> z) before the decoder, optional 2x2 patchify around them, the latent
    statistics, and checkpoint naming (upstream == ComfyUI, or diffusers mapped on load)."""

    latents_mean: tuple[float, ...] = ()
    latents_std: tuple[float, ...] = ()
    diffusers_probe_keys: tuple[str, ...] = ()
    nested_blocks = False  # Wan2.2 nests residual blocks inside stage blocks

    def __init__(self, cfg, encoder: nn.Module, decoder: nn.Module, patch_size: int = 1, upscale: int = 1):
        super().__init__()
        self.config = cfg
        self.patch_size = patch_size
        self.latent_channels = cfg.z_dim
        self.in_channels = self.out_channels = cfg.in_channels
        self.decode_upscale = upscale
        self.spatial_factor = patch_size * 2 ** (len(cfg.dim_mult) - 1)
        self.temporal_factor = 2 ** sum(bool(t) for t in cfg.temperal_downsample)
        self.encoder = encoder
        self.conv1 = wan_conv(2 * cfg.z_dim, 2 * cfg.z_dim, 1)
        self.conv2 = wan_conv(cfg.z_dim, cfg.z_dim, 1)
        self.decoder = decoder

    @classmethod
    def native_state_dict(cls, state_dict):
        if all(k in state_dict for k in cls.probe_keys):
            return state_dict
        if all(k in state_dict for k in cls.diffusers_probe_keys):
            return wan_layout.diffusers_to_native(state_dict, cls.nested_blocks)
        return None

    def encode_modules(self):
        return [self.encoder, self.conv1]

    def decode_modules(self):
        return [self.conv2, self.decoder]

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """`layers.patchify` by the model's patch size."""
        return patchify(x, self.patch_size)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """Inverse of `patchify`."""
        return unpatchify(x, self.patch_size)

    def encode_stages(self) -> list[Stage]:
        return [lambda x, ctx: self.patchify(x), *self.encoder.stages(), self.conv1]

    def decode_stages(self) -> list[Stage]:
        return [self.conv2, *self.decoder.stages(), lambda x, ctx: depth_to_space(self.unpatchify(x), self.decode_upscale)]

    def moments(self, h):
        mu, logvar = h.chunk(2, dim=1)
        return mu, logvar.clamp(-30.0, 20.0)  # the clamp diffusers' DiagonalGaussianDistribution applies

    def _latent_stats(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if z.shape[1] != len(self.latents_mean):
            raise ValueError(f"{self.family} latent statistics are for {len(self.latents_mean)} channels, got {z.shape[1]}")
        shape = (1, -1) + (1,) * (z.dim() - 2)
        mean = torch.tensor(self.latents_mean, dtype=z.dtype, device=z.device).view(shape)
        std = torch.tensor(self.latents_std, dtype=z.dtype, device=z.device).view(shape)
        return mean, std

    def to_model_space(self, z: torch.Tensor) -> torch.Tensor:
        """(raw - mean) / std: the latent the Wan DiT sees (ComfyUI `Wan21/Wan22.process_in`)."""
        mean, std = self._latent_stats(z)
        return (z - mean) / std

    def from_model_space(self, z: torch.Tensor) -> torch.Tensor:
        mean, std = self._latent_stats(z)
        return z * std + mean


def depth_to_space(x: torch.Tensor, r: int) -> torch.Tensor:
    """B,C*r*r,T,H,W -> B,C,T,H*r,W*r: channel c*r*r + i*r + j goes to row offset i, column offset j
    (torch's pixel_shuffle order, which the 2x upscale decoders are trained for; not `unpatchify`'s)."""
    if r == 1:
        return x
    b, crr, t, h, w = x.shape
    # b (c i j) t h w -> b c t (h i) (w j)
    return x.view(b, crr // (r * r), r, r, t, h, w).permute(0, 1, 4, 5, 2, 6, 3).reshape(b, crr // (r * r), t, h * r, w * r)


class Wan21VAE(WanVAEBase):
    """The Wan2.1 VAE (also used by Wan2.2 A14B): raw mu out, raw latent in; 16 channels, 8x / 4x.
    Also the VAEs of its architecture at other sizes, read from the weights (`wan_layout.py`):
    Qwen-Image, RGBA Qwen-Image-Layered (4 image channels), pruned widths, and decoders whose
    last conv gives a 2x2 pixel block per pixel (2x upscale; `depth_to_space` after the decoder)."""

    family = "wan21"
    spatial_factor = 8
    latent_channels = 16
    latents_mean, latents_std = WAN21_LATENT_MEAN, WAN21_LATENT_STD
    probe_keys = ("encoder.conv1.weight", "encoder.downsamples.0.residual.0.gamma", "decoder.conv1.weight",
                  "decoder.middle.0.residual.0.gamma", "decoder.upsamples.0.residual.0.gamma", "decoder.head.0.gamma")
    diffusers_probe_keys = ("encoder.conv_in.weight", "encoder.down_blocks.0.norm1.gamma", "decoder.conv_in.weight",
                            "decoder.mid_block.resnets.0.norm1.gamma", "decoder.up_blocks.0.resnets.0.norm1.gamma",
                            "decoder.norm_out.gamma")

    @classmethod
    def config_from_state_dict(cls, sd, overrides):
        """Every size from the shapes (`wan_layout.read`): any width and depth, RGB or RGBA, and
        decoders that emit an upscale^2 pixel block per pixel (ComfyUI's conv_out_channels)."""
        sizes = wan_layout.read(sd, nested=False)
        wan_layout.refuse(sizes, {"temporal_kernel": ((3,), "Wan2.1 convs are 3 frames deep"),
                                  "patch_size": ((1,), "Wan2.1 takes pixels unpatchified"),
                                  "dec_dim": ((sizes["dim"],), f"decoder.head.0.gamma must have dim = {sizes['dim']} "
                                              "channels, the encoder's width")}, cls.family)
        fields = {k: sizes[k] for k in ("dim", "z_dim", "dim_mult", "num_res_blocks", "temperal_downsample", "in_channels")}
        fields["out_channels"] = sizes["in_channels"] * sizes["upscale"] ** 2
        fields.update(overrides)
        return Wan21Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})

    def __init__(self, cfg: Wan21Config = Wan21Config()):
        super().__init__(cfg, Wan21Encoder(cfg), Wan21Decoder(cfg), upscale=cfg.upscale)

    def memory_calibration(self, op):
        """The released Wan2.1's coefficients, scaled by the width (dim 96 released)."""
        return "wan21", self.config.dim / Wan21Config.dim
