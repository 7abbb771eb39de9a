"""LTX-2 and LTX-Video 0.9.x VAEs against ComfyUI 0.33.0's own (comfy/ldm/lightricks/vae), loaded by core
from the same real files: each variant's VAE inside a full LTX-2 checkpoint (`vae.` keys, the upstream
config in the metadata, other models' tensors beside it), seeded random weights at small widths.
Decode and encode within 1e-4 x max(1, |ref|): LTX-2's layout with reflect (2.0/2.3) and zero (2.5)
padding, 0.9.0's, and the timestep-conditioned 0.9.1 and 0.9.5 decoders with their noise (core draws
it unseeded; its draws are given StreamVAE's seeded values, tests/comfy_support/core_ltx2.py).

Core runs in a process of its own (one ComfyUI per process); it needs the 0.33.0 tree of .ci/setup."""
import pytest
import torch
from safetensors.torch import save_file

import vae
from bench.core_vae import TREES
from comfy_support import environment
from ltx2_fixtures import VARIANTS, close, model, run_core, save_full_checkpoint


def _inputs(m) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {"decode:clip": torch.randn(1, m.latent_channels, 3, 2, 3, generator=g),
            "encode:clip": torch.rand(1, 3, 17, 64, 96, generator=g) * 2 - 1}


@pytest.fixture(scope="module")
def core_results(tmp_path_factory):
    """variant -> (our model loaded from the file, inputs, core's outputs), all variants in one core process."""
    environment.require((TREES["0.33.0"].path / "comfy").is_dir(), f"ComfyUI 0.33.0 at {TREES['0.33.0'].path}")
    folder = tmp_path_factory.mktemp("ltx2-core")
    jobs, ours = [], {}
    for i, name in enumerate(VARIANTS):
        path = save_full_checkpoint(model(name, seed=10 + i), folder / f"{name}.safetensors")
        loaded = vae.load(path)
        inputs = _inputs(loaded)
        save_file(inputs, str(folder / f"{name}-in.safetensors"))
        jobs.append({"checkpoint": str(path), "inputs": str(folder / f"{name}-in.safetensors"),
                     "outputs": str(folder / f"{name}-out.safetensors"), "noise_seed": loaded.config.noise_seed})
        ours[name] = (loaded, inputs)
    return {name: (*ours[name], outputs) for name, outputs in zip(VARIANTS, run_core(jobs, folder))}


@pytest.mark.parametrize("op", ["decode", "encode"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matches_core(core_results, variant, op):
    ours, inputs, core = core_results[variant]
    run, shape = (vae.decode, (1, 3, 17, 64, 96)) if op == "decode" else (vae.encode, (1, 128, 3, 2, 3))
    expected = core[f"{op}:clip"]
    assert expected.shape == shape
    close(run(ours, inputs[f"{op}:clip"]), expected, 1e-4)


def test_the_files_say_what_the_weights_cannot(core_results):
    """Padding, timestep and noise come from the metadata config core reads too."""
    assert core_results["ltx2"][0].config.decoder_padding == "reflect"
    assert core_results["ltx25"][0].config.decoder_padding == "zeros"
    conditioned = core_results["v091"][0].config
    assert conditioned.timestep_conditioning and conditioned.decode_noise_scale == 0.025
    assert [b.inject_noise for b in conditioned.decoder_blocks if b.name == "res_x"] == [True, True, False, False]
