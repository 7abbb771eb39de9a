"""HunyuanVideo 1.0 causal 3-D VAE (ComfyUI `hunyuan_video_vae_bf16.safetensors`), which Kandinsky 5 and 6
decode with too.

A re-implementation of diffusers' `AutoencoderKLHunyuanVideo` (Tencent's `AutoencoderKLCausal3D`) with its
module names, those of the released file; core's names are mapped on load (`checkpoint.py`, which
also reads every size from the shapes). Layout B,C,T,H,W; pixels in [-1, 1]; 8x spatial and 4x temporal
compression (T = 1 + 4k <-> 1 + k latent frames); 16 latent channels; `encode` returns the raw
posterior mean (after `quant_conv`), `decode` takes the raw latent (before `post_quant_conv`).

Every norm is a GroupNorm over the whole clip (`model.clip_norm.ClipGroupNorm`), so a run is exact only with
every frame of a norm's input seen before it normalises one: the engine runs the clip in one chunk, or in
several once passes over the clip have gathered every norm's statistics (`clip_extent` is
`ClipExtent.CHUNKS_AFTER_STATISTICS`, the capability `CLIP_STATISTICS`; `run.clip_statistics`), in exact
tiles where asked.

`Hv10Config.frames` is a load choice: "model" (the trained network: whole-clip statistics, frame-causal
mid-block attention; diffusers' model decoding the whole clip) or "core" (ComfyUI 0.33.0's frames: its
up and down paths run in carried chunks of two latent frames, each normalised by its own statistics,
its encoder's first chunk is frame 0 alone, which shifts how its strided convs pair frames, and its
mid-block attention is unmasked).
"""
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn as nn

from ..blocks import Conv3d
from ..clip_norm import ClipGroupNorm, Windows
from ..execution import RunState
from ..hv15.network import hv15_conv
from ..video_vae import ClipExtent, Stage, VideoVAE
from . import checkpoint
from .blocks import Hv10Attention, Hv10Downsample, Hv10MidBlock, Hv10Stage, Hv10Upsample

# diffusers' `scaling_factor` and core's latent format `HunyuanVideo`: the diffusion model sees raw * 0.476986.
HV10_SCALING_FACTOR = 0.476986
FRAMES = ("model", "core")
CORE_DECODE_WINDOWS, CORE_ENCODE_WINDOWS = Windows(2, 0), Windows(2, 1)


@dataclass(frozen=True)
class Hv10Config:
    """Released config (diffusers `AutoencoderKLHunyuanVideo()`); every size is read from the weights.
    Every stage but the last resamples in space, the two before the last also in time (8x / 4x with the
    released four stages). `norm_groups` is 32 in the release and in core (no weight says it); `frames`
    is a load choice (module docstring)."""

    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    latent_channels: int = 16
    in_channels: int = 3
    out_channels: int = 3
    norm_groups: int = 32
    frames: str = "model"

    def __post_init__(self):
        if self.frames not in FRAMES:
            raise ValueError(f"hv10 frames must be one of {FRAMES}, got {self.frames!r}")
        odd = [w for w in self.block_out_channels if w % self.norm_groups]
        if odd:
            raise ValueError(f"hv10 stage widths {odd} do not split into {self.norm_groups} norm groups")

    @property
    def spatial_compression(self) -> int:
        return 2 ** (len(self.block_out_channels) - 1)

    def temporal_stages(self) -> set[int]:
        """The stages whose resampler also resamples in time (encoder and decoder count from their input)."""
        n = len(self.block_out_channels)
        return {n - 3, n - 2}


def _norms(groups: int, frames_per_latent: int, windows: Windows | None):
    """The norm factory of one layer: `ClipGroupNorm(channels)` with its temporal factor and span."""
    return partial(ClipGroupNorm, groups=groups, frames_per_latent=frames_per_latent, windows=windows)


class Hv10Encoder(nn.Module):
    """B,Cin,T,H,W pixels -> B,2z,T',H/8,W/8 (before `quant_conv`)."""

    def __init__(self, cfg: Hv10Config):
        super().__init__()
        core, widths = cfg.frames == "core", cfg.block_out_channels
        self.conv_in = hv15_conv(cfg.in_channels, widths[0])
        self.down_blocks = nn.ModuleList()
        ch, rate = widths[0], 4
        for i, width in enumerate(widths):
            norm = _norms(cfg.norm_groups, rate, CORE_ENCODE_WINDOWS if core else None)
            temporal = i in cfg.temporal_stages()
            down = Hv10Downsample(width, temporal, core) if i < len(widths) - 1 else None
            blocks = [(ch if j == 0 else width, width) for j in range(cfg.layers_per_block)]
            self.down_blocks.append(Hv10Stage(blocks, norm, down, "downsamplers"))
            ch, rate = width, rate // 2 if temporal else rate
        latent_norm = _norms(cfg.norm_groups, 1, None)
        self.mid_block = Hv10MidBlock(ch, core, latent_norm)
        self.conv_norm_out = latent_norm(ch)
        self.conv_out = hv15_conv(ch, 2 * cfg.latent_channels)

    def blocks(self) -> list[Stage]:
        return [s for stage in self.down_blocks for s in stage.stages()] + self.mid_block.stages()


