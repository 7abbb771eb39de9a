"""LTX-2 video VAE (2.0 / 2.3 / 2.5) and the LTX-Video 0.9.x VAEs of its architecture: what the network is.

A re-implementation of Lightricks' `CausalVideoAutoencoder` with the checkpoint's module names (ComfyUI
core loads them as they are; diffusers' `AutoencoderKLLTX2Video` names are mapped on load,
`checkpoint.py`). Layout B,C,T,H,W; pixels in [-1, 1]; 128 latent channels; a 4x4 patchify around
the network and three 2x space(-time) resamplers: 32x spatial, 8x temporal (T = 1 + 8k <-> 1 + k).
Every norm is a per-position RMS norm over the channels ("pixel norm"); there is no attention.

- Encoder: causal in time, each conv padded with copies of frame 0. Its downsamplers are strided
  convs (0.9.0, 0.9.1) or space-to-depth blocks (0.9.5 on, LTX-2): a conv to C/s channels rearranged
  into C, plus the rearranged input averaged down to C (`LTXSpaceToDepth`); a temporal one first
  repeats frame 0, so frame 0 forms a pair of its own.
- Decoder: not causal. Each temporal conv reads one frame either side, the clip padded with copies
  of its first and last frames (`blocks.CausalConv3d.lookahead`), so each conv gives a frame one
  frame late and the residual shortcuts wait for their branch (`layers.lagged`); any chunking of
  the clip gives the whole-clip result. Upsamplers are depth-to-space blocks (`LTXDepthToSpace`),
  with the rearranged input repeated over the channels added where `residual`; a temporal one drops
  its first frame (T -> 2T - 1).
- Spatial padding: zeros in the encoder, reflect in the 2.0/2.3 decoder, zeros in 2.5 (not in the
  weights: the checkpoint's metadata config says, `checkpoint.py`).
- LTX-Video 0.9.1-0.9.8 decoders are conditioned on a decode timestep (0.05): per-channel scale and
  shift after the norms from small MLPs, and noise: the latent mixed with Gaussian noise (scale
  0.025, in the normalised latent space) and per-channel noise maps after the convs of some blocks.
  Upstream draws that noise unseeded; here it is drawn from `noise_seed`, per latent frame and per
  layer, so a decode is reproducible and the same however it is chunked or tiled.

`per_channel_statistics` normalise the latent for the diffusion model: core's LATENT is
(raw - mean) / std, what `to_model_space` gives. How the network runs is the engine's job.
"""
from functools import partial

import torch
import torch.nn as nn

from ..execution import RunState
from ..layers import patchify, unpatchify
from ..video_vae import Stage, VideoVAE, run_stages
from . import checkpoint
from .blocks import (
    PIXEL_NORM,
    ConvKind,
    LTX2Config,
    LTXConv,
    LTXDepthToSpace,
    LTXResGroup,
    LTXResnetBlock,
    LTXSpaceToDepth,
    LTXTimeEmbedder,
    PixelNormAct,
    seeded_normal,
)


class LTXEncoder(nn.Module):
    """B,Cin*p*p,T,H/p,W/p patchified pixels -> B,moment channels,T',H/32,W/32."""

    def __init__(self, cfg: LTX2Config, moment_channels: int):
        super().__init__()
        conv = ConvKind(0, cfg.encoder_padding)
        width = cfg.encoder_channels
        self.conv_in = conv(cfg.in_channels * cfg.patch_size ** 2, width)
        blocks = []
        for block in cfg.encoder_blocks:
            if block.name == "res_x":
                blocks.append(LTXResGroup(width, block, conv))
            elif block.name == "res_x_y":
                blocks.append(LTXResnetBlock(width, width * block.multiplier, conv))
            elif block.name.endswith("_res"):
                blocks.append(LTXSpaceToDepth(width, block, conv))
            else:  # a strided conv
                blocks.append(conv(width, width * block.multiplier, block.stride))
            width *= block.multiplier if block.name != "res_x" else 1
        self.down_blocks = nn.ModuleList(blocks)
        self.conv_out = conv(width, moment_channels)

    def stages(self) -> list[Stage]:
        stages = [self.conv_in.conv]
        for block in self.down_blocks:
            stages += block.stages() if isinstance(block, LTXResGroup) else [block.conv if isinstance(block, LTXConv) else block]
        return stages + [partial(self.conv_out.conv, norm=PIXEL_NORM)]

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return run_stages(self.stages(), x, ctx)


