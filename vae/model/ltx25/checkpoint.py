"""LTX-2.5 diffusion-decoder VAE configurations read from a checkpoint (core's key names: the split VAE
file, or the `vae.` part of a full LTX-2.5 checkpoint with that prefix removed).

The weights say every size: the latent channels, each stage's width, depth, head width and SwiGLU
width, each upsample's stride volume (its output width over the next stage's), the patch size, the
timestep embedding's widths; the encoder's as for LTX-2 (`vae/model/ltx2/checkpoint.py`). The metadata config (upstream's
`CausalDiffusionVAE` config: safetensors metadata `config` -> `vae`, as core reads it) says what they
cannot: the windows, how each stride volume splits over t, h, w (without it: 8 -> 2,2,2, 4 -> 1,2,2,
2 -> 2,1,1, the released split), the sampling and the encoder's padding; anything it leaves out is core's
default (`LTX25Config`). A metadata size that disagrees with the weights, or weights that fit no rule,
are refused with a `LayoutError` naming them.
"""
import re
from dataclasses import replace

from ..ltx2.blocks import LOG_VARIANCES, PADDINGS
from ..ltx2.checkpoint import UNUSED, metadata_vae, _blocks as ltx2_blocks
from ..ltx2.checkpoint import upstream_config as ltx2_upstream_config
from ..video_vae import LayoutError
from .blocks import OUTPUT_TYPES, LTX25Config, swiglu_hidden

PROBE_KEYS = ("decoder.conv_in_x_t.weight", "decoder.conv_in.weight", "encoder.conv_in.conv.weight",
              "per_channel_statistics.mean-of-means")
VOLUMES = {8: (2, 2, 2), 4: (1, 2, 2), 2: (2, 1, 1), 1: (1, 1, 1)}  # a stride volume -> its released split
SIZES = ("latent_channels", "out_channels", "patch_size", "head_dim", "stage_channels", "stage_depths", "t_emb_dim")


def native(sd: dict) -> dict | None:
    """`sd` without the keys the model does not use, or None when it is not this layout."""
    if all(k in sd for k in PROBE_KEYS):
        return {k: v for k, v in sd.items() if k not in UNUSED}
    return None


def _indices(sd: dict, root: str) -> list[int]:
    pattern = re.compile(re.escape(root) + r"\.(\d+)\.")
    found = sorted({int(m[1]) for m in map(pattern.match, sd) if m})
    if found != list(range(len(found))):
        raise LayoutError(f"{root} numbers {found}: one is missing")
    return found


def _shape(sd: dict, key: str) -> str:
    return f"{key} {tuple(sd[key].shape)}"


def _block_sizes(sd: dict, prefix: str, count: int, width: int) -> tuple[set[int], set[int]]:
    """(head widths, SwiGLU widths) of the `count` blocks under `prefix`, each checked against `width`."""
    heads, hidden = set(), set()
    for j in range(count):
        block = f"{prefix}.{j}."
        qkv = sd[block + "attn.qkv.weight"]
        if tuple(qkv.shape) != (3 * width, width):
            raise LayoutError(f"{_shape(sd, block + 'attn.qkv.weight')}: a stage {width} channels wide takes ({3 * width}, {width})")
        heads.add(sd[block + "attn.q_norm.weight"].shape[0])
        hidden.add(sd[block + "mlp.w_up.weight"].shape[0])
    return heads, hidden


