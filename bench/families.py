"""Full released configs of each family and the benchmark inputs (seeded)."""
import torch

import vae


def seedvr2():
    return vae.SeedVR2VAE, vae.SeedVR2Config()


def wan21():
    return vae.Wan21VAE, vae.Wan21Config()


def wan22():
    return vae.Wan22VAE, vae.Wan22Config()


def qwen21():
    return vae.Qwen21VAE, vae.Qwen21Config()


FULL_CONFIGS = {"seedvr2": seedvr2, "wan21": wan21, "wan22": wan22, "qwen21": qwen21}


def make_input(model, spec: dict, seed: int = 0) -> torch.Tensor:
    """Pixels in [-1, 1] (B,C,T,H,W, the model's image channels) for encode, a N(0,1) raw latent of the matching size for decode."""
    g = torch.Generator().manual_seed(seed)
    frames, height, width = spec["frames"], spec["height"], spec["width"]
    if spec["op"] == "encode":
        return torch.rand(1, model.in_channels, frames, height, width, generator=g) * 2 - 1
    sf, tf = model.spatial_factor, model.temporal_factor
    shape = (1, model.latent_channels, (frames - 1) // tf + 1, height // sf, width // sf)
    return torch.randn(shape, generator=g)
