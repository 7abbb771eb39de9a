"""MiniMax-H3 checkpoints: every size read from the shapes (core's key names, the released file's), shapes
that fit no network core builds refused by name, and core's detection keys.

Key names: `encoder.down.<level>.block.<i>.{norm1,conv1,norm2,conv2,nin_shortcut}`,
`encoder.down.<level>.downsample.conv`, `quant_conv`, `post_quant_conv`,
`decoder.{x_embedder,register_tokens,mask_token,norm_out,proj_out}`,
`decoder.transformer_blocks.<i>.{norm1,attn.to_qkv,attn.to_out,scale1,norm2,ff.w1,ff.w2,scale2}`,
`latents_mean`, `latents_std` (a file without them takes core's: `config.LATENTS_MEAN`, `LATENTS_STD`).
"""
import torch

from ..video_vae import LayoutError
from .config import LATENTS_MEAN, LATENTS_STD, MiniMaxH3Config

# Core's detection (comfy/sd.py): both keys identify a MiniMax-H3 video VAE file.
PROBE_KEYS = ("decoder.transformer_blocks.0.scale1", "encoder.down.5.block.0.conv1.weight")
STATISTICS = {"latents_mean": LATENTS_MEAN, "latents_std": LATENTS_STD}


def quantized_layers(sd: dict) -> list[str]:
    """The layers of the int8 (convrot) file that are quantized (each has a `<layer>.comfy_quant` key)."""
    return sorted(k.removesuffix(".comfy_quant") for k in sd if k.endswith(".comfy_quant"))


def with_statistics(sd: dict) -> dict:
    """`sd` with core's latent statistics where it has none and its latent has their 24 channels (core's
    `MiniMaxH3VideoVAE` holds them as constants; a file of other latent channels must carry its own)."""
    quant = sd.get("quant_conv.weight")
    if quant is None or quant.shape[0] != 2 * len(LATENTS_MEAN):
        return sd
    return {**{k: torch.tensor(v) for k, v in STATISTICS.items() if k not in sd}, **sd}


def _count(sd: dict, prefix: str) -> int:
    """How many consecutive indices i have keys starting with prefix + "i."."""
    n = 0
    while any(k.startswith(f"{prefix}{n}.") for k in sd):
        n += 1
    return n


def _shape(sd: dict, key: str) -> tuple[int, ...]:
    return tuple(sd[key].shape)


def config_from_state_dict(sd: dict, **constants) -> MiniMaxH3Config:
    """The config the shapes of `sd` (core's key names) describe; `constants` set what no weight says
    (the tests' smaller tiles). LayoutError names the shapes that fit no network core builds."""
    levels = _count(sd, "encoder.down.")
    if levels == 0:
        raise LayoutError("no encoder.down.<level> keys: not a MiniMax-H3 video VAE in core's key names")
    base = MiniMaxH3Config(**constants)
    if levels != len(base.space_down):
        raise LayoutError(f"{levels} encoder levels; the MiniMax-H3 network has {len(base.space_down)}")
    conv_in = _shape(sd, "encoder.conv_in.weight")
    widths = [_shape(sd, f"encoder.down.{i}.block.0.conv1.weight")[0] for i in range(levels)]
    if any(w % conv_in[0] for w in widths) or any(w % 32 for w in widths):
        raise LayoutError(f"encoder level widths {widths}: not multiples of conv_in's {conv_in[0]} channels "
                          "and of the 32 groups of its norms")
    downs = tuple(f"encoder.down.{i}.downsample.conv.weight" in sd for i in range(levels))
    if downs != tuple(base.downsamples(i) for i in range(levels)):
        raise LayoutError(f"encoder levels with a downsampler {downs}; the network downsamples at levels "
                          f"{tuple(base.downsamples(i) for i in range(levels))}")
    conv_out, quant = _shape(sd, "encoder.conv_out.weight"), _shape(sd, "quant_conv.weight")
    post, embedder = _shape(sd, "post_quant_conv.weight"), _shape(sd, "decoder.x_embedder.weight")
    z_channels, embed_dim = conv_out[0] // 2, quant[0] // 2
    if conv_out[0] % 2 or quant[:2] != (2 * embed_dim, 2 * z_channels) or post[:2] != (z_channels, embed_dim) \
            or embedder[1] != z_channels:
        raise LayoutError(f"encoder.conv_out.weight {conv_out}, quant_conv.weight {quant}, post_quant_conv.weight "
                          f"{post} and decoder.x_embedder.weight {embedder} do not agree on the latent channels")
    dim = embedder[0]
    w1 = _shape(sd, "decoder.transformer_blocks.0.ff.w1.weight")
    if w1[0] % (2 * dim):
        raise LayoutError(f"decoder.transformer_blocks.0.ff.w1.weight {w1}: not a gated FFN of a multiple of {dim}")
    proj = _shape(sd, "decoder.proj_out.weight")
    if proj[0] % base.patch_pixels:
        raise LayoutError(f"decoder.proj_out.weight {proj}: {proj[0]} outputs are not whole "
                          f"{base.temporal_factor}x{base.spatial_factor}x{base.spatial_factor} pixel patches")
    fields = dict(in_channels=conv_in[1], base_channels=conv_in[0], multipliers=tuple(w // conv_in[0] for w in widths),
                  res_blocks=tuple(_count(sd, f"encoder.down.{i}.block.") for i in range(levels)),
                  z_channels=z_channels, embed_dim=embed_dim, dim=dim, layers=_count(sd, "decoder.transformer_blocks."),
                  ff_mult=w1[0] // (2 * dim), register_tokens=_shape(sd, "decoder.register_tokens")[1],
                  out_channels=proj[0] // base.patch_pixels)
    try:
        return MiniMaxH3Config(**{**constants, **fields})
    except ValueError as error:
        raise LayoutError(f"decoder.x_embedder.weight {embedder}: {error}") from error
