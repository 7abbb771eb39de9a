"""A small HunyuanVideo 1.5 checkpoint as users have it: seeded random weights in the released (ComfyUI
core's) key names, as real safetensors. Core's loader recognises the family by a decoder taking 32 latent
channels and its encoder divides its last width by 2 x 32, so the widths are (8, 16, 32, 64, 64) with the
released 32 latent channels and 2 residual blocks per stage (5.1 M weights instead of 1.26 B).
"""
from pathlib import Path

import vae
from reference import random_weights

WIDTHS = (8, 16, 32, 64, 64)


def save_small_checkpoint(path: Path, seed: int = 41) -> vae.Hv15VAE:
    """The model written to `path` (fp32, released key names); the same every time for one seed."""
    model = random_weights(vae.Hv15VAE(vae.Hv15Config(block_out_channels=WIDTHS)), seed)
    vae.save_checkpoint(model.state_dict(), path)
    return model
