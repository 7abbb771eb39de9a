"""A small HunyuanVideo 1.0 / Kandinsky 5 checkpoint as users have it: seeded random weights in the released
file's key names (diffusers' `AutoencoderKLHunyuanVideo`'s, which core's loader converts to its own), as real
safetensors. The tiny model's stages (its spec's: four of 32 channels, the released 32 norm groups, one residual
block per encoder stage) with the released 16 latent channels, the LATENT core's HunyuanVideo and Kandinsky 5
nodes make. The GroupNorms' scales are drawn near 1 (`reference.random_weights` draws them near 0), so the
residual branches count and the frames fill the pixel range.
"""
import dataclasses
from pathlib import Path

import torch

import vae
from reference import random_weights
from vae.model.hv10 import Hv10VAE
from vae.model.hv10.spec import SPEC

SMALL = dataclasses.replace(SPEC.tiny.config, latent_channels=SPEC.latent_channels)


def norm_scales_near_one(model: torch.nn.Module) -> torch.nn.Module:
    """`model` (ours or diffusers', seeded by `random_weights`) with its GroupNorm scales moved from near 0 to
    near 1, in place: every 1-D weight of this network is a GroupNorm's scale."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.endswith(".weight"):
                p.add_(1.0)
    return model


def save_small_checkpoint(path: Path, seed: int = 52) -> Hv10VAE:
    """The model written to `path` (fp32, released key names); the same every time for one seed."""
    model = norm_scales_near_one(random_weights(Hv10VAE(SMALL), seed))
    vae.save_checkpoint(model.state_dict(), path)
    return model
