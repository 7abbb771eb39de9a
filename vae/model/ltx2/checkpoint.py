"""LTX-2 VAE configurations read from a checkpoint: its weights, then its metadata config.

The weights say every size (read as ComfyUI core reads them, and further): the block list of each
half (a group of residual blocks, a width-changing residual block, a strided conv, a space-to-depth
or a depth-to-space block, told apart by their keys), each block's depth and width factor, the
space-to-depth / depth-to-space stride (its conv's width against the next block's), the patch size,
the latent channels, the log-variance channels, timestep conditioning and noise injection. What the
weights cannot say comes from the metadata config LTX-2 checkpoints carry (safetensors metadata
`config` -> `vae`, upstream's `CausalVideoAutoencoder` config): the spatial padding (reflect in the
2.0/2.3 decoder, zeros in 2.5; without metadata the encoder pads zeros and the decoder reflects, as
core does), a strided conv's direction, whether a depth-to-space block adds its input (without
metadata: where it halves the width, as in every release), `causal_decoder`, the decode timestep and
noise scale, and a constant log variance. Shapes that fit no rule, or a metadata block list that
disagrees with the weights, are refused with a `LayoutError` naming them.

diffusers' `AutoencoderKLLTX2Video` names are mapped to the checkpoint's (`from_diffusers`).
"""
import json
import re

from ..video_vae import LayoutError
from .blocks import LOG_VARIANCES, PADDINGS, LTX2Config, LTXBlock

# Keys of the checkpoint the model does not use (upstream keeps them for reference).
UNUSED = ("per_channel_statistics.channel", "per_channel_statistics.mean-of-stds")
DIFFUSERS_PROBE = ("encoder.conv_in.conv.weight", "decoder.mid_block.resnets.0.conv1.conv.weight",
                   "decoder.conv_out.conv.weight", "latents_mean")
VOLUMES = {8: "all", 4: "space", 2: "time"}  # a resampler's stride volume -> its direction


def native(sd: dict, probe_keys) -> dict | None:
    """`sd` in the checkpoint's key names (from core's or diffusers'), or None for another layout."""
    if all(k in sd for k in probe_keys):
        return {k: v for k, v in sd.items() if k not in UNUSED}
    if all(k in sd for k in DIFFUSERS_PROBE):
        return from_diffusers(sd)
    return None


def _indices(sd: dict, root: str) -> list[int]:
    pattern = re.compile(re.escape(root) + r"\.(\d+)\.")
    return sorted({int(m[1]) for m in map(pattern.match, sd) if m})


def from_diffusers(sd: dict) -> dict:
    """diffusers' names -> the checkpoint's: each down block's resnets and downsampler, and each up
    block's width-changing resnet (`conv_in`), upsampler and resnets, are blocks of their own there,
    numbered in the order they run; the mid blocks are the last encoder / first decoder block."""
    prefixes, k = {}, 0
    for i in _indices(sd, "encoder.down_blocks"):
        for part, target in (("resnets.", "res_blocks."), ("downsamplers.0.", "")):
            if any(key.startswith(f"encoder.down_blocks.{i}.{part}") for key in sd):
                prefixes[f"encoder.down_blocks.{i}.{part}"] = f"encoder.down_blocks.{k}.{target}"
                k += 1
    prefixes["encoder.mid_block.resnets."] = f"encoder.down_blocks.{k}.res_blocks."
    prefixes.update({"decoder.mid_block.resnets.": "decoder.up_blocks.0.res_blocks.",
                     "decoder.mid_block.time_embedder.": "decoder.up_blocks.0.time_embedder.",
                     "decoder.time_embedder.": "decoder.last_time_embedder.",
                     "decoder.scale_shift_table": "decoder.last_scale_shift_table",
                     "latents_mean": "per_channel_statistics.mean-of-means",
                     "latents_std": "per_channel_statistics.std-of-means"})
    k = 1
    for i in _indices(sd, "decoder.up_blocks"):
        for part, target in (("conv_in.", ""), ("upsamplers.0.", ""), ("resnets.", "res_blocks.")):
            if any(key.startswith(f"decoder.up_blocks.{i}.{part}") for key in sd):
                prefixes[f"decoder.up_blocks.{i}.{part}"] = f"decoder.up_blocks.{k}.{target}"
                if part == "resnets.":
                    prefixes[f"decoder.up_blocks.{i}.time_embedder."] = f"decoder.up_blocks.{k}.time_embedder."
                k += 1
    out = {}
    for key, value in sd.items():
        match = max((p for p in prefixes if key.startswith(p)), key=len, default=None)
        name = prefixes[match] + key[len(match):] if match else key
        out[re.sub(r"\.norm3\.(weight|bias)$", r".norm3.norm.\1", name)] = value
    return out


