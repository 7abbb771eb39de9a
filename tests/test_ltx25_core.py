"""The LTX-2.5 diffusion-decoder VAE against ComfyUI 0.33.0's own (`CausalDiffusionVAE`, comfy-kitchen's
`na3d` and `rms_rope_`), both loading the same real files: the VAE inside a full LTX-2.5 checkpoint
(`vae.` keys beside other models') and a split VAE file, each with upstream's config in its metadata;
seeded random weights at small widths. Ours through the public API (`vae.load`, `vae.decode`,
`vae.encode`), float32 on the CPU, within 1e-4 x max(1, |ref|): decode with core's seed (0, core's
`decode`) and another seed (`noise_seed` in the load config; core's decoder with a generator so seeded),
the released windows (11x11x11 in stage 5) and others (unequal, the strides split otherwise, v prediction
in two steps); encode (LTX-2's encoder, the 2.5 block list). The released widths: tests/test_ltx25_released.py.

Core runs in a process of its own (one ComfyUI per process); it needs the 0.33.0 tree of .ci/setup and
its venv's comfy-kitchen, so the module runs in CI's second lane (`comfy`)."""
import pytest
import torch
from safetensors.torch import save_file

import vae
from bench.core_vae import TREES
from comfy_support import environment
from ltx2_fixtures import close
from ltx25_fixtures import VARIANTS, model, run_core, save_full_checkpoint, save_split

pytestmark = pytest.mark.comfy

# variant -> (file writer, latent shape, decode seeds, encode too)
CASES = {"released_windows": (save_full_checkpoint, (1, 128, 3, 2, 2), (0, 7), True),
         "other_windows": (save_split, (1, 128, 3, 2, 3), (0,), False)}


@pytest.fixture(scope="module")
def core_results(tmp_path_factory):
    """variant -> (the file, inputs, core's outputs), all variants in one core process."""
    environment.require((TREES["0.33.0"].path / "comfy").is_dir(), f"ComfyUI 0.33.0 at {TREES['0.33.0'].path}")
    folder = tmp_path_factory.mktemp("ltx25-core")
    jobs, ours = [], {}
    for i, (name, (write, shape, seeds, encode)) in enumerate(CASES.items()):
        path = write(model(name, seed=20 + i), folder / f"{name}.safetensors")
        g = torch.Generator().manual_seed(5 + i)
        inputs = {f"decode:{seed}": torch.randn(shape, generator=g) for seed in seeds}
        if encode:
            inputs["encode"] = torch.rand(1, 3, 17, 64, 64, generator=g) * 2 - 1
        save_file(inputs, str(folder / f"{name}-in.safetensors"))
        jobs.append({"checkpoint": str(path), "inputs": str(folder / f"{name}-in.safetensors"),
                     "outputs": str(folder / f"{name}-out.safetensors")})
        ours[name] = (path, inputs)
    return {name: (*ours[name], outputs) for name, outputs in zip(CASES, run_core(jobs, folder))}


@pytest.mark.parametrize("variant, seed", [(v, s) for v, case in CASES.items() for s in case[2]])
def test_decode_matches_core(core_results, variant, seed):
    path, inputs, core = core_results[variant]
    ours = vae.load(path, config={"noise_seed": seed} if seed else None)
    z, expected = inputs[f"decode:{seed}"], core[f"decode:{seed}"]
    assert expected.shape == (1, 3, 17, 32 * z.shape[3], 32 * z.shape[4])
    close(vae.decode(ours, z), expected, 1e-4)


def test_seeds_give_other_frames(core_results):
    """Core's own frames differ by seed (so the seed comparison above compares something)."""
    _, _, core = core_results["released_windows"]
    assert (core["decode:0"] - core["decode:7"]).abs().max() > 0.1


def test_encode_matches_core(core_results):
    path, inputs, core = core_results["released_windows"]
    close(vae.encode(vae.load(path), inputs["encode"]), core["encode"], 1e-4)


def test_the_files_config_is_read_back(core_results):
    """Sizes from the weights, windows, strides and sampling from the metadata: the config written."""
    for name, (path, _, _) in core_results.items():
        assert vae.load(path).config == VARIANTS[name]
