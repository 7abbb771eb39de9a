"""LTX-2.5's VAE with the diffusion decoder (family "ltx25"; core 0.33.0's `CausalDiffusionVAE`, "LTX 2.4
diffusion VAE", checkpoint key `decoder.conv_in_x_t.weight`): what the network is.

- Encoder: LTX-2's causal conv encoder (`vae/model/ltx2/`), the 2.4/2.5 block list, zero padding, a
  constant log variance. Pixels B,3,1+8k,H,W in [-1, 1] -> raw latent B,128,1+k,H/32,W/32.
- Decoder (`LTX25Decoder`, core's `NADiffusionDecoder`): a raw latent B,128,T,h,w and noise
  B,3,8(T-1)+1,32h,32w in, pixels out.
  - Stages 1-4 (`context`): the latent, its last frame repeated `trailing_frames` more times, through
    `conv_in` (a linear per token) and the neighbourhood-attention blocks of each stage, each stage
    followed by its linear pixel-shuffle upsample (a temporal one drops its duplicate first frame); the
    repeated frames' share is cropped after stage 4: the context B,T5,H5,W5,C5, one token per 4x4 pixels.
  - Stage 5 (`denoise`): the noised pixels x_t, patchified 4x4, through `conv_in_x_t`, the diffusion NA
    blocks (each adds the context, AdaLN-Zero from the timestep's embedding), `norm_out`, `conv_out`,
    unpatchified: the model's prediction (x0, or v) for that timestep.
  - `forward`: the sampling loop over `num_inference_steps` timesteps from 1; the released decoder takes
    one step and its x0 prediction is the output.
- The noise is drawn as core draws it (`draw_noise`): once for the clip, `randn(B,3,T,H,W)` from a
  generator of the decode's device seeded with `LTX25Config.noise_seed` (core: 0, the default).

`forward` (`decode_clip`) runs the decoder on a whole clip at once: the reference. A run's decode is one stage
per layer (`decode_stages`) on the run's temporal chunks of whole frames (`clip_extent`:
`ClipExtent.UNTILED_CHUNKS`), each layer giving the frames whose windows it has seen, the same frames late
(`streaming.py`). `per_channel_statistics` normalise the latent for the diffusion model: core's LATENT is
(raw - mean) / std, as for LTX-2.
"""
import torch
import torch.nn as nn

from ..layers import patchify as patchify_pixels
from ..ltx2.network import LTX2VAE, LTXEncoder, LTXLatentStatistics
from ..video_vae import ClipExtent, Stage, VideoVAE
from . import checkpoint, streaming
from .blocks import (
    LTX25AdaLN,
    LTX25Config,
    LTX25DiffusionBlock,
    LTX25NABlock,
    LTX25RMSNorm,
    LTX25TimestepEmbedder,
    LTX25Upsample,
    draw_noise,
    patchify,
    sampling_step,
    unpatchify,
)