# --- the weights ----------------------------------------------------------------------------------------

def _shape(sd: dict, key: str) -> str:
    return f"{key} {tuple(sd[key].shape)}"


def _width_in(sd: dict, prefix: str) -> int | None:
    """The input width of the block at `prefix` (its first conv's input channels), or None."""
    for key in ("res_blocks.0.conv1.conv.weight", "conv1.conv.weight", "conv.conv.weight", "conv.weight"):
        if prefix + key in sd:
            return sd[prefix + key].shape[1]
    return None


def _ratio(big: int, small: int, what: str) -> int:
    if small <= 0 or big % small:
        raise LayoutError(f"{what}: {big} channels are not a whole multiple of {small}")
    return big // small


def _blocks(sd: dict, half: str) -> list[LTXBlock]:
    """The blocks of `half` ("encoder" / "decoder") in the order they run, read from the keys and shapes."""
    root = "encoder.down_blocks" if half == "encoder" else "decoder.up_blocks"
    indices = _indices(sd, root)
    if indices != list(range(len(indices))):
        raise LayoutError(f"{root} numbers {indices}: a block is missing")
    blocks = []
    for i in indices:
        prefix, after = f"{root}.{i}.", f"{root}.{i + 1}."
        following = _width_in(sd, after) if i + 1 < len(indices) else sd[f"{half}.conv_out.conv.weight"].shape[1]
        if prefix + "res_blocks.0.conv1.conv.weight" in sd:
            layers = len(_indices(sd, prefix + "res_blocks"))
            blocks.append(LTXBlock("res_x", num_layers=layers, inject_noise=prefix + "res_blocks.0.per_channel_scale1" in sd))
        elif prefix + "conv1.conv.weight" in sd:
            cout, cin = sd[prefix + "conv1.conv.weight"].shape[:2]
            big, small = (cout, cin) if half == "encoder" else (cin, cout)
            blocks.append(LTXBlock("res_x_y", multiplier=_ratio(big, small, _shape(sd, prefix + "conv1.conv.weight"))))
        elif prefix + "conv.conv.weight" in sd:  # space-to-depth (encoder) or depth-to-space (decoder)
            key = prefix + "conv.conv.weight"
            conv_out, cin = sd[key].shape[:2]
            if half == "encoder":
                volume, multiplier = _ratio(following, conv_out, _shape(sd, key)), _ratio(following, cin, _shape(sd, key))
            else:
                volume, multiplier = _ratio(conv_out, following, _shape(sd, key)), _ratio(cin, following, _shape(sd, key))
            if volume not in VOLUMES:
                raise LayoutError(f"{_shape(sd, key)}: a resampler of stride volume {volume} (2, 4 or 8 fit)")
            name = f"compress_{VOLUMES[volume]}" + ("_res" if half == "encoder" else "")
            blocks.append(LTXBlock(name, multiplier=multiplier, residual=half == "decoder" and multiplier > 1))
        elif half == "encoder" and prefix + "conv.weight" in sd:  # a strided conv: its direction is not in the weights
            cout, cin = sd[prefix + "conv.weight"].shape[:2]
            blocks.append(LTXBlock("compress_all", multiplier=_ratio(cout, cin, _shape(sd, prefix + "conv.weight"))))
        else:
            raise LayoutError(f"{root}.{i} is no block of this architecture (keys {sorted(k for k in sd if k.startswith(prefix))[:4]})")
    return blocks


