"""ComfyUI core's own VAE of a family, loaded with the same state dict as StreamVAE's, for comparison.

Which module of core holds a family's VAE, and the first core version it is compared on, is the family's spec's
(`FamilySpec.core`); how to build and call the VAE of each such module is here (`BUILDS`). Two cores (`TREES`), each
a ComfyUI source tree found as below:
- "0.3.75": the tree the tests run (.cache/ComfyUI, or STREAMVAE_COMFYUI): Wan (comfy/ldm/wan/vae.py, vae2_2.py) and
  HunyuanVideo 1.5 (comfy/ldm/hunyuan_video/vae_refiner.py).
- "0.33.0" (.cache/comfyui-0.33.0/ComfyUI, or STREAMVAE_COMFYUI_033): Wan through its WanVAE, SeedVR2 through its
  native VAE (comfy/ldm/seedvr/vae.py), HunyuanVideo 1.5 through its encoder and decoder, LTX-2 through its
  `VideoVAE` (comfy/ldm/lightricks/vae/causal_video_autoencoder.py) built from the upstream config of StreamVAE's,
  LTX-2.5's diffusion-decoder VAE through its `CausalDiffusionVAE`
  (comfy/ldm/lightricks/vae/na_diffusion_decoder.py; its decode draws its noise with seed 0, StreamVAE's default),
  HunyuanVideo 1.0 through its `AutoencoderKL` with `conv3d=True` (comfy/ldm/models/autoencoder.py), given
  StreamVAE's weights (diffusers' names) in core's by its loader's conversion, MiniMax-H3 through its
  `MiniMaxH3VideoVAE` (comfy/ldm/minimax/vae.py) at the config's widths. This core imports comfy-kitchen and
  comfy-aimdo; they come from STREAMVAE_CORE_SITE, a folder they were installed into (`pip install --target`, as
  bench/gpu_session.sh does with the wheels bench/prepare_gpu_carry.sh fetched: kitchen 0.2.40, aimdo 0.6.0, what
  core's users run), else from the 0.33.0 server's venv that .ci/setup builds (CPU builds).

Core's VAEs use the checkpoint's key names, which are StreamVAE's native ones (but HunyuanVideo 1.0's:
`CoreBuild.keys`). Core's Wan `decode` takes the raw latent and returns unclamped pixels in [-1, 1], as StreamVAE's
does; `encode` returns the raw mean. Core's SeedVR2 `decode` takes the latent its LATENT holds (raw x scaling
factor), so it is wrapped to take the raw latent (`RawLatentDecode`), and core's LTX VAE to take and give raw
latents (`NormalizedLatentVAE`; its LATENT is normalised by the checkpoint's statistics), and core's MiniMax-H3 VAE
to take and give raw latents and frames in [-1, 1] before its clamp (`CoreMiniMaxH3`). A process holds one ComfyUI:
its tree and packages go at the end of the import path (after the benchmark's own modules are imported, since a
tree's `tests`, `utils` and `app` packages would shadow others), and ComfyUI reads its command line on import: --cpu
unless the model is to run on CUDA.
"""
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from vae import families

REPO = Path(__file__).resolve().parent.parent


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


@dataclass(frozen=True)
class CoreTree:
    version: str
    env: str  # the variable that overrides where the tree is
    default: Path
    site_venv: Path | None = None  # a venv whose site-packages hold the core's own packages (CPU builds)

    @property
    def path(self) -> Path:
        return Path(os.environ.get(self.env, self.default)).resolve()

    @property
    def modules(self) -> dict[str, str]:
        """family -> the module of this core with its VAE: the families whose `FamilySpec.core` this version has."""
        return {spec.name: spec.core.module for spec in families.SPECS
                if spec.core is not None and _version(self.version) >= _version(spec.core.since)}

    def sites(self) -> list[Path]:
        """Folders with the core's own packages (comfy-kitchen, comfy-aimdo), appended to the import path."""
        if os.environ.get("STREAMVAE_CORE_SITE"):
            return [Path(os.environ["STREAMVAE_CORE_SITE"]).resolve()]
        if self.site_venv is None:
            return []
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"  # compiled parts must match
        return [p for p in [self.site_venv / "lib" / version / "site-packages"] if p.is_dir()]


