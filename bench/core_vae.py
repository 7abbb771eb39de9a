"""ComfyUI core's own VAE of a family, built from the same state dict as StreamVAE's, for comparison.

Core's Wan VAEs (comfy/ldm/wan/vae.py, vae2_2.py) use the checkpoint's key names, which are also
StreamVAE's native ones, so one random state dict loads into both. Their `decode` takes the raw
latent and returns unclamped pixels in [-1, 1], as StreamVAE's does; `encode` returns the raw mean.
The ComfyUI checkout is found as the tests find it (STREAMVAE_COMFYUI, default .cache/ComfyUI).
"""
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
COMFYUI = Path(os.environ.get("STREAMVAE_COMFYUI", REPO / ".cache" / "ComfyUI")).resolve()

# family -> the core module with its WanVAE
CORE_WAN = {"wan21": "comfy.ldm.wan.vae", "wan22": "comfy.ldm.wan.vae2_2"}


def _import_core(module: str, cpu: bool = True):
    """Import a ComfyUI module (its model_management reads the command line on import: --cpu
    unless a GPU run is wanted)."""
    if not (COMFYUI / "comfy").is_dir():
        raise RuntimeError(f"ComfyUI not found at {COMFYUI} (set STREAMVAE_COMFYUI)")
    if str(COMFYUI) not in sys.path:
        sys.path.insert(0, str(COMFYUI))
    import importlib

    import comfy.options

    comfy.options.enable_args_parsing()
    argv, sys.argv = sys.argv, [sys.argv[0], *(["--cpu"] if cpu else [])]
    try:
        return importlib.import_module(module)
    finally:
        sys.argv = argv


def core_model(family: str, cfg, state_dict: dict, dtype: torch.dtype, cpu: bool = True) -> torch.nn.Module:
    """Core's VAE of `family` for StreamVAE config `cfg` (a Wan21Config / Wan22Config), with
    `state_dict` loaded (strict), in `dtype`, eval mode, on the CPU (ComfyUI imported with --cpu
    unless `cpu` is False)."""
    if family not in CORE_WAN:
        raise ValueError(f"no ComfyUI core VAE to compare for {family!r} (have {sorted(CORE_WAN)})")
    core = _import_core(CORE_WAN[family], cpu)
    kwargs = dict(dim=cfg.dim, z_dim=cfg.z_dim, dim_mult=list(cfg.dim_mult), num_res_blocks=cfg.num_res_blocks,
                  attn_scales=[], temperal_downsample=list(cfg.temperal_downsample), dropout=0.0)
    if hasattr(cfg, "dec_dim"):
        kwargs["dec_dim"] = cfg.dec_dim
    with torch.device("meta"):
        model = core.WanVAE(**kwargs)
    model.load_state_dict(state_dict, strict=True, assign=True)
    return model.to(dtype).eval()