class Hv10Decoder(nn.Module):
    """B,z,T',h,w (after `post_quant_conv`) -> B,Cout,4(T'-1)+1,8h,8w pixels, not clamped."""

    def __init__(self, cfg: Hv10Config):
        super().__init__()
        core, widths = cfg.frames == "core", tuple(reversed(cfg.block_out_channels))
        self.conv_in = hv15_conv(cfg.latent_channels, widths[0])
        self.mid_block = Hv10MidBlock(widths[0], core, _norms(cfg.norm_groups, 1, None))
        self.up_blocks = nn.ModuleList()
        ch, rate = widths[0], 1
        for i, width in enumerate(widths):
            norm = _norms(cfg.norm_groups, rate, CORE_DECODE_WINDOWS if core else None)
            temporal = i in cfg.temporal_stages()
            up = Hv10Upsample(width, temporal) if i < len(widths) - 1 else None
            blocks = [(ch if j == 0 else width, width) for j in range(cfg.layers_per_block + 1)]
            self.up_blocks.append(Hv10Stage(blocks, norm, up, "upsamplers"))
            ch, rate = width, rate * 2 if temporal else rate
        self.conv_norm_out = _norms(cfg.norm_groups, rate, CORE_DECODE_WINDOWS if core else None)(ch)
        self.conv_out = hv15_conv(ch, cfg.out_channels)

    def blocks(self) -> list[Stage]:
        return self.mid_block.stages() + [s for stage in self.up_blocks for s in stage.stages()]


class Hv10VAE(VideoVAE):
    """The HunyuanVideo 1.0 VAE (Kandinsky 5 and 6 use it): raw mean out, raw latent in; 16 channels, 8x / 4x."""

    family = "hv10"  # shown as "HunyuanVideo 1.0 / Kandinsky"
    spatial_factor = 8
    latent_channels = 16
    probe_keys = checkpoint.ORIGINAL_PROBES

    def __init__(self, cfg: Hv10Config = Hv10Config()):
        super().__init__()
        self.config = cfg
        self.latent_channels, self.in_channels, self.out_channels = cfg.latent_channels, cfg.in_channels, cfg.out_channels
        self.spatial_factor = cfg.spatial_compression
        self.encoder = Hv10Encoder(cfg)
        self.decoder = Hv10Decoder(cfg)
        self.quant_conv = Conv3d(2 * cfg.latent_channels, 2 * cfg.latent_channels, 1)
        self.post_quant_conv = Conv3d(cfg.latent_channels, cfg.latent_channels, 1)

    @classmethod
    def native_state_dict(cls, state_dict):
        return checkpoint.native(state_dict)

    @classmethod
    def config_from_state_dict(cls, sd, overrides):
        return Hv10Config(**{**checkpoint.read(sd), **overrides})

    def _decode_in(self, z: torch.Tensor, ctx: RunState) -> torch.Tensor:
        """conv_in(post_quant_conv(z))."""
        return self.decoder.conv_in(self.post_quant_conv(z, ctx), ctx)

    def _decode_out(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return self.decoder.conv_out(x, ctx, norm=self.decoder.conv_norm_out)

    def _encode_out(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        """quant_conv(conv_out(SiLU(conv_norm_out(x))))."""
        return self.quant_conv(self.encoder.conv_out(x, ctx, norm=self.encoder.conv_norm_out), ctx)

    def encode_stages(self) -> list[Stage]:
        return [self.encoder.conv_in, *self.encoder.blocks(), self._encode_out]

    def decode_stages(self) -> list[Stage]:
        return [self._decode_in, *self.decoder.blocks(), self._decode_out]

    def clip_extent(self, op: str) -> ClipExtent:
        """Chunks once every norm's whole-clip statistics are known (core's frames: its windows' statistics,
        and the mid-block's still span the clip)."""
        return ClipExtent.CHUNKS_AFTER_STATISTICS

    def prefill_stages(self, op: str) -> list[Stage]:
        """Core's unmasked attention needs every frame's keys first: the stages up to the mid-block attention."""
        if self.config.frames != "core":
            return []
        stages = self.decode_stages() if op == "decode" else self.encode_stages()
        return stages[:stages.index(self._attention(op)) + 1]

    def _attention(self, op: str) -> Hv10Attention:
        return (self.decoder if op == "decode" else self.encoder).mid_block.attentions[0]

    def attention_cache_elements(self, op: str, batch: int, latent_frames: int, latent_hw: tuple[int, int]) -> int:
        """The mid-block attention's keys and values of the whole clip (at the latent resolution)."""
        return 2 * batch * latent_frames * latent_hw[0] * latent_hw[1] * self._attention(op).channels

    def encode_modules(self) -> list[nn.Module]:
        return [self.encoder, self.quant_conv]

    def decode_modules(self) -> list[nn.Module]:
        return [self.post_quant_conv, self.decoder]

    def moments(self, h):
        mean, logvar = h.chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)  # the clamp diffusers' DiagonalGaussianDistribution applies

    def to_model_space(self, z: torch.Tensor) -> torch.Tensor:
        """raw * 0.476986: what the HunyuanVideo 1.0 and Kandinsky 5 video DiTs see (core's latent format `HunyuanVideo`)."""
        return z * HV10_SCALING_FACTOR

    def from_model_space(self, z: torch.Tensor) -> torch.Tensor:
        return z / HV10_SCALING_FACTOR