TREES = {tree.version: tree for tree in (
    CoreTree("0.3.75", "STREAMVAE_COMFYUI", REPO / ".cache" / "ComfyUI"),
    CoreTree("0.33.0", "STREAMVAE_COMFYUI_033", REPO / ".cache" / "comfyui-0.33.0" / "ComfyUI",
             REPO / ".cache" / "venv-comfy-0.33.0"),
)}
# The core packages whose versions a row records.
CORE_PACKAGES = ("comfy_kitchen", "comfy_aimdo")


def _import_core(version: str, module: str, cpu: bool):
    tree = TREES[version]
    if not (tree.path / "comfy").is_dir():
        raise RuntimeError(f"ComfyUI {version} not found at {tree.path} (set {tree.env}, or run .ci/setup; on a "
                           "GPU machine bench/prepare_gpu_carry.sh copies it)")
    loaded = sys.modules.get("comfy")
    if loaded is not None and Path(next(iter(loaded.__path__))).resolve().parent != tree.path:
        raise RuntimeError(f"this process already imported ComfyUI from {next(iter(loaded.__path__))}: one core per process")
    for folder in [tree.path, *tree.sites()]:
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
    import comfy.options

    comfy.options.enable_args_parsing()
    argv, sys.argv = sys.argv, [sys.argv[0], *(["--cpu"] if cpu else [])]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise RuntimeError(f"ComfyUI {version} cannot import {module} ({error}); its own packages come from "
                           f"STREAMVAE_CORE_SITE or {tree.site_venv} (see bench/core_vae.py)") from error
    finally:
        sys.argv = argv


def package_versions() -> dict:
    """Versions of the core packages this process imported (comfy-kitchen, comfy-aimdo), where known."""
    from importlib import metadata

    versions = {}
    for name in CORE_PACKAGES:
        if name in sys.modules:
            try:
                versions[name] = metadata.version(name.replace("_", "-"))
            except metadata.PackageNotFoundError:
                versions[name] = getattr(sys.modules[name], "__version__", "unknown")
    return versions


class RawLatentDecode(torch.nn.Module):
    """Core's SeedVR2 VAE with StreamVAE's latent convention: `decode` takes the raw latent."""

    def __init__(self, core: torch.nn.Module, scaling_factor: float):
        super().__init__()
        self.core, self.scaling_factor = core, scaling_factor

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.core.decode(z * self.scaling_factor)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.core.encode(x)


class NormalizedLatentVAE(torch.nn.Module):
    """Core's LTX VAE with StreamVAE's latent convention: its `decode` takes, and `encode` gives, the
    latent normalised by the checkpoint's per-channel statistics; here both are raw."""

    def __init__(self, core: torch.nn.Module):
        super().__init__()
        self.core = core

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.core.decode(self.core.per_channel_statistics.normalize(z))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.core.per_channel_statistics.un_normalize(self.core.encode(x))


def _seedvr2(core, cfg) -> torch.nn.Module:
    """Core's SeedVR2 wrapper; for a config other than the released one (the tiny test checkpoint's
    channel widths and groups, which core fixes as constants) its own classes with those values."""
    released = tuple(cfg.block_out_channels) == tuple(core.BYTEDANCE_BLOCK_OUT_CHANNELS) and cfg.norm_num_groups == 32
    if released:
        return core.VideoAutoencoderKLWrapper()
    wrapper = core.VideoAutoencoderKLWrapper
    model = wrapper.__new__(wrapper)  # what wrapper.__init__ does, with the config's widths and groups
    model.spatial_downsample_factor, model.temporal_downsample_factor = 8, 4
    saved, core.BYTEDANCE_BLOCK_OUT_CHANNELS = core.BYTEDANCE_BLOCK_OUT_CHANNELS, tuple(cfg.block_out_channels)
    try:
        core.VideoAutoencoderKL.__init__(model, norm_num_groups=cfg.norm_num_groups)
    finally:
        core.BYTEDANCE_BLOCK_OUT_CHANNELS = saved
    model.set_memory_limit(core.BYTEDANCE_VAE_CONV_MEM_GIB, core.BYTEDANCE_VAE_NORM_MEM_GIB)
    return model


