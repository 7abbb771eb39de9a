"""Wan2.1 causal 3-D VAE (`Wan2.1_VAE.pth`, ComfyUI `wan_2.1_vae.safetensors`), and the VAEs of its
architecture at other sizes (Qwen-Image, Qwen-Image-Layered, pruned widths, 2x upscale decoders).

The Wan blocks (`vae/model/wan/network.py`, which Wan2.2 shares) in Wan2.1's order, with the released
module names, so the 194 keys load strictly. Layout B,C,T,H,W; pixels in [-1, 1]; 8x spatial and 4x
temporal compression (T = 1 + 4k <-> 1 + k latent frames); 16 latent channels; `encode` returns the
raw posterior mean (what ComfyUI's VAE returns).
"""
from dataclasses import dataclass

from ..wan import checkpoint
from ..wan.network import (
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


class Wan21VAE(WanVAEBase):
    """The Wan2.1 VAE (also used by Wan2.2 A14B): raw mu out, raw latent in; 16 channels, 8x / 4x.
    Also the VAEs of its architecture at other sizes, read from the weights (`checkpoint.py`):
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
        """Every size from the shapes (`checkpoint.read`): any width and depth, RGB or RGBA, and
        decoders that emit an upscale^2 pixel block per pixel (ComfyUI's conv_out_channels)."""
        sizes = checkpoint.read(sd, nested=False)
        checkpoint.refuse(sizes, {"temporal_kernel": ((3,), "Wan2.1 convs are 3 frames deep"),
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
