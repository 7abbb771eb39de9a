"""The models and inputs every benchmark runs, built in one place, and the one place that runs them.

A family (`vae.families`) is its full released config with seeded random weights (conv and linear
weights N(0,1)/sqrt(fan_in), norm scales and residual branches' scales (MiniMax-H3's `scale1`, `scale2`: 0
would skip its blocks) 1, biases 0, latent statistics the identity: activations stay O(1) through the
depth; no released checkpoint is needed), or, with `tiny`, its tiny test model
(`FamilySpec.tiny`: the tiny checkpoint of the shared reference fixtures, or a small config with those
random weights; what the CPU dry runs use). `weights` gives the config and the state dict; `build` loads them
into StreamVAE's model or into ComfyUI core's own VAE of a version (bench/core_vae.py), so two rows
with the same family, size and seed compare the same network on the same input (`make_input`).
`run` and `plan` are the benchmarks' only calls of the engine (`vae.encode`/`vae.decode`/`vae.plan`).
"""
import dataclasses

import torch

import vae
from vae import families

FAMILIES = families.NAMES


def meta_model(family: str) -> vae.VideoVAE:
    """The full released network of `family` on the meta device: shapes only, no memory."""
    spec = families.spec(family)
    with torch.device("meta"):
        return spec.vae_class(spec.config_class())