class LTX25Decoder(nn.Module):
    """Keys `decoder.*` of the checkpoint (core's names)."""

    def __init__(self, cfg: LTX25Config):
        super().__init__()
        self.config = cfg
        widths = cfg.stage_channels
        self.conv_in = nn.Linear(cfg.latent_channels, widths[0])
        self.det_stages = nn.ModuleList(
            nn.ModuleList(LTX25NABlock(widths[i], cfg.stage_kernels[i], cfg.head_dim, cfg.mlp_hidden[i])
                          for _ in range(cfg.stage_depths[i]))
            for i in range(len(cfg.upsample_strides)))
        self.upsamples = nn.ModuleList(LTX25Upsample(widths[i], widths[i + 1], stride)
                                       for i, stride in enumerate(cfg.upsample_strides))
        self.t_embedder = LTX25TimestepEmbedder(cfg.timestep_channels, cfg.t_emb_dim)
        pixel_channels = cfg.out_channels * cfg.patch_size ** 2
        self.conv_in_x_t = nn.Linear(pixel_channels, widths[-1])
        self.shared_adaln = LTX25AdaLN(widths[-1], cfg.t_emb_dim)
        self.diff_blocks = nn.ModuleList(LTX25DiffusionBlock(widths[-1], cfg.stage5_kernel, cfg.head_dim, cfg.mlp_hidden[-1])
                                         for _ in range(cfg.stage_depths[-1]))
        self.norm_out = LTX25RMSNorm(widths[-1])
        self.conv_out = nn.Linear(widths[-1], pixel_channels)

    def pixel_shape(self, latent_shape) -> tuple[int, ...]:
        """The shape of the frames (and of the noise) a latent B,C,T,h,w decodes to."""
        cfg = self.config
        b, _, t, h, w = latent_shape
        scale = cfg.spatial_factor
        return b, cfg.out_channels, cfg.stage_frames(t)[-1], h * scale, w * scale

    def context(self, z: torch.Tensor) -> torch.Tensor:
        """Stages 1-4 on a whole clip: raw latent B,C,T,h,w -> context B,T5,H5,W5,C5."""
        n = self.config.trailing_frames
        z = torch.cat([z, z[:, :, -1:].expand(-1, -1, n, -1, -1)], dim=2)  # B,C,T+n,h,w
        x = self.conv_in(z.permute(0, 2, 3, 4, 1))  # B,T+n,h,w,C -> B,T+n,h,w,C0
        for blocks, upsample in zip(self.det_stages, self.upsamples):
            for block in blocks:
                x = block(x)
            x = upsample(x)
        return x[:, :x.shape[1] - n * self.config.temporal_factor]

    def modulation(self, t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """The shared AdaLN values (MODULATION_CHUNKS x B,1,1,1,C5) for the timesteps t (B,)."""
        return self.shared_adaln(self.t_embedder(self.config.timestep_scale_multiplier * t, dtype))

    def denoise(self, context: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """One stage-5 pass: context B,T5,H5,W5,C5 and x_t B,3,T,H,W at timesteps t (B,) -> the prediction
        B,3,T,H,W."""
        x = self.conv_in_x_t(patchify(x_t, self.config.patch_size))  # B,T5,H5,W5,48 -> B,T5,H5,W5,C5
        modulation = self.modulation(t, x.dtype)
        for block in self.diff_blocks:
            x = block(x, context, modulation)
        return unpatchify(self.conv_out(self.norm_out(x)), self.config.patch_size)

    def timesteps(self, device) -> torch.Tensor:
        steps = self.config.num_inference_steps
        return torch.linspace(1.0, 1.0 / steps, steps, device=device)

    def forward(self, z: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Raw latent B,C,T,h,w and the noise x_t (`pixel_shape`) -> pixels B,3,8(T-1)+1,32h,32w: each step
        predicts x0 (or v) and moves x_t along the straight path to the next timestep (an Euler step), as
        upstream; the last step's x0 is the output."""
        context = self.context(z)
        timesteps, batch, x0 = self.timesteps(z.device), z.shape[0], self.config.model_output_type == "x0"
        x_t = noise
        for step, t in enumerate(timesteps):
            x_t = sampling_step(x_t, self.denoise(context, x_t, t.expand(batch)), timesteps, step, x0)
        return x_t


class LTX25VAE(VideoVAE):
    """The LTX-2.5 diffusion-decoder family: raw posterior mean out, raw latent in; 128 channels, 32x / 8x;
    core's LATENT is the latent normalised by the checkpoint's per-channel statistics."""

    family = "ltx25"
    spatial_factor = 32
    temporal_factor = 8
    latent_channels = 128
    comfy_latent_in_model_space = True
    probe_keys = checkpoint.PROBE_KEYS

    @classmethod
    def native_state_dict(cls, state_dict):
        return checkpoint.native(state_dict)

    @classmethod
    def metadata_overrides(cls, metadata):
        return checkpoint.from_metadata(metadata)

    @classmethod
    def config_from_state_dict(cls, sd, overrides):
        return checkpoint.config(sd, overrides)

    def __init__(self, cfg: LTX25Config = LTX25Config()):
        super().__init__()
        self.config = cfg
        self.latent_channels = cfg.latent_channels
        self.out_channels = cfg.out_channels
        self.spatial_factor, self.temporal_factor = cfg.spatial_factor, cfg.temporal_factor
        moments = {"per_channel": 2 * cfg.latent_channels, "none": cfg.latent_channels}.get(
            cfg.encoder.latent_log_var, cfg.latent_channels + 1)
        self.encoder = LTXEncoder(cfg.encoder, moments)
        self.decoder = LTX25Decoder(cfg)
        self.per_channel_statistics = LTXLatentStatistics(cfg.latent_channels)

    def encode_stages(self) -> list[Stage]:
        return [lambda x, ctx: patchify_pixels(x, self.config.encoder.patch_size), *self.encoder.stages()]

    def decode_stages(self) -> list[Stage]:
        """One stage per layer, each giving the frames its windows have seen whole (`streaming.stages`)."""
        return streaming.stages(self.decoder, self.config.noise_seed)

    def clip_extent(self, op: str) -> ClipExtent:
        """The decoder runs in temporal chunks of whole frames (its layers keep their own state between chunks:
        `streaming`), never in exact tiles (it has no convs); the encoder is chunked and tiled as LTX-2's."""
        return ClipExtent.UNTILED_CHUNKS if op == "decode" else ClipExtent.CHUNKS

    def looks_ahead(self, op: str) -> bool:
        """The decoder's attention windows look ahead in time: its frames come late, the last ones with the
        clip's last chunk (`streaming`)."""
        return op == "decode" or super().looks_ahead(op)

    def decode_clip(self, z: torch.Tensor, seed: int = 0) -> torch.Tensor:
        """A raw latent B,128,T,h,w -> pixels B,3,8(T-1)+1,32h,32w, in one pass over the whole clip, the noise
        drawn from `seed` on z's device in z's dtype (seed 0: core's frames)."""
        return self.decoder(z, draw_noise(self.decoder.pixel_shape(z.shape), seed, z.dtype, z.device))

    def moments(self, h: torch.Tensor):
        """(mean, logvar): the first `latent_channels` of the encoder's output and its log variance."""
        c, kind = self.latent_channels, self.config.encoder.latent_log_var
        mean = h[:, :c]
        if kind == "per_channel":
            logvar = h[:, c:2 * c]
        elif kind == "uniform":
            logvar = h[:, c:c + 1].expand_as(mean)
        else:  # constant (the released encoder), none: upstream's stand-in for no variance
            logvar = torch.full_like(mean, -30.0)
        return mean, logvar.clamp(-30.0, 20.0)

    # (raw - mean) / std and back, as LTX-2's: the latent the LTX DiT sees is core's LATENT
    to_model_space = LTX2VAE.to_model_space
    from_model_space = LTX2VAE.from_model_space