def read(sd: dict) -> dict:
    """LTX2Config fields from the weights (checkpoint key names)."""
    conv_in, conv_out = sd["encoder.conv_in.conv.weight"], sd["decoder.conv_out.conv.weight"]
    latent = sd["decoder.conv_in.conv.weight"].shape[1]
    patch = round((conv_in.shape[1] / 3) ** 0.5)
    if 3 * patch * patch != conv_in.shape[1] or conv_out.shape[0] != conv_in.shape[1]:
        raise LayoutError(f"{_shape(sd, 'encoder.conv_in.conv.weight')} and {_shape(sd, 'decoder.conv_out.conv.weight')}: "
                          "3 image channels times a square patch in and out are expected")
    moments = sd["encoder.conv_out.conv.weight"].shape[0]
    log_var = {2 * latent: "per_channel", latent + 1: "uniform", latent: "none"}.get(moments)
    if log_var is None:
        raise LayoutError(f"{_shape(sd, 'encoder.conv_out.conv.weight')}: {moments} moments for {latent} latent channels")
    return dict(encoder_blocks=tuple(_blocks(sd, "encoder")), decoder_blocks=tuple(_blocks(sd, "decoder")),
                latent_channels=latent, in_channels=3, patch_size=patch, encoder_channels=conv_in.shape[0],
                decoder_channels=sd["decoder.conv_in.conv.weight"].shape[0], latent_log_var=log_var,
                timestep_conditioning="decoder.timestep_scale_multiplier" in sd)


# --- the metadata config --------------------------------------------------------------------------------

def _from_upstream_blocks(entries) -> list[dict]:
    """Upstream's [[name, params], ...] -> LTXBlock fields (its `compress_all_x_y` is a widening compress_all)."""
    blocks = []
    for name, params in entries:
        params = {"num_layers": params} if isinstance(params, int) else dict(params)
        multiplier = params.get("multiplier", 2 if name in ("res_x_y", "compress_all_x_y") else 1)
        blocks.append(dict(name="compress_all" if name == "compress_all_x_y" else name, num_layers=params.get("num_layers", 1),
                           multiplier=multiplier, residual=bool(params.get("residual", False)),
                           inject_noise=bool(params.get("inject_noise", False))))
    return blocks


def metadata_vae(metadata: dict) -> dict:
    """The VAE's part of a checkpoint's `config` metadata (upstream's config of it), {} where it has none."""
    try:
        vae = json.loads(metadata.get("config", "{}")).get("vae")
    except (json.JSONDecodeError, AttributeError):
        return {}
    return vae if isinstance(vae, dict) else {}


def from_metadata(metadata: dict) -> dict:
    """Config overrides (LTX2Config field names) from a checkpoint's `config` metadata (`vae` part)."""
    vae = metadata_vae(metadata)
    if not vae:
        return {}
    out = {}
    if vae.get("norm_layer", "pixel_norm") != "pixel_norm" or vae.get("dims", 3) != 3:
        raise LayoutError(f"the metadata config has norm_layer={vae.get('norm_layer')!r}, dims={vae.get('dims', 3)!r}: "
                          "only the pixel-norm 3-D VAEs (LTX-Video 0.9 and later, LTX-2) are known")
    for half in ("encoder", "decoder"):
        entries = vae.get(f"{half}_blocks", vae.get("blocks"))
        if entries:
            blocks = _from_upstream_blocks(entries)
            out[f"{half}_blocks"] = blocks if half == "encoder" else blocks[::-1]  # upstream lists the decoder reversed
    for half in ("encoder", "decoder"):
        mode = vae.get(f"{half}_spatial_padding_mode", vae.get("spatial_padding_mode"))
        if mode is not None:
            out[f"{half}_padding"] = mode
    for name in ("causal_decoder", "decode_timestep", "decode_noise_scale"):
        if name in vae:
            out[name] = vae[name]
    if vae.get("latent_log_var") == "constant":
        out["latent_log_var"] = "constant"
    return out


# --- the config -----------------------------------------------------------------------------------------

def _kind(block: LTXBlock) -> str:
    return "s2d" if block.name.endswith("_res") else "resample" if block.name.startswith("compress_") else block.name


def _merged(read_blocks, given, half: str) -> tuple[LTXBlock, ...]:
    """The blocks the weights show, with what only a config says (a resampler's direction, `residual`)
    from `given`; a list that disagrees with the weights is refused."""
    given = [b if isinstance(b, LTXBlock) else LTXBlock(**b) for b in given]
    if [_kind(b) for b in given] != [_kind(b) for b in read_blocks]:
        raise LayoutError(f"the config's {half} blocks {[b.name for b in given]} are not the weights' "
                          f"{[b.name for b in read_blocks]}")
    merged = []
    for i, (ours, theirs) in enumerate(zip(read_blocks, given)):
        strided_conv = half == "encoder" and _kind(ours) == "resample"  # the one direction the weights do not show
        if (not strided_conv and ours.name != theirs.name) or ours.multiplier != theirs.multiplier:
            raise LayoutError(f"{half} block {i}: the config's {theirs.name} (width factor {theirs.multiplier}) is not "
                              f"the weights' {ours.name} (width factor {ours.multiplier})")
        merged.append(LTXBlock(theirs.name, ours.num_layers, ours.multiplier, theirs.residual, ours.inject_noise))
    return tuple(merged)