def read(sd: dict) -> dict:
    """LTX25Config fields from the weights (core's key names)."""
    conv_in, x_in = sd["decoder.conv_in.weight"], sd["decoder.conv_in_x_t.weight"]
    stages = _indices(sd, "decoder.upsamples")
    widths = [sd[f"decoder.upsamples.{i}.proj.weight"].shape[1] for i in stages] + [x_in.shape[0]]
    if conv_in.shape[0] != widths[0]:
        raise LayoutError(f"{_shape(sd, 'decoder.conv_in.weight')}: stage 1 is {widths[0]} channels wide")
    volumes = []
    for i in stages:
        key = f"decoder.upsamples.{i}.proj.weight"
        out = sd[key].shape[0]
        if out % widths[i + 1] or out // widths[i + 1] not in VOLUMES:
            raise LayoutError(f"{_shape(sd, key)}: not a stride volume of 1, 2, 4 or 8 times the next stage's "
                              f"{widths[i + 1]} channels")
        volumes.append(out // widths[i + 1])
    depths = [len(_indices(sd, f"decoder.det_stages.{i}")) for i in stages] + [len(_indices(sd, "decoder.diff_blocks"))]
    heads, hidden = set(), []
    for i, depth in enumerate(depths):
        prefix = f"decoder.det_stages.{i}" if i < len(stages) else "decoder.diff_blocks"
        stage_heads, stage_hidden = _block_sizes(sd, prefix, depth, widths[i])
        if len(stage_hidden) > 1:
            raise LayoutError(f"{prefix}: SwiGLU widths {sorted(stage_hidden)} differ within a stage")
        heads |= stage_heads
        hidden.append(stage_hidden.pop() if stage_hidden else swiglu_hidden(widths[i]))
    if len(heads) != 1 or any(w % next(iter(heads)) for w in widths):
        raise LayoutError(f"attn.q_norm widths {sorted(heads)}: one head width dividing every stage's {widths} is expected")
    embed = sd["decoder.t_embedder.mlp.0.weight"]
    return dict(latent_channels=conv_in.shape[1], pixel_channels=x_in.shape[1], head_dim=heads.pop(),
                stage_channels=tuple(widths), stage_depths=tuple(depths), mlp_hidden=tuple(hidden),
                upsample_volumes=tuple(volumes), t_emb_dim=embed.shape[0], timestep_channels=embed.shape[1],
                encoder=_encoder(sd))


def _encoder(sd: dict) -> dict:
    """The encoder's LTX2Config fields from its weights (LTX-2's encoder)."""
    conv_in, conv_out = sd["encoder.conv_in.conv.weight"], sd["encoder.conv_out.conv.weight"]
    latent = sd["decoder.conv_in.weight"].shape[1]
    patch = round((conv_in.shape[1] / 3) ** 0.5)
    if 3 * patch * patch != conv_in.shape[1]:
        raise LayoutError(f"{_shape(sd, 'encoder.conv_in.conv.weight')}: 3 image channels times a square patch expected")
    log_var = {2 * latent: "per_channel", latent + 1: "uniform", latent: "none"}.get(conv_out.shape[0])
    if log_var is None:
        raise LayoutError(f"{_shape(sd, 'encoder.conv_out.conv.weight')}: {conv_out.shape[0]} moments for {latent} latent channels")
    return dict(encoder_blocks=tuple(ltx2_blocks(sd, "encoder")), latent_channels=latent, patch_size=patch,
                encoder_channels=conv_in.shape[0], latent_log_var=log_var)


def from_metadata(metadata: dict) -> dict:
    """Config overrides (LTX25Config field names; `encoder_padding` and `latent_log_var` for the encoder)
    from a checkpoint's `config` metadata, as core reads it."""
    vae = metadata_vae(metadata)
    dec, enc = vae.get("decoder") or {}, vae.get("encoder") or {}
    out = {name: dec[key] for name, key in (
        ("latent_channels", "in_channels"), ("out_channels", "out_channels"), ("patch_size", "patch_size"),
        ("head_dim", "head_dim"), ("t_emb_dim", "t_emb_dim"), ("num_inference_steps", "default_num_inference_steps"),
        ("timestep_scale_multiplier", "timestep_scale_multiplier")) if key in dec}
    for name in ("stage_channels", "stage_depths"):
        if name in dec:
            out[name] = tuple(dec[name])
    if "stage_kernels" in dec:
        out["stage_kernels"] = tuple(tuple(k) for k in dec["stage_kernels"])
    if "stage5_kernel" in dec:
        out["stage5_kernel"] = tuple(dec["stage5_kernel"])
    if "upsamples" in dec:
        out["upsample_strides"] = tuple(tuple(stride) for stride, _ in dec["upsamples"])
    if "model_output_type" in vae:
        out["model_output_type"] = vae["model_output_type"]
    if "spatial_padding_mode" in enc:
        out["encoder_padding"] = enc["spatial_padding_mode"]
    if "latent_log_var" in enc:
        out["latent_log_var"] = enc["latent_log_var"]
    return out


def config(sd: dict, overrides: dict) -> LTX25Config:
    """The LTX25Config of a state dict in core's names, with `overrides` (metadata config, then the
    caller's) applied; every choice checked."""
    fields, overrides, default = read(sd), dict(overrides), LTX25Config()
    for name in SIZES:
        given = overrides.pop(name, None)
        if given is not None and name in fields and (tuple(given) if isinstance(given, list) else given) != fields[name]:
            raise LayoutError(f"the config's {name} {given} is not the weights' {fields[name]}")
        if given is not None and name not in fields:
            fields[name] = given
    pixels, volumes = fields.pop("pixel_channels"), fields.pop("upsample_volumes")
    out_channels = fields.setdefault("out_channels", default.out_channels)
    patch = round((pixels / out_channels) ** 0.5)
    if out_channels * patch * patch != pixels or fields.setdefault("patch_size", patch) != patch:
        raise LayoutError(f"{_shape(sd, 'decoder.conv_in_x_t.weight')}: {pixels} inputs are not {out_channels} "
                          f"channels times a square patch (of {fields.get('patch_size', 'any')})")
    strides = tuple(tuple(s) for s in overrides.pop("upsample_strides", [VOLUMES[v] for v in volumes]))
    if len(strides) != len(volumes) or any(len(s) != 3 or s[0] * s[1] * s[2] != v for s, v in zip(strides, volumes)):
        raise LayoutError(f"the config's upsample strides {strides} do not give the weights' stride volumes {volumes}")
    kernels = tuple(tuple(k) for k in overrides.pop("stage_kernels", default.stage_kernels))[:len(volumes)]
    encoder = fields.pop("encoder")
    encoder["encoder_padding"] = overrides.pop("encoder_padding", default.encoder.encoder_padding)
    log_var = overrides.pop("latent_log_var", default.encoder.latent_log_var)
    if encoder["latent_log_var"] == "uniform" and log_var in ("uniform", "constant"):
        encoder["latent_log_var"] = log_var  # one extra channel each: the weights cannot tell them apart
    unknown = sorted(set(overrides) - set(LTX25Config.__dataclass_fields__))
    if unknown:
        raise LayoutError(f"unknown LTX-2.5 config fields {unknown}")
    if "stage5_kernel" in overrides:
        overrides["stage5_kernel"] = tuple(overrides["stage5_kernel"])
    cfg = LTX25Config(**{**fields, **overrides, "upsample_strides": strides, "stage_kernels": kernels,
                         "encoder": replace(default.encoder, **encoder)})
    check(cfg)
    return cfg


def check(cfg: LTX25Config) -> None:
    """LayoutError for a config no network has: windows, sampling, the encoder's choices, the factors."""
    stages = len(cfg.stage_channels) - 1
    if len(cfg.stage_kernels) != stages or any(len(k) != 3 or min(k) < 1 for k in (*cfg.stage_kernels, cfg.stage5_kernel)):
        raise LayoutError(f"windows {cfg.stage_kernels} + {cfg.stage5_kernel}: three positive sizes for each of the "
                          f"{stages} stages and stage 5")
    if cfg.model_output_type not in OUTPUT_TYPES or cfg.num_inference_steps < 1:
        raise LayoutError(f"sampling {cfg.model_output_type!r} in {cfg.num_inference_steps} steps: "
                          f"one of {OUTPUT_TYPES} in at least one step")
    if cfg.encoder.encoder_padding not in PADDINGS or cfg.encoder.latent_log_var not in LOG_VARIANCES:
        raise LayoutError(f"encoder padding {cfg.encoder.encoder_padding!r}, log variance {cfg.encoder.latent_log_var!r}: "
                          f"one of {PADDINGS}, one of {LOG_VARIANCES}")
    if (cfg.spatial_factor, cfg.temporal_factor) != (cfg.encoder.spatial_factor, cfg.encoder.temporal_factor):
        raise LayoutError(f"the decoder upsamples {cfg.spatial_factor}x / {cfg.temporal_factor}x, the encoder "
                          f"downsamples {cfg.encoder.spatial_factor}x / {cfg.encoder.temporal_factor}x")


def upstream_config(cfg: LTX25Config) -> dict:
    """`cfg` as upstream's `CausalDiffusionVAE` config (core's `LTX_24_VAE_CONFIG` layout): what an LTX-2.5
    checkpoint's metadata holds under `config` -> `vae`, and what core builds its VAE from."""
    encoder = ltx2_upstream_config(cfg.encoder)
    reductions = [a // b for a, b in zip(cfg.stage_channels, cfg.stage_channels[1:])]
    return {
        "_class_name": "CausalDiffusionVAE", "dims": 3, "model_output_type": cfg.model_output_type,
        "encoder": {"dims": 3, "in_channels": cfg.encoder.in_channels, "out_channels": cfg.latent_channels,
                    "blocks": encoder["encoder_blocks"], "patch_size": cfg.encoder.patch_size,
                    "latent_log_var": cfg.encoder.latent_log_var, "norm_layer": "pixel_norm",
                    "base_channels": cfg.encoder.encoder_channels, "spatial_padding_mode": cfg.encoder.encoder_padding},
        "decoder": {"in_channels": cfg.latent_channels, "out_channels": cfg.out_channels, "patch_size": cfg.patch_size,
                    "head_dim": cfg.head_dim, "stage_channels": list(cfg.stage_channels),
                    "stage_depths": list(cfg.stage_depths),
                    "stage_kernels": [list(k) for k in (*cfg.stage_kernels, cfg.stage5_kernel)],
                    "upsamples": [[list(s), r] for s, r in zip(cfg.upsample_strides, reductions)],
                    "stage5_kernel": list(cfg.stage5_kernel), "t_emb_dim": cfg.t_emb_dim,
                    "timestep_scale_multiplier": cfg.timestep_scale_multiplier,
                    "default_num_inference_steps": cfg.num_inference_steps},
    }
