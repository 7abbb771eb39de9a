"""ComfyUI 0.33.0's own LTX VAE on StreamVAE's test checkpoints, in a process of its own (a process holds
one ComfyUI, bench/core_vae.py): each file is loaded by core's loader (`comfy.sd.VAE` with the file's
safetensors metadata, the VAE part of a full checkpoint taken as core's checkpoint loader takes it:
the `vae.` keys), and the given latents are decoded and videos encoded by core's `VideoVAE`, in
float32 on the CPU, raw latents in and out (core's LATENT is normalised by the checkpoint's statistics).

Core draws a conditioned decoder's noise unseeded (the latent's, and each noise-injecting block's map);
with `noise_seed` in a job those draws return StreamVAE's seeded values instead (`vae.model.ltx2`: the same
values for the same latent frame and layer), so the whole conditioned decode is compared.

    python tests/comfy_support/core_ltx2.py jobs.json
    jobs: [{"checkpoint": path, "inputs": path, "outputs": path, "noise_seed": int or null}]
    inputs: a safetensors file of tensors named decode:<name> (raw latents) and encode:<name> (videos);
    outputs: the same names, core's results.
"""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "comfy_support" / "stubs")]  # torchvision/torchaudio stand-ins

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from bench.core_vae import _import_core  # noqa: E402
from vae.model.ltx2.blocks import seeded_normal  # noqa: E402


def _core_vae(checkpoint: str):
    """Core's VAE of a file, as its loaders build it (Load VAE; Load Checkpoint for a full checkpoint)."""
    import comfy.sd
    import comfy.utils

    sd, metadata = comfy.utils.load_torch_file(checkpoint, return_metadata=True)
    if any(k.startswith("vae.") for k in sd):
        sd = comfy.utils.state_dict_prefix_replace(sd, {"vae.": ""}, filter_keys=True)
    loaded = comfy.sd.VAE(sd=sd, metadata=metadata)
    return loaded.first_stage_model.to(torch.float32).eval()


def _seed_noise(core, seed: int):
    """Core's noise draws -> StreamVAE's seeded values: each noise-injecting residual block of the decoder
    (in the order they run, two maps each) and, returned, a stand-in for torch.randn_like of the latent."""
    from comfy.ldm.lightricks.vae.causal_video_autoencoder import UNetMidBlock3D

    index = 0
    for block in core.decoder.up_blocks:
        if not isinstance(block, UNetMidBlock3D):
            continue
        for res in block.res_blocks:
            if not res.inject_noise:
                continue
            maps = iter((index, index + 1))

            def feed(hidden, scale, maps=maps):
                noise = seeded_normal(hidden.shape[-2:], seed, 1, next(maps)).to(hidden)
                return hidden + (noise[None] * scale)[None, :, None]

            res._feed_spatial_noise = feed
            index += 2

    def latent_noise(x):
        b, c, t, h, w = x.shape
        return torch.stack([seeded_normal((b, c, h, w), seed, 0, i) for i in range(t)], dim=2).to(x)

    return latent_noise


def run(job: dict) -> None:
    core = _core_vae(job["checkpoint"])
    stats = core.per_channel_statistics
    results = {}
    for name, value in load_file(job["inputs"]).items():
        op = name.split(":")[0]
        with torch.no_grad():
            if op == "encode":
                results[name] = stats.un_normalize(core.encode(value)).contiguous()
                continue
            randn_like = torch.randn_like
            if job.get("noise_seed") is not None:
                torch.randn_like = _seed_noise(core, job["noise_seed"])
            try:
                results[name] = core.decode(stats.normalize(value)).contiguous()
            finally:
                torch.randn_like = randn_like
    save_file(results, job["outputs"])


if __name__ == "__main__":
    _import_core("0.33.0", "comfy.sd", cpu=True)
    for job in json.loads(Path(sys.argv[1]).read_text()):
        run(job)
