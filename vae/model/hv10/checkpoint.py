"""HunyuanVideo 1.0 checkpoints (also the VAE of Kandinsky 5 and 6): the rule that tells them from
HunyuanVideo 1.5's, every size read from the tensor shapes, and ComfyUI core's key names mapped to the
original ones (`network.py`'s modules).

Original names: Tencent's `AutoencoderKLCausal3D`, the released `hunyuan_video_vae_bf16.safetensors`, and
diffusers' `AutoencoderKLHunyuanVideo` (the same tree): `encoder.down_blocks.i.resnets.j.*`,
`encoder.down_blocks.i.downsamplers.0.conv.conv.*`, `{encoder,decoder}.mid_block.{resnets.0,attentions.0,
resnets.1}` (attention `group_norm`, `to_q`, `to_k`, `to_v`, `to_out.0` as linear weights C,C),
`decoder.up_blocks.i.resnets.j`, `decoder.up_blocks.i.upsamplers.0.conv.conv.*`, `conv_norm_out`,
shortcuts `conv_shortcut.conv.*`, and `quant_conv` / `post_quant_conv` at the top. Core's names (its
loader converts the original ones, `comfy/diffusers_convert.py`; a file ComfyUI writes has them):
`encoder.down.i.block.j`, `encoder.down.i.downsample`, `mid.block_1` / `attn_1` (`norm`, `q`, `k`, `v`,
`proj_out` as 1x1x1 conv weights C,C,1,1,1) / `block_2`, `decoder.up.k` with k = n - 1 - i (core numbers
the decoder's stages from the output side), `norm_out`, `nin_shortcut.conv`.

HunyuanVideo 1.5 has the same module paths in both layouts (`hv15/checkpoint.py`), but RMS norms
(`norm1.gamma`) where 1.0 has GroupNorms (`norm1.weight` and `norm1.bias`), and no `post_quant_conv`: the
probes below ask for both, so no 1.5 file is ever read as 1.0; 1.5's probes match a 1.0 file, so the
registry tries 1.0 first (tests/test_hv10.py checks both families' key sets and `vae.load`).
"""
import re

from ..video_vae import LayoutError

ORIGINAL_PROBES = ("encoder.conv_in.conv.weight", "encoder.down_blocks.0.resnets.0.norm1.bias",
                   "encoder.mid_block.attentions.0.to_q.weight", "decoder.conv_in.conv.weight",
                   "decoder.up_blocks.0.resnets.0.norm1.bias", "decoder.mid_block.attentions.0.to_q.weight",
                   "post_quant_conv.weight")
CORE_PROBES = ("encoder.conv_in.conv.weight", "encoder.down.0.block.0.norm1.bias", "encoder.mid.attn_1.q.weight",
               "decoder.conv_in.conv.weight", "decoder.up.0.block.0.norm1.bias", "decoder.mid.attn_1.q.weight",
               "post_quant_conv.weight")

_CORE = (
    (re.compile(r"^(encoder|decoder)\.mid\.block_1\."), r"\1.mid_block.resnets.0."),
    (re.compile(r"^(encoder|decoder)\.mid\.block_2\."), r"\1.mid_block.resnets.1."),
    (re.compile(r"^(encoder|decoder)\.mid\.attn_1\.norm\."), r"\1.mid_block.attentions.0.group_norm."),
    (re.compile(r"^(encoder|decoder)\.mid\.attn_1\.([qkv])\."), r"\1.mid_block.attentions.0.to_\2."),
    (re.compile(r"^(encoder|decoder)\.mid\.attn_1\.proj_out\."), r"\1.mid_block.attentions.0.to_out.0."),
    (re.compile(r"^encoder\.down\.(\d+)\.block\.(\d+)\."), r"encoder.down_blocks.\1.resnets.\2."),
    (re.compile(r"^encoder\.down\.(\d+)\.downsample\."), r"encoder.down_blocks.\1.downsamplers.0."),
    (re.compile(r"^(encoder|decoder)\.norm_out\."), r"\1.conv_norm_out."),
    (re.compile(r"\.nin_shortcut\."), ".conv_shortcut."),
)
_CORE_UP = re.compile(r"^decoder\.up\.(\d+)\.(block|upsample)\.")
_ATTENTION_LINEAR = re.compile(r"\.mid_block\.attentions\.0\.(to_[qkv]|to_out\.0)\.weight$")