def config(sd: dict, overrides: dict) -> LTX2Config:
    """The LTX2Config of a state dict in checkpoint names, with `overrides` (metadata config, then the
    caller's) applied; every choice checked."""
    fields = read(sd)
    overrides = dict(overrides)
    for half in ("encoder", "decoder"):
        if f"{half}_blocks" in overrides:
            fields[f"{half}_blocks"] = _merged(fields[f"{half}_blocks"], overrides.pop(f"{half}_blocks"), half)
    unknown = sorted(set(overrides) - set(LTX2Config.__dataclass_fields__))
    if unknown:
        raise LayoutError(f"unknown LTX-2 config fields {unknown}")
    fields.update(overrides)
    cfg = LTX2Config(**fields)
    for half in ("encoder", "decoder"):
        if getattr(cfg, f"{half}_padding") not in PADDINGS:
            raise LayoutError(f"{half} spatial padding {getattr(cfg, f'{half}_padding')!r}: one of {PADDINGS}")
    if cfg.latent_log_var not in LOG_VARIANCES:
        raise LayoutError(f"latent_log_var {cfg.latent_log_var!r}: one of {LOG_VARIANCES}")
    up = [b.stride for b in cfg.decoder_blocks]
    decoder = (cfg.patch_size * 2 ** sum(s[1] == 2 for s in up), 2 ** sum(s[0] == 2 for s in up))
    if decoder != (cfg.spatial_factor, cfg.temporal_factor):
        raise LayoutError(f"the decoder upsamples {decoder[0]}x / {decoder[1]}x, the encoder downsamples "
                          f"{cfg.spatial_factor}x / {cfg.temporal_factor}x")
    return cfg


def upstream_config(cfg: LTX2Config) -> dict:
    """`cfg` as upstream's `CausalVideoAutoencoder` config (what an LTX-2 checkpoint's metadata holds
    under `config` -> `vae`, and what core builds its VAE from): decoder blocks in the encoder's order,
    base widths, the padding under core's one key where both halves agree and under each half's key."""

    def entries(blocks, half):
        out = []
        for b in blocks:
            name = "compress_all_x_y" if half == "encoder" and b.name == "compress_all" and b.multiplier > 1 else b.name
            params = {"num_layers": b.num_layers} if b.name == "res_x" else {"multiplier": b.multiplier}
            if b.name == "res_x" and b.inject_noise:
                params["inject_noise"] = True
            if half == "decoder" and b.name.startswith("compress_"):
                params["residual"] = b.residual
            out.append([name, params])
        return out

    widening = 1
    for b in cfg.decoder_blocks:
        widening *= b.multiplier if b.name != "res_x" else 1
    vae = {"_class_name": "CausalVideoAutoencoder", "dims": 3, "in_channels": cfg.in_channels,
           "out_channels": cfg.in_channels, "latent_channels": cfg.latent_channels,
           "encoder_blocks": entries(cfg.encoder_blocks, "encoder"),
           "decoder_blocks": entries(cfg.decoder_blocks, "decoder")[::-1],
           "encoder_base_channels": cfg.encoder_channels, "decoder_base_channels": cfg.decoder_channels // widening,
           "patch_size": cfg.patch_size, "norm_layer": "pixel_norm", "latent_log_var": cfg.latent_log_var,
           "causal_decoder": cfg.causal_decoder, "timestep_conditioning": cfg.timestep_conditioning,
           "decode_timestep": cfg.decode_timestep, "decode_noise_scale": cfg.decode_noise_scale,
           "encoder_spatial_padding_mode": cfg.encoder_padding, "decoder_spatial_padding_mode": cfg.decoder_padding}
    if cfg.encoder_padding == cfg.decoder_padding:
        vae["spatial_padding_mode"] = cfg.encoder_padding
    return vae
