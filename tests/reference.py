"""Access to the shared reference fixtures (../shared/reference/<family>/) for the tests.

The fixtures are produced by the upstream implementations; tests compare against them and never
write to them. `STREAMVAE_SHARED` overrides where the shared folder is (default: beside the repo).
"""
import json
import os
from functools import lru_cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vae import families

REPO = Path(__file__).resolve().parent.parent


def magnitude(reference: torch.Tensor) -> float:
    """max(1, max |reference|): what every exactness bound of the suite is multiplied by, so that a bound
    is the same relative error at any output magnitude (a fixed one is crossed by one machine's rounding
    of a large output: AVX-512 against AVX2)."""
    return max(1.0, float(reference.detach().abs().max()))


def assert_exact(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5, rtol: float = 0, **kwargs) -> None:
    """`torch.testing.assert_close` with `atol` x `magnitude(expected)` (and `rtol`, 0 unless given)."""
    torch.testing.assert_close(actual, expected, atol=atol * magnitude(expected), rtol=rtol, **kwargs)


def shared_dir() -> Path:
    path = Path(os.environ.get("STREAMVAE_SHARED", REPO.parent / "shared"))
    if not (path / "reference").is_dir():
        pytest.fail(f"shared fixtures not found at {path}; set STREAMVAE_SHARED to the folder holding reference/")
    return path


def reference_dir(family: str) -> Path:
    return shared_dir() / "reference" / family


def tiny_checkpoint(family: str) -> Path:
    return reference_dir(family) / "tiny_vae.safetensors"


# The families with a tiny checkpoint among the upstream fixtures (`TinyModel.fixture_config` of their
# specs); the others are tested against diffusers' classes (test_wan_variants.py, test_ltx2.py,
# test_hv15.py), and every family against the contract of test_families.py.
TINY_FAMILIES = tuple(spec.name for spec in families.SPECS if spec.tiny.fixture_config is not None)


@lru_cache(maxsize=None)
def tensors(family: str, name: str) -> dict:
    """A fixture safetensors file as a dict of tensors (cached; callers must not modify them)."""
    return load_file(str(reference_dir(family) / name))


# Each fixture family's upstream clip: (file, video input, file, raw decoder input); 9 frames of 64x64,
# 3 latent frames (8x8; Wan2.2: 4x4).
FIXTURE_CLIPS = {
    "seedvr2": ("tiny_inputs.safetensors", "video", "tiny_outputs.safetensors", "dec.input"),
    "wan21": ("reference_io.safetensors", "video_in", "reference_io.safetensors", "dec_in_z_raw"),
    "wan22": ("reference_io.safetensors", "video_in", "reference_io.safetensors", "dec_in_z_raw"),
}


def fixture_clip(family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(video B,3,T,H,W, raw latent B,C,T',h,w) of `family`'s upstream fixture (one of `TINY_FAMILIES`)."""
    video_file, video_key, latent_file, latent_key = FIXTURE_CLIPS[family]
    return tensors(family, video_file)[video_key], tensors(family, latent_file)[latent_key]


@lru_cache(maxsize=None)
def manifest(family: str) -> dict:
    return json.loads((reference_dir(family) / "manifest_full.json").read_text())


def random_weights(module, seed: int):
    """`module` (eval mode) with seeded weights of unit-ish gain in place (1-D norm scales near 1),
    so activations stay O(1) through the network; a module built on the meta device and moved with
    `to_empty` gets them without being initialised twice."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(generator=g)
            if p.dim() > 1:
                p.div_(p[0].numel() ** 0.5)
            else:
                p.mul_(0.1).add_(1 if name.endswith("gamma") else 0)
    return module.eval()


def load_tiny(family: str, **kwargs):
    """The tiny fixture model of `family` (one of `TINY_FAMILIES`) with the config its shapes cannot tell."""
    import vae

    return vae.load(tiny_checkpoint(family), config=families.spec(family).tiny.fixture_config, **kwargs)


def cut_pool(pool: torch.Tensor, n: int, start: int) -> torch.Tensor:
    """n values of `pool` from `start` on, wrapping round to its start (a copy): the released-width tests cut
    their seeded random weights from one drawn pool, which is much faster than drawing each tensor."""
    pieces = []
    while n:
        pieces.append(pool[start:start + n])
        n, start = n - len(pieces[-1]), 0
    return torch.cat(pieces)