def layout_of(keys) -> str | None:
    """"original", "core" or None: which HunyuanVideo 1.0 key layout `keys` have, if any."""
    keys = set(keys)
    for name, probes in (("original", ORIGINAL_PROBES), ("core", CORE_PROBES)):
        if all(k in keys for k in probes):
            return name
    return None


def native(state_dict: dict) -> dict | None:
    """`state_dict` in the original key names, or None when it is no HunyuanVideo 1.0 checkpoint."""
    layout = layout_of(state_dict)
    if layout != "core":
        return state_dict if layout == "original" else None
    stages = _count(state_dict, "decoder.up.")
    out = {}
    for key, value in state_dict.items():
        key = _CORE_UP.sub(lambda m: f"decoder.up_blocks.{stages - 1 - int(m[1])}."
                           + ("resnets." if m[2] == "block" else "upsamplers.0."), key)
        for pattern, replacement in _CORE:
            key = pattern.sub(replacement, key)
        if _ATTENTION_LINEAR.search(key):
            value = value.reshape(value.shape[:2])  # C,C,1,1,1 -> C,C
        out[key] = value
    return out


def _count(sd: dict, prefix: str) -> int:
    """How many consecutive indices i have keys starting with prefix + "i."."""
    n = 0
    while any(k.startswith(f"{prefix}{n}.") for k in sd):
        n += 1
    return n


def read(sd: dict) -> dict:
    """The `network.Hv10Config` fields the shapes give (original key names); LayoutError names the shapes
    that fit no configuration the network can be built with."""
    stages = _count(sd, "encoder.down_blocks.")
    widths = tuple(sd[f"encoder.down_blocks.{i}.resnets.0.conv1.conv.weight"].shape[0] for i in range(stages))
    layers = _count(sd, "encoder.down_blocks.0.resnets.")
    if stages < 3:
        raise LayoutError(f"{stages} encoder stages: the network has at least 3 (two resample in time)")
    for side, resampler in (("encoder.down_blocks", "downsamplers"), ("decoder.up_blocks", "upsamplers")):
        present = [i for i in range(stages) if f"{side}.{i}.{resampler}.0.conv.conv.weight" in sd]
        if present != list(range(stages - 1)):
            raise LayoutError(f"{side} {present} have {resampler}: every stage but the last should")
    decoder_widths = tuple(sd[f"decoder.up_blocks.{i}.resnets.0.conv1.conv.weight"].shape[0]
                           for i in range(_count(sd, "decoder.up_blocks.")))
    if decoder_widths != tuple(reversed(widths)):
        raise LayoutError(f"decoder stage widths {decoder_widths} are not the encoder's {widths} reversed")
    decoder_layers = _count(sd, "decoder.up_blocks.0.resnets.")
    if decoder_layers != layers + 1:
        raise LayoutError(f"the decoder's stages have {decoder_layers} residual blocks, the encoder's {layers}: "
                          "the decoder has one more")
    latent = sd["decoder.conv_in.conv.weight"].shape[1]
    conv_out = sd["encoder.conv_out.conv.weight"]
    if conv_out.shape[0] != 2 * latent or tuple(sd["quant_conv.weight"].shape[:2]) != (2 * latent,) * 2:
        raise LayoutError(f"encoder.conv_out.conv.weight {tuple(conv_out.shape)} and quant_conv.weight "
                          f"{tuple(sd['quant_conv.weight'].shape)}: not twice the decoder's {latent} latent channels")
    return dict(block_out_channels=widths, layers_per_block=layers, latent_channels=latent,
                in_channels=sd["encoder.conv_in.conv.weight"].shape[1],
                out_channels=sd["decoder.conv_out.conv.weight"].shape[0])
