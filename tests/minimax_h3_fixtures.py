"""MiniMax-H3 test checkpoints: seeded random weights at the tiny model's reduced widths (its spec's: 6 encoder
levels of 32-64 channels, one residual block each; a 2-layer decoder of 2 heads of 64), saved as real
safetensors files in core's key names and loaded through `vae.load` (smaller tiles than core's 256 px, a
config value no weight says, reach larger grids cheaply), and core 0.33.0's own VAE run on them
(comfy_support/core_minimax_h3.py, a process of its own)."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import vae
from bench.core_vae import TREES
from comfy_support import environment
from reference import random_weights
from vae.model.minimax_h3 import MiniMaxH3Config, MiniMaxH3VAE
from vae.model.minimax_h3.spec import TINY as SMALL
# Scales of the residual branches and norms, drawn near 1 (reference.random_weights draws 1-D weights near 0).
NEAR_ONE = ("norm1.weight", "norm2.weight", "norm_out.weight", "scale1", "scale2")


def model(cfg: MiniMaxH3Config = SMALL, seed: int = 1) -> MiniMaxH3VAE:
    m = random_weights(MiniMaxH3VAE(cfg), seed)
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(NEAR_ONE):
                p.add_(1.0)
        m.decoder.mask_token.normal_(generator=g)
        m.latents_mean.copy_(0.1 * torch.randn(m.latents_mean.shape, generator=g))
        m.latents_std.copy_(1 + 0.2 * torch.rand(m.latents_std.shape, generator=g))
    return m


def save(m: MiniMaxH3VAE, path: Path) -> Path:
    """The weights as the released file has them: core's key names (bf16 there; float32 here)."""
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(path))
    return path


def with_tiles(cfg: MiniMaxH3Config, size: int, overlap: int) -> MiniMaxH3Config:
    return dataclasses.replace(cfg, tile_size=size, tile_overlap_min=overlap)


def load(path: Path, size: int, overlap: int) -> MiniMaxH3VAE:
    """The file through the public loader, with core's tiles of `size` px overlapping by at least `overlap`."""
    return vae.load(path, config={"tile_size": size, "tile_overlap_min": overlap})


CORE_RUNNER = Path(__file__).parent / "comfy_support" / "core_minimax_h3.py"


def skip_without_core() -> None:
    """Skip the test where ComfyUI 0.33.0's tree is missing (.ci/setup builds it); on CI, fail."""
    environment.require((TREES["0.33.0"].path / "comfy").is_dir(), f"ComfyUI 0.33.0 at {TREES['0.33.0'].path}")


def core_input(op: str, shape: tuple, seed: int) -> torch.Tensor:
    """A seeded input of core's op `op`: a video in [-1, 1] to encode, else a latent (standard normal)."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) * 2 - 1 if op.endswith("encode") else torch.randn(shape, generator=g)


def run_core(jobs: list[dict], folder: Path) -> None:
    """Core 0.33.0 runs `jobs` (comfy_support/core_minimax_h3.py) in a process of its own."""
    (folder / "jobs.json").write_text(json.dumps(jobs))
    done = subprocess.run([sys.executable, str(CORE_RUNNER), str(folder / "jobs.json")], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def core_outputs(job: dict) -> dict[str, torch.Tensor]:
    return load_file(job["outputs"])