class LTXDecoder(nn.Module):
    """B,latent,T',h,w raw latent -> B,Cout*p*p,8(T'-1)+1,8h,8w, unpatchified by the model."""

    def __init__(self, cfg: LTX2Config):
        super().__init__()
        self.config = cfg
        conv = ConvKind(0 if cfg.causal_decoder else 1, cfg.decoder_padding)
        conditioned = cfg.timestep_conditioning
        width = cfg.decoder_channels
        self.conv_in = conv(cfg.latent_channels, width)
        blocks, noise_maps = [], 0
        for block in cfg.decoder_blocks:
            if block.name == "res_x":
                noise = (cfg.noise_seed, noise_maps) if block.inject_noise else None
                noise_maps += 2 * block.num_layers if block.inject_noise else 0
                blocks.append(LTXResGroup(width, block, conv, conditioned, noise))
            elif block.name == "res_x_y":
                blocks.append(LTXResnetBlock(width, width // block.multiplier, conv))
            else:
                blocks.append(LTXDepthToSpace(width, block, conv))
            width //= block.multiplier if block.name != "res_x" else 1
        self.up_blocks = nn.ModuleList(blocks)
        self.conv_out = conv(width, cfg.in_channels * cfg.patch_size ** 2)
        if conditioned:
            self.timestep_scale_multiplier = nn.Parameter(torch.tensor(1000.0))
            self.last_time_embedder = LTXTimeEmbedder(2 * width)
            self.last_scale_shift_table = nn.Parameter(torch.zeros(2, width))

    def timestep(self, dtype: torch.dtype) -> torch.Tensor:
        """The scaled decode timestep (1,) the conditioning MLPs read, computed in `dtype` as upstream does."""
        return (self.config.decode_timestep * self.timestep_scale_multiplier.to(dtype)).reshape(1)

    def _head_conditioning(self, x: torch.Tensor):
        """(scale, shift) after the last norm of a conditioned decoder, per channel."""
        values = self.last_time_embedder(self.timestep(x.dtype)).view(2, -1) + self.last_scale_shift_table.to(x.dtype)
        return values[1], values[0]

    def stages(self) -> list[Stage]:
        timestep = self.timestep if self.config.timestep_conditioning else None
        stages = [self.conv_in.conv]
        for block in self.up_blocks:
            stages += block.stages(timestep) if isinstance(block, LTXResGroup) else [block]
        norm = PixelNormAct(self._head_conditioning) if self.config.timestep_conditioning else PIXEL_NORM
        return stages + [partial(self.conv_out.conv, norm=norm)]

    def forward(self, z: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return run_stages(self.stages(), z, ctx)


class LTXLatentStatistics(nn.Module):
    """The latent's per-channel mean and standard deviation (keys `per_channel_statistics.*`)."""

    def __init__(self, channels: int):
        super().__init__()
        self.register_buffer("mean-of-means", torch.zeros(channels))
        self.register_buffer("std-of-means", torch.ones(channels))

    def mean_std(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, -1) + (1,) * (z.dim() - 2)
        return (self.get_buffer("mean-of-means").to(z).view(shape), self.get_buffer("std-of-means").to(z).view(shape))


class LTX2VAE(VideoVAE):
    """The LTX-2 family: raw posterior mean out, raw latent in; 128 channels, 32x / 8x; core's LATENT
    is the latent normalised by the checkpoint's per-channel statistics."""

    family = "ltx2"
    spatial_factor = 32
    temporal_factor = 8
    latent_channels = 128
    comfy_latent_in_model_space = True
    probe_keys = ("encoder.conv_in.conv.weight", "decoder.conv_in.conv.weight", "decoder.conv_out.conv.weight",
                  "decoder.up_blocks.0.res_blocks.0.conv1.conv.weight", "per_channel_statistics.mean-of-means")

    @classmethod
    def native_state_dict(cls, state_dict):
        return checkpoint.native(state_dict, cls.probe_keys)

    @classmethod
    def metadata_overrides(cls, metadata):
        return checkpoint.from_metadata(metadata)

    @classmethod
    def config_from_state_dict(cls, sd, overrides):
        return checkpoint.config(sd, overrides)

    @classmethod
    def refusal(cls, sd):
        if any(k.startswith(("audio_vae.", "vocoder.")) for k in sd):
            return ("this is LTX-2's audio VAE (audio_vae./vocoder. keys); StreamVAE runs the video VAE only: load it with "
                    "core ComfyUI's Load LTXV Audio VAE node (LTXVAudioVAELoader), and this file's video VAE, if it has "
                    "one, with StreamVAE")
        return None

    def __init__(self, cfg: LTX2Config = LTX2Config()):
        super().__init__()
        self.config = cfg
        self.latent_channels = cfg.latent_channels
        self.in_channels = self.out_channels = cfg.in_channels
        self.spatial_factor, self.temporal_factor = cfg.spatial_factor, cfg.temporal_factor
        moments = {"per_channel": 2 * cfg.latent_channels, "none": cfg.latent_channels}.get(cfg.latent_log_var,
                                                                                             cfg.latent_channels + 1)
        self.encoder = LTXEncoder(cfg, moments)
        self.decoder = LTXDecoder(cfg)
        self.per_channel_statistics = LTXLatentStatistics(cfg.latent_channels)

    def encode_stages(self) -> list[Stage]:
        return [lambda x, ctx: patchify(x, self.config.patch_size), *self.encoder.stages()]

    def decode_stages(self) -> list[Stage]:
        noised = self.config.timestep_conditioning and self.config.decode_noise_scale > 0
        return ([self._noised_latent] if noised else []) + self.decoder.stages() + [
            lambda x, ctx: unpatchify(x, self.config.patch_size)]

    def _noised_latent(self, z: torch.Tensor, ctx: RunState) -> torch.Tensor:
        """A conditioned decoder's input: (1 - s) * z + s * noise in the normalised latent space (s =
        `decode_noise_scale`), the noise of latent frame i drawn for (noise_seed, i)."""
        first = ctx.cache.advance(self, z.shape[2])
        b, c, t, h, w = z.shape
        noise = torch.stack([seeded_normal((b, c, h, w), self.config.noise_seed, 0, first + i) for i in range(t)], dim=2)
        s = self.config.decode_noise_scale
        mixed = self.to_model_space(z) * (1.0 - s) + noise.to(device=z.device, dtype=z.dtype) * s
        return self.from_model_space(mixed)

    def moments(self, h: torch.Tensor):
        c, kind = self.latent_channels, self.config.latent_log_var
        mean = h[:, :c]
        if kind == "per_channel":
            logvar = h[:, c:2 * c]
        elif kind == "uniform":
            logvar = h[:, c:c + 1].expand_as(mean)
        else:  # constant, none: upstream's stand-in for no variance
            logvar = torch.full_like(mean, -30.0)
        return mean, logvar.clamp(-30.0, 20.0)

    def to_model_space(self, z: torch.Tensor) -> torch.Tensor:
        """(raw - mean) / std: the latent the LTX DiT sees (core's LATENT)."""
        mean, std = self.per_channel_statistics.mean_std(z)
        return (z - mean) / std

    def from_model_space(self, z: torch.Tensor) -> torch.Tensor:
        mean, std = self.per_channel_statistics.mean_std(z)
        return z * std + mean

    def memory_calibration(self, op):
        """The released model's coefficients, scaled by the width of the half that runs."""
        if op == "decode":
            return self.family, self.config.decoder_channels / LTX2Config.decoder_channels
        return self.family, self.config.encoder_channels / LTX2Config.encoder_channels