class CoreHv15(torch.nn.Module):
    """Core's HunyuanVideo 1.5 encoder and decoder, as its AutoencodingEngine runs them (no quant convs;
    the encoder's own regulariser returns the posterior mean): `decode` takes the raw latent."""

    def __init__(self, core, cfg):
        super().__init__()
        config = dict(block_out_channels=list(cfg.block_out_channels), in_channels=cfg.in_channels,
                      out_channels=cfg.out_channels, z_channels=cfg.latent_channels, num_res_blocks=cfg.layers_per_block,
                      ffactor_spatial=cfg.spatial_compression, ffactor_temporal=cfg.temporal_compression,
                      downsample_match_channel=cfg.downsample_match_channel,
                      upsample_match_channel=cfg.upsample_match_channel)
        self.encoder, self.decoder = core.Encoder(**config), core.Decoder(**config)
        # 0.33.0 builds its mid-blocks' residual blocks with a time-embedding projection that the
        # checkpoint does not hold and that core never runs (its VAE passes no time embedding).
        for part in (self.encoder, self.decoder):
            for block in (part.mid.block_1, part.mid.block_2):
                block.temb_proj = None

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z)


def _wan(core, cfg) -> torch.nn.Module:
    kwargs = dict(dim=cfg.dim, z_dim=cfg.z_dim, dim_mult=list(cfg.dim_mult), num_res_blocks=cfg.num_res_blocks,
                  attn_scales=[], temperal_downsample=list(cfg.temperal_downsample), dropout=0.0)
    if hasattr(cfg, "dec_dim"):
        kwargs["dec_dim"] = cfg.dec_dim
    return core.WanVAE(**kwargs)


def _ltx(core, cfg) -> torch.nn.Module:
    from vae.model.ltx2.checkpoint import upstream_config

    return core.VideoVAE(config=upstream_config(cfg))


def _ltx25(core, cfg) -> torch.nn.Module:
    from vae.model.ltx25.checkpoint import upstream_config

    model = core.CausalDiffusionVAE(config=upstream_config(cfg))
    # its one buffer no state dict holds (the sampling's timesteps, computed at build): off the meta device
    steps = model.decoder.default_inference_timesteps.shape[0]
    model.decoder.register_buffer("default_inference_timesteps", torch.linspace(1.0, 1.0 / steps, steps, device="cpu"),
                                  persistent=False)
    return model


