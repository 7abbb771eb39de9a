"""StreamVAE beside core's own VAEs in a real ComfyUI 0.33.0 (which has native SeedVR2), through /prompt
graphs, with full-size models: the released configs with random weights (fan-in scaled, norm scales 1,
biases 0: core leaves fresh weights uninitialised, so the file holds every one), in the real key
layout, stored in fp16 like the released files, loaded by core's VAELoader and StreamVAE Load VAE.

Per family one graph encodes a 6-frame clip and its first 5 frames with core VAE Encode, StreamVAE
Encode and (the 6 frames) core VAE Encode through the StreamVAE-to-core adapter, and decodes each
side's LATENT with the other side's decoder:
- 5 frames (4n+1): the LATENTs are equal (1e-4 of the largest value), core VAE Decode of StreamVAE's
  LATENT equals StreamVAE Decode of core's, and the adapter's decode of core's LATENT equals both
  (8-bit images, one level);
- 6 frames (not 4n+1): core drops the frame past the last 4n+1 (its LATENT is the 5 frames'), and so
  does the adapter (equal LATENTs); StreamVAE pads to 9 and keeps the true count (its first two latent
  frames are core's); core VAE Decode of StreamVAE's LATENT gives all 9 frames, the first 5 equal to
  StreamVAE Decode of core's LATENT.
Full-size models on 2 CPU cores are slow, so frames are 32 x 32 and the graph computes nothing twice.

Under core's --fp16-intermediates (a server of its own) IMAGEs and LATENTs from StreamVAE's nodes and
from the adapter are float16 like core's, and still equal to core's; that server runs the tiny Wan2.1
fixture, which core's VAELoader builds at its own width. Under dynamic VRAM (comfy-aimdo), which no
server can start with on a machine without a GPU, the same nodes run in one 0.33.0 process with the
switches main.py sets (comfy_support/dynamic_vram_probe.py).
"""
import json
import os
import subprocess

import numpy as np
import pytest
import torch

from bench import models
import vae

from comfy_support.environment import STUBS
from comfy_support.server import build_base_directory, unlink_working_tree
from reference import assert_exact
from test_nodes_server import (FAMILIES, node, object_info, saved_images, saved_latent, upload_frames,  # noqa: F401
                               vae_file)

pytestmark = [pytest.mark.comfy, pytest.mark.comfy_trees("0.33.0")]  # a real ComfyUI: CI's second lane
SIZE = 32


def full_size_name(family):
    return f"zz_full_{family}.safetensors"


@pytest.fixture(scope="module")
def full_size_vaes(comfy_server):
    """The three full-size checkpoints in the server's models/vae (about 2.2 GB; removed afterwards)."""
    folder = comfy_server.base / "models" / "vae"
    for seed, family in enumerate(FAMILIES):
        weights = {k: v.half() for k, v in models.weights(family, seed=seed)[1].items()}
        vae.save_checkpoint(weights, folder / full_size_name(family))
        del weights
    yield
    for family in FAMILIES:
        (folder / full_size_name(family)).unlink()


@pytest.fixture(scope="module")
def uploaded_frames(comfy_server):
    """LoadImage names of a random 6-frame 32 x 32 clip (key 6) and of its first 5 frames (key 5)."""
    clip = np.random.default_rng(11).integers(0, 256, (6, SIZE, SIZE, 3), dtype=np.uint8)
    return {n: upload_frames(comfy_server, clip[:n], f"streamvae_interop_{n}.png") for n in (5, 6)}


def interop_prompt(info, name, uploaded):
    """Both sides' encoders and decoders on the checkpoint `name`, for the clips `uploaded` ({frame count:
    LoadImage name}, 5 and optionally 6). Node ids say what runs: `core_enc5` is core VAE Encode of the 5
    frames, `ours_dec5` StreamVAE Decode of core's LATENT of them, `core_dec6` core VAE Decode of
    StreamVAE's LATENT of the 6 frames, `adapter_enc` core VAE Encode with the adapter of the longest
    clip. Every LATENT goes to SaveLatent (`save_<id>`), every IMAGE to PreviewImage (`show_<id>`)."""
    core, ours, adapter = ["core_vae", 0], ["ours_vae", 0], ["adapter_vae", 0]
    prompt = {
        "core_vae": node(info, "VAELoader", vae_name=name),
        "ours_vae": node(info, "StreamVAELoader", vae_name=name),
        "adapter_vae": node(info, "StreamVAEToCoreVAE", vae=ours),
    }
    for n in uploaded:
        prompt[f"frames{n}"] = node(info, "LoadImage", image=uploaded[n])
        prompt[f"core_enc{n}"] = node(info, "VAEEncode", pixels=[f"frames{n}", 0], vae=core)
        prompt[f"ours_enc{n}"] = node(info, "StreamVAEEncode", image=[f"frames{n}", 0], vae=ours)
        prompt[f"core_dec{n}"] = node(info, "VAEDecode", samples=[f"ours_enc{n}", 0], vae=core)
    prompt["adapter_enc"] = node(info, "VAEEncode", pixels=[f"frames{max(uploaded)}", 0], vae=adapter)
    prompt["ours_dec5"] = node(info, "StreamVAEDecode", samples=["core_enc5", 0], vae=ours)
    prompt["adapter_dec5"] = node(info, "VAEDecode", samples=["core_enc5", 0], vae=adapter)
    for key in [k for k in prompt if "_enc" in k]:
        prompt[f"save_{key}"] = node(info, "SaveLatent", samples=[key, 0], filename_prefix=f"interop_{name}_{key}")
    for key in [k for k in prompt if "_dec" in k]:
        prompt[f"show_{key}"] = node(info, "PreviewImage", images=[key, 0])
    return prompt


