"""HunyuanVideo 1.5 checkpoints: every size read from the tensor shapes, and diffusers' key names
(`AutoencoderKLHunyuanVideo15`) mapped to the released ones (ComfyUI core's, `network.py`'s modules).

Released names: `encoder.down.i.block.j.*`, `encoder.down.i.downsample.conv.conv.*`, `{encoder,decoder}.mid.
{block_1,attn_1,block_2}.*` (attention `q`, `k`, `v`, `proj_out`), `decoder.up.i.block.j.*`,
`decoder.up.i.upsample.conv.conv.*`, residual shortcuts `nin_shortcut.conv.*`. diffusers: `down_blocks.i.
resnets.j`, `downsamplers.0`, `mid_block.resnets.0/1`, `mid_block.attentions.0` (`to_q`, ...), `up_blocks`,
`upsamplers.0`, `conv_shortcut`.
"""
import re

from ..video_vae import LayoutError

_DIFFUSERS = (
    (re.compile(r"^(encoder|decoder)\.mid_block\.resnets\.0\."), r"\1.mid.block_1."),
    (re.compile(r"^(encoder|decoder)\.mid_block\.resnets\.1\."), r"\1.mid.block_2."),
    (re.compile(r"^(encoder|decoder)\.mid_block\.attentions\.0\.to_([qkv])\."), r"\1.mid.attn_1.\2."),
    (re.compile(r"^(encoder|decoder)\.mid_block\.attentions\.0\."), r"\1.mid.attn_1."),
    (re.compile(r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\."), r"encoder.down.\1.block.\2."),
    (re.compile(r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\."), r"encoder.down.\1.downsample."),
    (re.compile(r"^decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\."), r"decoder.up.\1.block.\2."),
    (re.compile(r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\."), r"decoder.up.\1.upsample."),
    (re.compile(r"\.conv_shortcut\."), r".nin_shortcut.conv."),
)
DIFFUSERS_PROBE_KEYS = ("encoder.conv_in.conv.weight", "encoder.down_blocks.0.resnets.0.conv1.conv.weight",
                        "encoder.mid_block.attentions.0.to_q.weight", "decoder.conv_in.conv.weight",
                        "decoder.mid_block.attentions.0.to_q.weight", "decoder.up_blocks.0.resnets.0.conv1.conv.weight")


def native(state_dict: dict, probe_keys: tuple[str, ...]) -> dict | None:
    """`state_dict` in the released key names, or None when it has neither layout's keys."""
    if all(k in state_dict for k in probe_keys):
        return state_dict
    if not all(k in state_dict for k in DIFFUSERS_PROBE_KEYS):
        return None
    out = {}
    for key, value in state_dict.items():
        for pattern, replacement in _DIFFUSERS:
            key = pattern.sub(replacement, key)
        out[key] = value
    return out


def _count(sd: dict, prefix: str) -> int:
    """How many consecutive indices i have keys starting with prefix + "i."."""
    n = 0
    while any(k.startswith(f"{prefix}{n}.") for k in sd):
        n += 1
    return n


def _log2(value: int, what: str) -> int:
    if value < 1 or value & (value - 1):
        raise LayoutError(f"{what} is {value}, not a power of two")
    return value.bit_length() - 1


def read(sd: dict) -> dict:
    """The `hv15.Hv15Config` fields the shapes give (released key names); LayoutError names the shapes
    that fit no configuration the network can be built with."""
    stages = _count(sd, "encoder.down.")
    widths = tuple(sd[f"encoder.down.{i}.block.0.conv1.conv.weight"].shape[0] for i in range(stages))
    layers = _count(sd, "encoder.down.0.block.")
    latent = sd["decoder.conv_in.conv.weight"].shape[1]
    downs = [i for i in range(stages) if f"encoder.down.{i}.downsample.conv.conv.weight" in sd]
    if downs != list(range(len(downs))) or len(downs) >= stages:
        raise LayoutError(f"encoder stages {downs} downsample; the first ones should, and not the last")
    temporal, match = [], []
    for i in downs:
        conv = sd[f"encoder.down.{i}.downsample.conv.conv.weight"]
        nxt = sd[f"encoder.down.{i + 1}.block.0.norm1.gamma"].shape[0]
        if nxt % conv.shape[0] or nxt // conv.shape[0] not in (4, 8):
            raise LayoutError(f"encoder.down.{i}.downsample.conv.conv.weight {tuple(conv.shape)}: {conv.shape[0]} "
                              f"channels are not a quarter or an eighth of the next stage's {nxt}")
        temporal.append(nxt // conv.shape[0] == 8)
        match.append(nxt == widths[i + 1])
    n_temporal = sum(temporal)
    if temporal != [False] * (len(downs) - n_temporal) + [True] * n_temporal or len(set(match)) > 1:
        raise LayoutError(f"encoder downsamplers (temporal {temporal}, to the next stage's width {match}): the "
                          "temporal ones must be the last and the widths follow one rule")
    conv_out = sd["encoder.conv_out.conv.weight"]
    if conv_out.shape[0] != 2 * latent:
        raise LayoutError(f"encoder.conv_out.conv.weight {tuple(conv_out.shape)}: {conv_out.shape[0]} output channels "
                          f"are not twice the decoder's {latent} latent channels")
    decoder_widths = tuple(sd[f"decoder.up.{i}.block.0.conv1.conv.weight"].shape[0]
                           for i in range(_count(sd, "decoder.up.")))
    if decoder_widths != tuple(reversed(widths)):
        raise LayoutError(f"decoder stage widths {decoder_widths} are not the encoder's {widths} reversed")
    ups = [i for i in range(len(decoder_widths)) if f"decoder.up.{i}.upsample.conv.conv.weight" in sd]
    up_match = {sd[f"decoder.up.{i + 1}.block.0.norm1.gamma"].shape[0] == decoder_widths[i + 1] for i in ups}
    fields = dict(block_out_channels=widths, layers_per_block=layers, latent_channels=latent,
                  in_channels=sd["encoder.conv_in.conv.weight"].shape[1],
                  out_channels=sd["decoder.conv_out.conv.weight"].shape[0],
                  spatial_compression=2 ** len(downs), temporal_compression=2 ** n_temporal,
                  downsample_match_channel=all(match), upsample_match_channel=all(up_match))
    _refuse_unbuildable(fields)
    return fields


def _refuse_unbuildable(fields: dict) -> None:
    """The channel counts the resamplers' repeats and groups need to divide evenly."""
    widths, latent = fields["block_out_channels"], fields["latent_channels"]
    _log2(fields["spatial_compression"], "the spatial compression")
    if widths[-1] % (2 * latent) or widths[-1] % latent:
        raise LayoutError(f"the innermost width {widths[-1]} is not a multiple of twice the {latent} latent channels")
    for cin, cout in zip(widths[:0:-1], widths[-2::-1]):
        if cin % 8 or cout % 4:
            raise LayoutError(f"decoder stage widths {cin} -> {cout} do not split into the 2x2x2 pixel blocks of "
                              "the upsamplers")
