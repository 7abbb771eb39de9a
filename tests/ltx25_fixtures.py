"""LTX-2.5 diffusion-decoder test checkpoints: seeded random weights at reduced widths, written as users
have them: a split VAE file, or the VAE under `vae.` inside a full LTX-2.5 checkpoint, in core's key
names with upstream's config (`CausalDiffusionVAE`) as JSON in the safetensors metadata `config` -> `vae`
(core builds its model from that config, so the small widths need it).

Variants: "released_windows" (the family's tiny model, `vae/model/ltx25/spec.py`: the released windows,
11x11x11 in stage 5, and strides; x0 in one step), "other_windows" (other and unequal windows, stride
volumes split unlike the release's, v prediction in two steps). Core's VAE holds 128-channel statistics, so
both have 128 latent channels; inside they are small.
"""
import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from ltx2_fixtures import random_weights as ltx2_random_weights
from ltx2_fixtures import run_core as ltx2_run_core
from vae.model.ltx25 import LTX25Config, LTX25VAE
from vae.model.ltx25.blocks import swiglu_hidden
from vae.model.ltx25.checkpoint import upstream_config
from vae.model.ltx25.spec import TINY

OTHER_WIDTHS = (64, 32, 32, 32, 16)
VARIANTS: dict[str, LTX25Config] = {
    "released_windows": TINY,
    "other_windows": replace(TINY, stage_channels=OTHER_WIDTHS, mlp_hidden=tuple(swiglu_hidden(c) for c in OTHER_WIDTHS),
                             stage_depths=(1, 2, 1, 1, 1), stage_kernels=((3, 3, 3), (1, 3, 5), (5, 3, 3), (3, 5, 3)),
                             stage5_kernel=(5, 3, 7), upsample_strides=((2, 2, 1), (1, 1, 2), (2, 2, 2), (2, 2, 2)),
                             num_inference_steps=2, model_output_type="v"),
}


def model(variant: str, seed: int = 1) -> LTX25VAE:
    """The variant with seeded weights: the encoder as LTX-2's tests make it; in the decoder unit-gain
    matrices, RMS gains near 1, q/k norm gains near 2 (so each query's softmax is peaked and a window
    off by one position changes the frames), small biases and modulation tables."""
    m = ltx2_random_weights(LTX25VAE(VARIANTS[variant]), seed)
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in m.decoder.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.copy_(2.0 + 0.5 * noise)
            elif name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight")):
                p.copy_(1.0 + 0.1 * noise)
    return m


def metadata(cfg: LTX25Config) -> dict[str, str]:
    """An LTX-2.5 checkpoint's metadata: the whole model's config, the VAE's under `vae`."""
    return {"config": json.dumps({"vae": upstream_config(cfg), "transformer": {"num_layers": 1}})}


def _tensors(m: LTX25VAE, prefix: str) -> dict[str, torch.Tensor]:
    tensors = {f"{prefix}{k}": v.contiguous() for k, v in m.state_dict().items()}
    tensors[f"{prefix}per_channel_statistics.channel"] = torch.arange(m.latent_channels, dtype=torch.float32)
    tensors[f"{prefix}per_channel_statistics.mean-of-stds"] = torch.ones(m.latent_channels)
    return tensors


def save_split(m: LTX25VAE, path: Path) -> Path:
    save_file(_tensors(m, ""), str(path), metadata=metadata(m.config))
    return path


def save_full_checkpoint(m: LTX25VAE, path: Path) -> Path:
    """The VAE under `vae.` beside a diffusion model's, an audio VAE's and a vocoder's tensors."""
    tensors = _tensors(m, "vae.")
    tensors["model.diffusion_model.patchify_proj.weight"] = torch.zeros(1024, dtype=torch.bfloat16)
    tensors["audio_vae.encoder.conv_in.conv.weight"] = torch.zeros(8, 2, 3, 3)
    tensors["vocoder.conv_pre.weight"] = torch.zeros(4, 8, 7)
    save_file(tensors, str(path), metadata=metadata(m.config))
    return path


CORE_RUNNER = Path(__file__).parent / "comfy_support" / "core_ltx25.py"


def run_core(jobs: list[dict], folder: Path) -> list[dict[str, torch.Tensor]]:
    """Core 0.33.0's results for `jobs` (comfy_support/core_ltx25.py, a process of its own), one dict each."""
    return ltx2_run_core(jobs, folder, CORE_RUNNER)
