"""ComfyUI 0.33.0's own LTX-2.5 diffusion-decoder VAE (`CausalDiffusionVAE`, with comfy-kitchen's `na3d`
and `rms_rope_`) on StreamVAE's test checkpoints, in a process of its own (a process holds one ComfyUI,
bench/core_vae.py): each file loaded by core's loader (`comfy.sd.VAE` with the file's metadata, the `vae.`
part of a full checkpoint as core's checkpoint loader takes it), every key of the file used, float32 on
the CPU, raw latents in and out.

    python tests/comfy_support/core_ltx25.py jobs.json
    jobs: [{"checkpoint": path, "inputs": path, "outputs": path}]
    inputs: a safetensors file of tensors named decode:<seed> (raw latents) and encode (videos);
    outputs: the same names, core's results: `decode:0` by core's own `decode` (its generator seeded 0),
    other seeds by its decoder with a generator of the latent's device seeded so, as `decode` draws.
"""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "comfy_support" / "stubs")]  # torchvision/torchaudio stand-ins

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from bench.core_vae import _import_core  # noqa: E402
from core_ltx2 import _core_vae as core_ltx2_vae  # noqa: E402  (this script's folder is on the path)

OTHER_MODELS = ("model.", "audio_vae.", "vocoder.")  # a full checkpoint's other parts


def _core_vae(checkpoint: str):
    """Core's VAE of a file, as its loaders build it (core_ltx2.py); every tensor of the file is one of its weights."""
    model = core_ltx2_vae(checkpoint)
    assert type(model).__name__ == "CausalDiffusionVAE", type(model).__name__
    with safe_open(checkpoint, framework="pt") as f:
        keys = {k.removeprefix("vae.") for k in f.keys() if k.startswith("vae.") or not k.startswith(OTHER_MODELS)}
    unused = {"per_channel_statistics.channel", "per_channel_statistics.mean-of-stds"}
    differ = sorted(set(model.state_dict()) ^ (keys - unused))
    assert not differ, f"core's model and the file differ in {differ[:8]}"
    return model


def run(job: dict) -> None:
    core = _core_vae(job["checkpoint"])
    stats = core.per_channel_statistics
    results = {}
    for name, value in load_file(job["inputs"]).items():
        op, _, seed = name.partition(":")
        with torch.no_grad():
            if op == "encode":
                results[name] = stats.un_normalize(core.encode(value)).contiguous()
            elif seed == "0":
                results[name] = core.decode(stats.normalize(value)).contiguous()
            else:
                generator = torch.Generator(device=value.device)
                generator.manual_seed(int(seed))
                results[name] = core.decoder(value, generator=generator).contiguous()
    save_file(results, job["outputs"])


if __name__ == "__main__":
    _import_core("0.33.0", "comfy.sd", cpu=True)
    import comfy_kitchen

    print(f"comfy-kitchen {getattr(comfy_kitchen, '__version__', '?')} from {comfy_kitchen.__file__}")
    for job in json.loads(Path(sys.argv[1]).read_text()):
        run(job)
