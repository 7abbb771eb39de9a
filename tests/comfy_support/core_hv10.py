"""ComfyUI 0.33.0's own HunyuanVideo 1.0 VAE (`AutoencoderKL` with `conv3d=True`, comfy/ldm/models/autoencoder.py,
as bench/core_vae.py builds it at the file's widths and gives it the weights in core's key names by core's own
conversion) on StreamVAE's test checkpoint, in a process of its own (a process holds one ComfyUI). The state dict
of core's modules is written back (core's key names, the second layout the tests load). Float32 on the CPU, raw
latents in and out: `encode` is core's `quant_conv` and posterior mode, `decode` its `post_quant_conv` and
decoder (carried chunks of 2 latent frames, unmasked attention).

    python tests/comfy_support/core_hv10.py job.json
    job: {"checkpoint": path, "core_layout": path, "inputs": path, "outputs": path}
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

import vae  # noqa: E402
from bench.core_vae import core_model  # noqa: E402


def run(job: dict) -> None:
    ours = vae.load(job["checkpoint"])
    core = core_model("0.33.0", ours.family, ours.config, ours.state_dict(), torch.float32)
    save_file({k: v.contiguous() for k, v in core.state_dict().items()}, job["core_layout"])
    results = {}
    with torch.no_grad():
        for name, value in load_file(job["inputs"]).items():
            results[name] = (core.encode(value) if name.startswith("encode:") else core.decode(value)).contiguous()
    save_file(results, job["outputs"])


if __name__ == "__main__":
    run(json.loads(Path(sys.argv[1]).read_text()))
