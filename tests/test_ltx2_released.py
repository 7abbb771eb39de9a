"""The LTX-2 VAE at its released widths (1.2 B parameters; seeded random weights, bf16 values so the files
hold them exactly), one real full LTX-2 checkpoint file (core's names under `vae.`, the upstream config in
the metadata): StreamVAE's decode and encode (float32, CPU) against diffusers' `AutoencoderKLLTX2Video`
and core 0.33.0's VAE loaded from that file, within 1e-4 x max(1, |ref|); diffusers' names map onto the
file's. (Chunks, frames streamed and tiles run the same code at every width: test_ltx2.py.)

The heaviest LTX-2 test (about 40 s on two idle cores, 5 GiB of float32 weights at a time): one
module, one fixture."""
import math
import shutil

import pytest
import torch
from safetensors.torch import save_file

import vae
from bench.core_vae import TREES
from vae.model.ltx2 import LTX2Config, LTX2VAE
from ltx2_fixtures import close, metadata, run_core

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)


POOL = 16_777_259  # drawn values the weights are cut from (a length no layer's rows divide)


def _released_diffusers() -> torch.nn.Module:
    """diffusers' LTX-2 VAE (its defaults are the released widths) with seeded bf16 weights of unit-ish
    gain, cut at random offsets from one pool of uniform values (drawing 1.2 B values would take most
    of the test's time; the weights still differ from row to row and layer to layer)."""
    with torch.device("meta"):
        reference = diffusers.AutoencoderKLLTX2Video(decoder_causal=False)
    reference = reference.to_empty(device="cpu")
    g = torch.Generator().manual_seed(38)
    pool = torch.empty(POOL, dtype=torch.bfloat16).uniform_(-3 ** 0.5, 3 ** 0.5, generator=g)  # unit variance
    with torch.no_grad():
        for p in reference.parameters():
            flat, done, start = p.view(-1), 0, int(torch.randint(POOL, (1,), generator=g))
            while done < flat.numel():
                take = min(flat.numel() - done, POOL - start)
                flat[done:done + take] = pool[start:start + take]
                done, start = done + take, 0
            gain = p[0].numel() ** -0.5 if p.dim() > 1 else 0.1
            p.mul_(2.0 ** round(math.log2(gain)))  # a power of two: the values stay bf16
        reference.latents_mean.normal_(0, 0.1, generator=g)
        reference.latents_std.uniform_(1.0, 1.2, generator=g)
    return reference.eval()


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ltx2-released")
    g = torch.Generator().manual_seed(5)
    inputs = {"decode:clip": torch.randn(1, 128, 2, 2, 3, generator=g),
              "encode:clip": torch.rand(1, 3, 9, 64, 64, generator=g) * 2 - 1}
    reference = _released_diffusers()
    with torch.no_grad():
        expected = {"decode:clip": reference.decode(inputs["decode:clip"]).sample,
                    "encode:clip": reference.encode(inputs["encode:clip"]).latent_dist.mode()}
    native = LTX2VAE.native_state_dict({k: v.bfloat16() for k, v in reference.state_dict().items()})
    del reference
    path = folder / "ltx-2.safetensors"
    tensors = {f"vae.{k}": v.contiguous() for k, v in native.items()}
    tensors["model.diffusion_model.scale_shift_table"] = torch.zeros(2, 8)
    save_file(tensors, str(path), metadata=metadata(LTX2Config()))
    save_file(inputs, str(folder / "in.safetensors"))
    core = None
    if (TREES["0.33.0"].path / "comfy").is_dir():
        core, = run_core([{"checkpoint": str(path), "inputs": str(folder / "in.safetensors"),
                           "outputs": str(folder / "out.safetensors"), "noise_seed": None}], folder)
    ours = vae.load(path)
    got = {"decode:clip": vae.decode(ours, inputs["decode:clip"]), "encode:clip": vae.encode(ours, inputs["encode:clip"])}
    shutil.rmtree(folder)  # 2.3 GB: CI's disk is shared by the whole run
    return ours, native, inputs, expected, core, got


def test_the_released_config_is_read_and_diffusers_names_map_onto_the_file(released):
    ours, native, *_ = released
    assert ours.config == LTX2Config()
    saved = ours.state_dict()
    assert set(saved) == set(native) and all(torch.equal(saved[k], native[k].float()) for k in saved)


@pytest.mark.parametrize("op", ["decode", "encode"])
def test_released_widths_match_diffusers_and_core(released, op):
    *_, expected, core, got = released
    close(got[f"{op}:clip"], expected[f"{op}:clip"], 1e-4)
    if core is None:
        pytest.skip("no ComfyUI 0.33.0 (run .ci/setup): compared with diffusers only")
    close(got[f"{op}:clip"], core[f"{op}:clip"], 1e-4)
