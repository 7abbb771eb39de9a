"""Wan2.2 causal 3-D VAE (TI2V-5B: `Wan2.2_VAE.pth`, ComfyUI `wan2.2_vae.safetensors`).

A re-implementation of Wan-Video/Wan2.2 `wan/modules/vae2_2.py` (`WanVAE_`), 196 keys. It reuses the
Wan2.1 blocks (`wan21.py`: residual, attention, resample, first-chunk rules) and adds what differs:
- a 2x2 patchify around the network (`b c t (h q) (w r) -> b (c r q) t h w`), so 16x spatial
  compression with 12-channel conv input/output;
- stages grouped in blocks (`encoder.downsamples.i.downsamples.j`, `decoder.upsamples.i.upsamples.j`)
  whose parameter-free shortcuts (`WanAvgDown3D`, `WanDupUp3D`) are added to the stage output;
- a wider decoder (`dec_dim` 256 vs encoder `dim` 160) whose upsample convs keep their channels;
- 48 latent channels. Layout B,C,T,H,W; pixels in [-1, 1]; 4x temporal compression.
"""
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..kernels.activation_layout import cat_frames, empty_video
from . import wan_layout
from .execution import RunState
from .layers import residual_add
from .video_vae import Stage
from .wan21 import (
    WanDecoderStages,
    WanEncoderStages,
    WanHead,
    WanMidBlock,
    WanResample,
    WanResidualBlock,
    WanSequence,
    WanVAEBase,
    wan_conv,
)

# Per-channel latent statistics of the released model (Wan's `Wan2_2_VAE` wrapper, ComfyUI
# `latent_formats.Wan22`); not stored in the checkpoint. Model space = (raw - mean) / std.
WAN22_LATENT_MEAN = (
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
    0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
    -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667)
WAN22_LATENT_STD = (
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744)


@dataclass(frozen=True)
class Wan22Config:
    """Released config (`WanVAE_(dim=160, dec_dim=256, z_dim=48)`); the tiny fixture uses 4 / 8."""

    dim: int = 160
    dec_dim: int = 256
    z_dim: int = 48
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    patch_size: int = 2
    in_channels: int = 3  # image channels (3 RGB, 4 RGBA), before patchify; the decoder gives as many
    temporal_kernel: int = 3  # time extent of the 3x3 convs: 1 makes an image network (Qwen-Image 2.1)