def assert_latents_equal(got, expected, tolerance=1e-4):
    assert got.shape == expected.shape, (tuple(got.shape), tuple(expected.shape))
    error = float((got.float() - expected.float()).abs().max() / expected.float().abs().max())
    assert error <= tolerance, f"LATENTs differ by {error:.2e} of the largest value"


def assert_frames_equal(got, expected):
    """8-bit frames equal up to rounding (one level)."""
    assert got.shape == expected.shape, (got.shape, expected.shape)
    levels = int(np.abs(got.astype(int) - expected.astype(int)).max())
    assert levels <= 1, f"frames differ by {levels} levels"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_core_and_streamvae_take_each_others_latents(family, comfy_server, comfy_client, object_info,
                                                      full_size_vaes, uploaded_frames):
    entry = comfy_client.run(interop_prompt(object_info, full_size_name(family), uploaded_frames), timeout=600)
    latent = {key: saved_latent(comfy_server, entry, f"save_{key}")
              for key in ("core_enc5", "ours_enc5", "core_enc6", "ours_enc6", "adapter_enc")}
    frames = {key: saved_images(comfy_client, entry, f"show_{key}")
              for key in ("core_dec5", "ours_dec5", "adapter_dec5", "core_dec6")}

    # 4n+1 frames: one LATENT whoever encodes, one video whoever decodes
    assert latent["core_enc5"].shape[2] == 2
    assert_latents_equal(latent["ours_enc5"], latent["core_enc5"])
    assert frames["core_dec5"].shape == (5, SIZE, SIZE, 3)
    assert_frames_equal(frames["ours_dec5"], frames["core_dec5"])
    assert_frames_equal(frames["adapter_dec5"], frames["core_dec5"])

    # 6 frames: core and the adapter drop the 6th, StreamVAE pads to 9 and keeps the count
    assert_latents_equal(latent["core_enc6"], latent["core_enc5"])
    assert_latents_equal(latent["adapter_enc"], latent["core_enc6"])
    assert latent["ours_enc6"].shape[2] == 3
    assert_latents_equal(latent["ours_enc6"][:, :, :2], latent["core_enc6"])
    assert frames["core_dec6"].shape[0] == 9  # core VAE Decode ignores StreamVAE's count
    assert_frames_equal(frames["core_dec6"][:5], frames["ours_dec5"])


@pytest.mark.comfy_trees("0.33.0-fp16")
def test_fp16_intermediates_make_fp16_outputs_like_core(comfy_server, comfy_client, object_info, uploaded_frames):
    entry = comfy_client.run(interop_prompt(object_info, vae_file("wan21"), {5: uploaded_frames[5]}), timeout=300)
    latent = {key: saved_latent(comfy_server, entry, f"save_{key}") for key in ("core_enc5", "ours_enc5", "adapter_enc")}
    assert {str(z.dtype) for z in latent.values()} == {"torch.float16"}
    # fp16 keeps 11 significant bits: the sides may round the same value one step apart
    assert_latents_equal(latent["ours_enc5"], latent["core_enc5"], tolerance=2e-3)
    assert_latents_equal(latent["adapter_enc"], latent["core_enc5"], tolerance=2e-3)
    assert entry["outputs"]["ours_dec5"]["streamvae_run"][0]["output"] == "IMAGE float16 on cpu"
    assert entry["outputs"]["ours_enc5"]["streamvae_run"][0]["output"] == "LATENT float16 on cpu"
    frames = {key: saved_images(comfy_client, entry, f"show_{key}") for key in ("core_dec5", "ours_dec5", "adapter_dec5")}
    assert_frames_equal(frames["ours_dec5"], frames["core_dec5"])
    assert_frames_equal(frames["adapter_dec5"], frames["core_dec5"])


def test_dynamic_vram_leaves_streamvae_a_plain_patcher_with_core_results(comfy_tree, tmp_path):
    base = build_base_directory(tmp_path / "base")
    probe = os.path.join(os.path.dirname(__file__), "comfy_support", "dynamic_vram_probe.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(STUBS), str(comfy_tree.root))))
    try:
        run = subprocess.run([str(comfy_tree.python), probe, str(base), vae_file("wan21")], cwd=comfy_tree.root,
                             env=env, capture_output=True, text=True, timeout=300)
    finally:
        unlink_working_tree(base)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    # StreamVAE's weights are plain torch modules, which core's dynamic patcher cannot stream: like
    # core's own SeedVR2 VAE, they stay with a plain ModelPatcher that loads them whole.
    assert result["aimdo_enabled"] and result["ours_patcher"] == "ModelPatcher" and not result["ours_dynamic"]
    out = {key: torch.tensor(value) for key, value in result["tensors"].items()}
    assert_latents_equal(out["ours_enc"], out["core_enc"])
    assert_latents_equal(out["adapter_enc"], out["core_enc"])
    assert_exact(out["ours_dec"], out["core_dec"].reshape(out["ours_dec"].shape), rtol=0, atol=1e-4)
    assert_exact(out["adapter_dec"], out["core_dec"], rtol=0, atol=1e-4)
