"""LTX-2 test checkpoints: seeded random weights at reduced widths (and the released ones), written as
users have them: the VAE inside a full LTX-2 checkpoint (core's key names under `vae.`, the upstream
config as JSON in the safetensors metadata `config` -> `vae`, beside other models' tensors), a split
VAE file in core's names, and diffusers' `AutoencoderKLLTX2Video` names.

Variants (core's versions): "ltx2" (LTX-2 2.0/2.3 layout: space-to-depth encoder, residual
depth-to-space decoder, reflect padding), "ltx25" (the same with zero padding, as 2.5), "v090"
(LTX-Video 0.9.0: strided-conv encoder, width-changing residual blocks, plain depth-to-space),
"v091" (0.9.1: timestep conditioning and noise maps), "v095" (0.9.5-0.9.8: the LTX-2 layout with
timestep conditioning). Core's VAE holds 128-channel statistics, so every variant has 128 latent
channels; the widths inside are small.
"""
import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vae.model.ltx2 import LTX2Config, LTX2VAE
from vae.model.ltx2.blocks import LTXBlock
from vae.model.ltx2.checkpoint import upstream_config


def _b(name, **params) -> LTXBlock:
    return LTXBlock(name, **params)


def _res(n=1, **kw) -> LTXBlock:
    return _b("res_x", num_layers=n, **kw)


S2D = (_res(), _b("compress_space_res", multiplier=2), _res(), _b("compress_time_res", multiplier=2), _res(),
       _b("compress_all_res", multiplier=2), _res(), _b("compress_all_res", multiplier=2), _res())
D2S = (_res(), _b("compress_all", multiplier=2, residual=True), _res(2), _b("compress_all", multiplier=2, residual=True),
       _res(), _b("compress_all", multiplier=2, residual=True), _res())
VARIANTS = {
    "ltx2": LTX2Config(encoder_blocks=S2D, decoder_blocks=D2S, encoder_channels=8, decoder_channels=64),
    "ltx25": LTX2Config(encoder_blocks=S2D, decoder_blocks=D2S, encoder_channels=8, decoder_channels=64,
                        decoder_padding="zeros"),
    "v090": LTX2Config(
        encoder_blocks=(_res(), _b("compress_all"), _b("res_x_y", multiplier=2), _res(), _b("compress_all"),
                        _b("res_x_y", multiplier=2), _b("compress_all"), _res()),
        decoder_blocks=(_res(), _b("compress_all"), _b("res_x_y", multiplier=2), _res(), _b("compress_all"),
                        _b("res_x_y", multiplier=2), _b("compress_all"), _res()),
        encoder_channels=8, decoder_channels=32),
    "v091": LTX2Config(
        encoder_blocks=(_res(), _b("compress_all"), _b("res_x_y", multiplier=2), _b("compress_all"),
                        _b("res_x_y", multiplier=2), _b("compress_all"), _res()),
        decoder_blocks=(_res(inject_noise=True), _b("compress_all", multiplier=2, residual=True), _res(2, inject_noise=True),
                        _b("compress_all", multiplier=2, residual=True), _res(), _b("compress_all", multiplier=2, residual=True),
                        _res()),
        encoder_channels=8, decoder_channels=64, timestep_conditioning=True),
    "v095": LTX2Config(encoder_blocks=S2D, decoder_blocks=D2S, encoder_channels=8, decoder_channels=64,
                       timestep_conditioning=True),
}


def random_weights(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Seeded weights of unit-ish gain (so activations stay O(1) through the network), latent statistics
    near (0, 1), the timestep multiplier at its released 1000."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("timestep_scale_multiplier"):
                p.fill_(1000.0)
            elif p.dim() > 1 and not name.endswith(("scale_shift_table", "per_channel_scale1", "per_channel_scale2")):
                p.copy_(noise / p[0].numel() ** 0.5)
            else:
                p.copy_(0.1 * noise)
        for name, b in model.named_buffers():
            if name.endswith(("mean-of-means", "latents_mean")):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith(("std-of-means", "latents_std")):
                b.copy_(1 + 0.2 * torch.rand(b.shape, generator=g))
    return model.eval()


def model(variant: str, seed: int = 1) -> LTX2VAE:
    return random_weights(LTX2VAE(VARIANTS[variant]), seed)


def metadata(cfg: LTX2Config) -> dict[str, str]:
    """An LTX-2 checkpoint's metadata: the whole model's config, the VAE's under `vae`."""
    return {"config": json.dumps({"vae": upstream_config(cfg), "transformer": {"num_layers": 1}})}


def save_full_checkpoint(m: LTX2VAE, path: Path, extra_bytes: int = 1 << 20) -> Path:
    """The VAE under `vae.` in core's names with the metadata config, beside a diffusion model's
    tensors (`extra_bytes` of them), an audio VAE's and a vocoder's, as the single LTX-2 file has it."""
    tensors = {f"vae.{k}": v.contiguous() for k, v in m.state_dict().items()}
    tensors["vae.per_channel_statistics.channel"] = torch.arange(m.latent_channels, dtype=torch.float32)
    tensors["vae.per_channel_statistics.mean-of-stds"] = torch.ones(m.latent_channels)
    tensors["model.diffusion_model.patchify_proj.weight"] = torch.zeros(extra_bytes // 2, dtype=torch.bfloat16)
    tensors["audio_vae.encoder.conv_in.conv.weight"] = torch.zeros(8, 2, 3, 3)
    tensors["vocoder.conv_pre.weight"] = torch.zeros(4, 8, 7)
    save_file(tensors, str(path), metadata=metadata(m.config))
    return path


CORE_RUNNER = Path(__file__).parent / "comfy_support" / "core_ltx2.py"


def run_core(jobs: list[dict], folder: Path, runner: Path = CORE_RUNNER) -> list[dict[str, torch.Tensor]]:
    """Core 0.33.0's results for `jobs` (`runner`, comfy_support/core_ltx2.py by default: a process of its own),
    one dict each."""
    (folder / "jobs.json").write_text(json.dumps(jobs))
    done = subprocess.run([sys.executable, str(runner), str(folder / "jobs.json")], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return [load_file(job["outputs"]) for job in jobs]


def close(got: torch.Tensor, expected: torch.Tensor, rel: float) -> float:
    """The worst error, asserted within rel x max(1, |expected|)."""
    assert got.shape == expected.shape
    error = (got - expected).abs().max().item()
    assert error <= rel * max(1.0, expected.abs().max().item()), error
    return error
