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


def save_small_checkpoint(path: Path, seed: int = 52) -> Hv10VAE:
    """The model written to `path` (fp32, released key names); the same every time for one seed."""
    model = random_weights(Hv10VAE(SMALL), seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.endswith(".weight"):  # every 1-D weight is a GroupNorm's scale
                p.add_(1.0)
    vae.save_checkpoint(model.state_dict(), path)
    return model