class WanAvgDown3D(nn.Module):
    """Encoder-stage shortcut: space/time-to-channel, then the mean of consecutive channel groups.

    B,Cin,T,H,W -> B,Cout,T/ft,H/fs,W/fs. Input channel c at time offset i, row offset j, column
    offset k becomes channel c*F + (i*fs + j)*fs + k (F = ft*fs*fs); each output channel averages
    Cin*F/Cout consecutive ones. In time the clip gets ft - 1 zero frames in front (upstream pads
    its 1-frame first chunk, so frame 0 is averaged with a zero frame), then whole groups of ft
    frames are consumed; a frame left over by a chunk waits in `ctx.cache`.
    """

    def __init__(self, cin: int, cout: int, factor_t: int, factor_s: int):
        super().__init__()
        self.cout, self.ft, self.fs = cout, factor_t, factor_s
        self.group = cin * factor_t * factor_s * factor_s // cout

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        ft, fs = self.ft, self.fs
        if ft == fs == self.group == 1:
            return x
        if ft > 1:
            parts = [empty_video(x, x.shape[:2] + (ft - 1,) + x.shape[3:]).zero_()] if ctx.first_chunk else []
            held = ctx.cache.pop(self)
            x = cat_frames(parts + ([held] if held is not None else []) + [x])
            usable = x.shape[2] - x.shape[2] % ft
            if usable < x.shape[2]:
                ctx.cache.put(self, x[:, :, usable:])
            x = x[:, :, :usable]
        b, c, t, h, w = x.shape
        grouped = empty_video(x, (b, c * ft * fs * fs, t // ft, h // fs, w // fs))  # in x's layout
        grouped.view(b, c, ft, fs, fs, t // ft, h // fs, w // fs).copy_(  # b c i j k t h w
            x.reshape(b, c, t // ft, ft, h // fs, fs, w // fs, fs).permute(0, 1, 3, 5, 7, 2, 4, 6))
        out = empty_video(x, (b, self.cout, t // ft, h // fs, w // fs))
        return torch.mean(grouped.view(b, self.cout, self.group, t // ft, h // fs, w // fs), dim=2, out=out)


class WanDupUp3D(nn.Module):
    """Decoder-stage shortcut, the mirror of `WanAvgDown3D`: B,Cin,T,H,W -> B,Cout,T*ft,H*fs,W*fs.

    Each input channel is repeated Cout*F/Cin times, then channel c*F + (i*fs + j)*fs + k goes to
    time offset i, row offset j, column offset k. On the first chunk the first ft - 1 frames are
    dropped, as the up3d main path does not double frame 0.
    """

    def __init__(self, cin: int, cout: int, factor_t: int, factor_s: int):
        super().__init__()
        self.cout, self.ft, self.fs = cout, factor_t, factor_s
        self.repeats = cout * factor_t * factor_s * factor_s // cin

    def _expanded(self, x: torch.Tensor) -> torch.Tensor:
        """B,Cout,T,ft,H,fs,W,fs view of the repeated channels."""
        b, _, t, h, w = x.shape
        ft, fs = self.ft, self.fs
        dup = empty_video(x, (b, x.shape[1] * self.repeats, t, h, w))  # in x's layout
        dup.view(b, x.shape[1], self.repeats, t, h, w).copy_(x.unsqueeze(2).expand(-1, -1, self.repeats, -1, -1, -1))
        return dup.view(b, self.cout, ft, fs, fs, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)

    def add_into(self, out: torch.Tensor, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        """out += forward(x), without materialising the rearranged shortcut."""
        dup = self._expanded(x)
        h, w, fs, ft = x.shape[3], x.shape[4], self.fs, self.ft
        rest = out
        if ctx.first_chunk and ft > 1:  # frame 0 contributes only its last time offset
            rest[:, :, :1].unflatten(4, (w, fs)).unflatten(3, (h, fs)).add_(dup[:, :, 0, ft - 1:])
            rest, dup = rest[:, :, 1:], dup[:, :, 1:]
        rest.unflatten(4, (w, fs)).unflatten(3, (h, fs)).unflatten(2, (dup.shape[2], ft)).add_(dup)
        return out


class Wan22DownBlock(nn.Module):
    """`Down_ResidualBlock`: residual blocks (+ resampler) on the main path, plus `WanAvgDown3D` of the input."""

    def __init__(self, cin: int, cout: int, n_res: int, temporal: bool, down: bool, temporal_kernel: int = 3):
        super().__init__()
        self.avg_shortcut = WanAvgDown3D(cin, cout, 2 if temporal else 1, 2 if down else 1)
        blocks = [WanResidualBlock(cin if i == 0 else cout, cout, temporal_kernel) for i in range(n_res)]
        if down:
            blocks.append(WanResample(cout, "down3d" if temporal else "down2d", temporal_kernel=temporal_kernel))
        self.downsamples = WanSequence(blocks)

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return residual_add(self.downsamples(x, ctx), self.avg_shortcut(x, ctx), ctx)


class Wan22UpBlock(nn.Module):
    """`Up_ResidualBlock`: residual blocks (+ resampler) on the main path, plus `WanDupUp3D` of the
    input when the stage upsamples (the last stage has no shortcut)."""

    def __init__(self, cin: int, cout: int, n_res: int, temporal: bool, up: bool, temporal_kernel: int = 3):
        super().__init__()
        self.avg_shortcut = WanDupUp3D(cin, cout, 2 if temporal else 1, 2) if up else None
        blocks = [WanResidualBlock(cin if i == 0 else cout, cout, temporal_kernel) for i in range(n_res)]
        if up:
            blocks.append(WanResample(cout, "up3d" if temporal else "up2d", cout, temporal_kernel))
        self.upsamples = WanSequence(blocks)

    def stages(self) -> list[Stage]:
        """The block as one stage (its shortcut adds the block's input to the last output), or, in the
        last stage, which has none, its residual blocks one by one."""
        return list(self.upsamples) if self.avg_shortcut is None else [self]

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        main = self.upsamples(x, ctx)
        if self.avg_shortcut is None:
            return main
        return self.avg_shortcut.add_into(main, x, ctx)


class Wan22Encoder(WanEncoderStages):
    """B,12,T,H/2,W/2 patchified pixels -> B,2z,T',H/16,W/16 (mu then logvar, before `conv1`)."""

    def __init__(self, cfg: Wan22Config):
        super().__init__()
        dims = [cfg.dim * m for m in (1,) + tuple(cfg.dim_mult)]
        last, tk = len(cfg.dim_mult) - 1, cfg.temporal_kernel
        self.conv1 = wan_conv(cfg.in_channels * cfg.patch_size ** 2, dims[0], (tk, 3, 3))
        self.downsamples = WanSequence([
            Wan22DownBlock(cin, cout, cfg.num_res_blocks, i < last and bool(cfg.temperal_downsample[i]), i < last, tk)
            for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:]))])
        self.middle = WanMidBlock(dims[-1], tk)
        self.head = WanHead(dims[-1], 2 * cfg.z_dim, tk)


class Wan22Decoder(WanDecoderStages):
    """B,z,T',h,w (after `conv2`) -> B,12,4(T'-1)+1,8h,8w, unpatchified by the model to 16h x 16w pixels."""

    def __init__(self, cfg: Wan22Config):
        super().__init__()
        dims = [cfg.dec_dim * m for m in (cfg.dim_mult[-1],) + tuple(reversed(cfg.dim_mult))]
        temporal_up = tuple(reversed(cfg.temperal_downsample))
        last, tk = len(cfg.dim_mult) - 1, cfg.temporal_kernel
        self.conv1 = wan_conv(cfg.z_dim, dims[0], (tk, 3, 3))
        self.middle = WanMidBlock(dims[0], tk)
        self.upsamples = WanSequence([
            Wan22UpBlock(cin, cout, cfg.num_res_blocks + 1, i < last and bool(temporal_up[i]), i < last, tk)
            for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:]))])
        self.head = WanHead(dims[-1], cfg.in_channels * cfg.patch_size ** 2, tk)

    def stages(self) -> list[Stage]:
        return [self.conv1, self.middle, *[stage for block in self.upsamples for stage in block.stages()], self.head]


class Wan22VAE(WanVAEBase):
    """The Wan2.2 TI2V-5B VAE: raw mu out, raw latent in; 48 channels, 16x / 4x."""

    family = "wan22"
    spatial_factor = 16
    latent_channels = 48
    latents_mean, latents_std = WAN22_LATENT_MEAN, WAN22_LATENT_STD
    nested_blocks = True
    probe_keys = ("encoder.conv1.weight", "encoder.downsamples.0.downsamples.0.residual.0.gamma", "decoder.conv1.weight",
                  "decoder.middle.0.residual.0.gamma", "decoder.upsamples.0.upsamples.0.residual.0.gamma",
                  "decoder.head.0.gamma")
    diffusers_probe_keys = ("encoder.conv_in.weight", "encoder.down_blocks.0.resnets.0.norm1.gamma", "decoder.conv_in.weight",
                            "decoder.mid_block.resnets.0.norm1.gamma", "decoder.up_blocks.0.resnets.0.norm1.gamma",
                            "decoder.norm_out.gamma")

    config_class = Wan22Config
    temporal_kernels = (3,)  # Qwen-Image 2.1 (`qwen21.py`) is this layout with 1

    @classmethod
    def config_from_state_dict(cls, sd, overrides):
        """Every size from the shapes (`wan_layout.read`): encoder and decoder widths, depth, RGB or
        RGBA, patch size; the decoder gives the image channels the encoder takes."""
        sizes = wan_layout.read(sd, nested=True)
        wan_layout.refuse(sizes, {"temporal_kernel": (cls.temporal_kernels, "Wan2.2 convs are 3 frames deep, "
                                                      "Qwen-Image 2.1's 1"),
                                  "upscale": ((1,), "no upscale decoder of this layout is known")}, cls.family)
        fields = {k: sizes[k] for k in ("dim", "dec_dim", "z_dim", "dim_mult", "num_res_blocks", "temperal_downsample",
                                        "in_channels", "patch_size", "temporal_kernel")}
        fields.update(overrides)
        return cls.config_class(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})

    def __init__(self, cfg: Wan22Config = Wan22Config()):
        super().__init__(cfg, Wan22Encoder(cfg), Wan22Decoder(cfg), cfg.patch_size)

    def memory_calibration(self, op):
        """The released model's coefficients, scaled by the width of the half that runs."""
        width, released = (self.config.dec_dim, self.config_class.dec_dim) if op == "decode" else \
            (self.config.dim, self.config_class.dim)
        return self.family, width / released