def _autoencoder_kl(core, cfg) -> torch.nn.Module:
    """Core's `AutoencoderKL` with `conv3d=True` (its HunyuanVideo 1.0 VAE) at the config's widths (core's
    loader builds the released ones only): `encode` gives the raw posterior mode, `decode` takes the raw latent."""
    widths = cfg.block_out_channels
    ddconfig = {"double_z": True, "z_channels": cfg.latent_channels, "resolution": 256, "in_channels": cfg.in_channels,
                "out_ch": cfg.out_channels, "ch": widths[0], "ch_mult": [w // widths[0] for w in widths],
                "num_res_blocks": cfg.layers_per_block, "attn_resolutions": [], "dropout": 0.0, "conv3d": True,
                "time_compress": 4}
    return core.AutoencoderKL(ddconfig=ddconfig, embed_dim=cfg.latent_channels)


def _minimax_h3(core, cfg) -> torch.nn.Module:
    """Core's `MiniMaxH3VideoVAE` at the config's widths and tiles, its decoder at the config's depth and heads
    (core's loader builds the released ones only). The buffers no state dict holds, computed at build (the
    pixel statistics, the rope's frequencies), are built off the meta device: core's constants, and the rope
    of a decoder with no blocks built on the CPU."""
    model = core.MiniMaxH3VideoVAE(ch=cfg.base_channels, ch_mult=list(cfg.multipliers),
                                   num_res_blocks=list(cfg.res_blocks), tile_size=cfg.tile_size,
                                   tile_overlap_min=cfg.tile_overlap_min)
    decoder = dict(patch_size=model.vae_ratio, patch_size_t=model.vae_ratio_t, in_channels=cfg.z_channels,
                   heads=cfg.heads, dim_head=cfg.head_dim, num_register_tokens=cfg.register_tokens)
    model.decoder = core.ViT3DDecoder(num_layers=cfg.layers, **decoder)
    with torch.device("cpu"):
        model.decoder.pos_embed = core.ViT3DDecoder(num_layers=0, **decoder).pos_embed
        for name, value in (("pixel_mean", core.IMAGENET_MEAN), ("pixel_std", core.IMAGENET_STD)):
            model.register_buffer(name, torch.tensor(value).view(1, 3, 1, 1, 1), persistent=False)
    return model


class CoreMiniMaxH3(torch.nn.Module):
    """Core's MiniMax-H3 VAE (`core`) with StreamVAE's conventions: raw latents in and out, frames in [-1, 1].
    Core's own `encode` gives its LATENT (normalised by the latent statistics) and its `decode` takes that and
    gives frames in [0, 1], clamped: `frames(latent, clamp)`, with or without that clamp. StreamVAE's decode,
    as every family's, does not clamp, so `decode` is core's before its clamp (a few elementwise operations,
    which would hide most of a decode with random weights), x 2 - 1."""

    def __init__(self, core: torch.nn.Module):
        super().__init__()
        self.core = core

    def _statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The latent statistics, B,C,T,h,w-broadcastable, in `like`'s dtype and device."""
        return tuple(s.view(1, -1, 1, 1, 1).to(like) for s in (self.core.latents_mean, self.core.latents_std))

    def frames(self, latent: torch.Tensor, clamp: bool = True) -> torch.Tensor:
        """Core's LATENT B,24,T',h,w -> core's frames B,3,T,H,W in [0, 1] (`clamp`) or before its clamp."""
        core = self.core
        if clamp:
            return core.decode(latent)

        def unclamped(part):  # core's `_finalize_pixels` less its `clamp_(0, 1)`
            return part * core.pixel_std.to(device=part.device, dtype=torch.float32) + core.pixel_mean.to(
                device=part.device, dtype=torch.float32)

        core._finalize_pixels = unclamped  # an instance attribute over the class's method, for this call
        try:
            return core.decode(latent)
        finally:
            del core._finalize_pixels

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        mean, std = self._statistics(z)
        return self.frames((z - mean) / std, clamp=False) * 2 - 1

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        latent = self.core.encode(x)
        mean, std = self._statistics(latent)
        return latent * std + mean


def _diffusers_names(state_dict: dict) -> dict:
    """A state dict in diffusers' VAE key names in core's, by core's own loader conversion."""
    return importlib.import_module("comfy.diffusers_convert").convert_vae_state_dict(state_dict)


@dataclass(frozen=True)
class CoreBuild:
    """How to build a core module's VAE for a StreamVAE config (`build(module, cfg)`, on the meta device),
    give it StreamVAE's state dict in its key names (`keys`: core's module is imported by then) and wrap the
    loaded model so that it takes and gives raw latents (`wrap(model, cfg)`)."""

    build: Callable
    wrap: Callable = lambda model, cfg: model
    keys: Callable = lambda state_dict: state_dict


# Keyed by core's module (`CoreVAE.module` of the families' specs): what it takes is that module's API.
BUILDS = {
    "comfy.ldm.wan.vae": CoreBuild(_wan),
    "comfy.ldm.wan.vae2_2": CoreBuild(_wan),
    "comfy.ldm.seedvr.vae": CoreBuild(_seedvr2, lambda model, cfg: RawLatentDecode(model, cfg.scaling_factor)),
    "comfy.ldm.hunyuan_video.vae_refiner": CoreBuild(CoreHv15),
    "comfy.ldm.lightricks.vae.causal_video_autoencoder": CoreBuild(_ltx, lambda model, cfg: NormalizedLatentVAE(model)),
    "comfy.ldm.lightricks.vae.na_diffusion_decoder": CoreBuild(_ltx25, lambda model, cfg: NormalizedLatentVAE(model)),
    "comfy.ldm.models.autoencoder": CoreBuild(_autoencoder_kl, keys=_diffusers_names),
    "comfy.ldm.minimax.vae": CoreBuild(_minimax_h3, lambda model, cfg: CoreMiniMaxH3(model)),
}


def core_model(version: str, family: str, cfg, state_dict: dict, dtype: torch.dtype, device="cpu") -> torch.nn.Module:
    """Core `version`'s VAE of `family` for StreamVAE config `cfg`, with `state_dict` loaded (strict),
    in `dtype` on `device`, eval mode; `decode` takes the raw latent, as StreamVAE's."""
    tree = TREES[version]
    if family not in tree.modules:
        raise ValueError(f"ComfyUI {version} has no VAE to compare for {family!r} (has {sorted(tree.modules)})")
    module = tree.modules[family]
    core = _import_core(version, module, cpu=torch.device(device).type != "cuda")
    with torch.device("meta"):
        model = BUILDS[module].build(core, cfg)
    model.load_state_dict(BUILDS[module].keys(state_dict), strict=True, assign=True)
    return BUILDS[module].wrap(model.to(device=device, dtype=dtype).eval().requires_grad_(False), cfg)