def random_state_dict(model: torch.nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic weights for `model` (built on the meta device), as the module docstring says; saved
    buffers (LTX's latent statistics) the identity: means 0, standard deviations 1."""
    g = torch.Generator().manual_seed(seed)
    saved = model.state_dict()
    out = {name: (torch.ones if "std" in name.rsplit(".", 1)[-1] else torch.zeros)(b.shape)
           for name, b in model.named_buffers() if name in saved}
    for module_name, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            key = f"{module_name}.{name}" if module_name else name
            if isinstance(module, (torch.nn.Conv3d, torch.nn.Conv2d, torch.nn.Linear)) and name == "weight":
                out[key] = torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5
            elif name in ("weight", "gamma", "scale1", "scale2"):  # scales of norms and residual branches
                out[key] = torch.ones(p.shape)
            else:
                out[key] = torch.zeros(p.shape)
    return out


def weights(family: str, tiny: bool = False, seed: int = 0) -> tuple[object, dict[str, torch.Tensor]]:
    """(config, float32 state dict in StreamVAE's key names): the released config with `seed`'s random
    weights, or the tiny test model's (`FamilySpec.tiny`: the reference fixture's checkpoint, `seed`
    unused; or its small config with `seed`'s random weights)."""
    spec = families.spec(family)
    if tiny and spec.tiny.config is not None:
        with torch.device("meta"):
            small = spec.vae_class(spec.tiny.config)
        return small.config, random_state_dict(small, seed)
    if tiny:
        from tests.reference import tiny_checkpoint

        model = vae.load(tiny_checkpoint(family), config=spec.tiny.fixture_config)
        return model.config, model.state_dict()
    meta = meta_model(family)
    return meta.config, random_state_dict(meta, seed)


def build(family: str, dtype: torch.dtype, device="cpu", *, tiny: bool = False, seed: int = 0,
          core: str | None = None, config: dict | None = None) -> torch.nn.Module:
    """`family`'s network (see `weights`) in `dtype` on `device`, eval mode: StreamVAE's model, or with
    `core` ComfyUI core's own VAE of that version (a key of `core_vae.TREES`) loaded with the same weights.
    `config`: StreamVAE config fields that are a choice rather than a size (HunyuanVideo 1.5's attention)."""
    sizes, state = weights(family, tiny, seed)
    if core is not None:
        from bench.core_vae import core_model

        return core_model(core, family, sizes, state, dtype, device)
    return vae.load(state, device=device, dtype=dtype, config={**dataclasses.asdict(sizes), **(config or {})})


def drop_other_half(model: torch.nn.Module, op: str) -> torch.nn.Module:
    """`model` (StreamVAE's or core's) with the weights of the half `op` does not run emptied (its
    submodules named encoder / decoder; the model stays on its device): a decode benchmark or memory
    measurement needs only the decoder (LTX-2's encoder alone is 2.6 GiB in fp32)."""
    other = "encoder" if op == "decode" else "decoder"
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == other:
            for p in module.parameters():
                p.data = p.data.new_empty(0)
    return model


def make_input(family: str, spec: dict, seed: int = 0) -> torch.Tensor:
    """For spec["op"] "encode": pixels in [-1, 1] (B,C,T,H,W, the family's image channels) of spec's
    frames x height x width; for "decode": a N(0,1) raw latent (B,C,T',h,w) that decodes to that size, with
    spec["tiny"] for the tiny test model (a tiny checkpoint shares the released latent geometry; a tiny
    config, such as HunyuanVideo 1.0's, may have fewer latent channels)."""
    g = torch.Generator().manual_seed(seed)
    frames, height, width = spec["frames"], spec["height"], spec["width"]
    model = meta_model(family)
    small = families.spec(family).tiny.config
    if spec.get("tiny") and small is not None:
        with torch.device("meta"):
            model = families.spec(family).vae_class(small)
    if spec["op"] == "encode":
        return torch.rand(1, model.in_channels, frames, height, width, generator=g) * 2 - 1
    sf, tf = model.spatial_factor, model.temporal_factor
    shape = (1, model.latent_channels, (frames - 1) // tf + 1, height // sf, width // sf)
    return torch.randn(shape, generator=g)


def model_flops(family: str, op: str, spec: dict, tiny: bool = False) -> int:
    """Upstream's FLOPs (2 x multiply-adds, torch's counter) of `op` on the clip of `spec` (frames,
    height, width): the straightforward path of the same config on the meta device (shapes only, a
    few seconds); the yardstick of a row's model-FLOP rate."""
    from bench.common import count_flops

    config = weights(family, tiny)[0] if tiny else meta_model(family).config
    with torch.device("meta"):
        model = families.spec(family).vae_class(config)
    x = make_input(family, dict(spec, op=op, tiny=tiny)).to("meta")
    io = dict(out_device="meta") if op == "decode" else {}
    return count_flops(lambda: run(model, op, x, None, vae.Optimizations.straightforward(), **io))


SETTING_NAMES = tuple(field.name for field in dataclasses.fields(vae.Settings))


def _split(settings: dict | None) -> tuple[vae.Settings, dict]:
    """A benchmark's settings dict -> (the engine's `vae.Settings`, the other engine arguments: the crop)."""
    rest = dict(settings or {})
    return vae.Settings(**{name: rest.pop(name) for name in SETTING_NAMES if name in rest}), rest


def run(model, op: str, x: torch.Tensor, settings: dict | vae.Plan | None = None, opts=None, **io):
    """`vae.encode` / `vae.decode` (op) of `x` by StreamVAE's `model`: `settings` are the engine's
    `vae.Settings` fields (temporal_chunk, tile_size, tiling, tile_overlap, memory_budget,
    cache_offload, stream_frames) and the crop (num_frames, height, width), or a `vae.Plan` from
    `plan`; `opts` the kernels' `Optimizations` (None: the default), `io` where the frames go (out,
    out_device, sink)."""
    engine_op = vae.encode if op == "encode" else vae.decode
    how, crop = (settings, {}) if isinstance(settings, vae.Plan) else _split(settings)
    return engine_op(model, x, how, opts=opts, **crop, **io)


def plan(model, op: str, shape: tuple, settings: dict | None = None, opts=None, **placement) -> vae.Plan:
    """The plan the engine makes for `run` with the same arguments (chunk, tiles, predicted peak);
    `placement`: `vae.plan`'s device and io_on_device."""
    return vae.plan(model, op, shape, _split(settings)[0], opts=opts, **placement)
