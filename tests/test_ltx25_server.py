"""The LTX-2.5 diffusion decoder's one-node swap in a real ComfyUI 0.33.0 server (issue 50): one small split
VAE file in models/vae, which core's own Load VAE recognises as its "LTX 2.4 diffusion VAE" (the key
`decoder.conv_in_x_t.weight`, the config in its metadata) and StreamVAE Load VAE as the family ltx25.

- Core's VAE Decode of a saved LATENT on core's VAE and on StreamVAE Load VAE's `VAE` give the same frames
  (both seed 0) and the library's (`vae.decode`), within 1e-4 x max(1, |ref|); LTXVImgToVideo, core's LTX
  node that encodes a start image through the VAE it is given, gives the same LATENT on both.
- Load VAE's advanced `decode_seed` reaches the model: seed 7's frames are the library's with `noise_seed` 7 and
  differ from seed 0's; the node says the seed, and says a seed set on another family's file does nothing.

The weights are the tiny "released_windows" variant (tests/ltx25_fixtures.py: seeded, small widths, the
released windows); 9 frames of 64 x 96 <-> 2 latent frames of 2 x 3. Images are compared as floats (the
StreamVAETestImageLatent probe into Save Latent). The library itself is compared with core's
`CausalDiffusionVAE` in test_ltx25_core.py.
"""
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import vae
from ltx25_fixtures import model, save_split
from reference import assert_exact
from test_nodes_server import frames_of, node, object_info, saved_latent, upload_frames, vae_file  # noqa: F401

pytestmark = [pytest.mark.comfy, pytest.mark.comfy_trees("0.33.0")]  # a real ComfyUI: CI's second lane

HEIGHT, WIDTH, FRAMES = 64, 96, 9
SHAPE = (1, 128, 2, HEIGHT // 32, WIDTH // 32)  # the LATENT of 9 frames: 8n+1 -> n+1 latent frames, 32x
FILE = "streamvae_small_ltx25.safetensors"
LATENT = "streamvae_ltx25.latent"
SEED = 7


@pytest.fixture(scope="module")
def run(comfy_server, object_info):
    """(the file's path, the start frames, the saved LATENT, the server's outputs) of one prompt."""
    path = save_split(model("released_windows", seed=50), comfy_server.base / "models" / "vae" / FILE)
    latent = torch.randn(*SHAPE, generator=torch.Generator().manual_seed(50))
    save_file({"latent_tensor": latent, "latent_format_version_0": torch.tensor([])},
              str(comfy_server.base / "input" / LATENT))
    frames = np.random.default_rng(50).integers(0, 256, (1, HEIGHT, WIDTH, 3), dtype=np.uint8)
    prompt = {
        "img": node(object_info, "LoadImage", image=upload_frames(comfy_server, frames, "streamvae_ltx25.png")),
        "cond": node(object_info, "StreamVAETestEmptyConditioning"),
        "lat": node(object_info, "LoadLatent", latent=LATENT),
        "core": node(object_info, "VAELoader", vae_name=FILE),
        "ours": node(object_info, "StreamVAELoader", vae_name=FILE),
        "seeded": node(object_info, "StreamVAELoader", vae_name=FILE, decode_seed=SEED),
        "other": node(object_info, "StreamVAELoader", vae_name=vae_file("wan21"), decode_seed=SEED),
        "dec_core": node(object_info, "VAEDecode", samples=["lat", 0], vae=["core", 0]),
        "dec_ours": node(object_info, "VAEDecode", samples=["lat", 0], vae=["ours", 1]),
        "dec_seeded": node(object_info, "VAEDecode", samples=["lat", 0], vae=["seeded", 1]),
        "other_enc": node(object_info, "StreamVAEEncode", image=["img", 0], vae=["other", 0]),
        "save_other": node(object_info, "SaveLatent", samples=["other_enc", 0], filename_prefix="ltx25_other"),
    }
    for name, link in (("core", ["core", 0]), ("ours", ["ours", 1])):
        prompt[f"i2v_{name}"] = node(object_info, "LTXVImgToVideo", positive=["cond", 0], negative=["cond", 0],
                                     vae=link, image=["img", 0], width=WIDTH, height=HEIGHT, length=FRAMES,
                                     batch_size=1, strength=1.0)
        prompt[f"save_i2v_{name}"] = node(object_info, "SaveLatent", samples=[f"i2v_{name}", 2],
                                          filename_prefix=f"ltx25_i2v_{name}")
    for name in ("dec_core", "dec_ours", "dec_seeded"):
        prompt[f"as_latent_{name}"] = node(object_info, "StreamVAETestImageLatent", image=[name, 0])
        prompt[f"save_{name}"] = node(object_info, "SaveLatent", samples=[f"as_latent_{name}", 0],
                                      filename_prefix=f"ltx25_{name}")
    entry = comfy_server.run(prompt)
    return path, frames, latent, entry


def test_core_nodes_on_the_drop_in_vae_give_cores_frames(comfy_server, run):
    """VAE Decode of one LATENT: on ours (seed 0) as on core's own VAE of the file, both the library's; and
    LTXVImgToVideo's LATENT (its start image encoded, in the first latent frame) the same on both."""
    path, _, latent, entry = run
    core = saved_latent(comfy_server, entry, "save_dec_core")
    assert core.shape == (FRAMES, HEIGHT, WIDTH, 3)
    assert_exact(saved_latent(comfy_server, entry, "save_dec_ours"), core, 1e-4)
    ours = vae.load(path)
    assert_exact(core, frames_of(vae.decode(ours, ours.from_comfy_latent(latent))), 1e-4)
    i2v_core = saved_latent(comfy_server, entry, "save_i2v_core")
    assert i2v_core.shape == SHAPE and i2v_core[:, :, :1].abs().max() > 0.1  # the start image's latent frame
    assert_exact(saved_latent(comfy_server, entry, "save_i2v_ours"), i2v_core, 1e-4)


def test_load_vaes_seed_reaches_the_model(comfy_server, run):
    """Seed 7 on Load VAE: VAE Decode gives the library's frames with `noise_seed` 7, not seed 0's."""
    path, _, latent, entry = run
    seeded = saved_latent(comfy_server, entry, "save_dec_seeded")
    ours = vae.load(path, config={"noise_seed": SEED})
    assert_exact(seeded, frames_of(vae.decode(ours, ours.from_comfy_latent(latent))), 1e-4)
    assert (seeded - saved_latent(comfy_server, entry, "save_dec_ours")).abs().max() > 0.05


def test_the_seed_is_shown_on_the_node(run):
    """Load VAE says the seed when it is not 0, and that it does nothing on a Wan VAE (whose encode runs)."""
    entry = run[3]
    notes = {key: entry["outputs"][key]["streamvae_model"][0]["notes"] for key in ("ours", "seeded", "other")}
    assert not any("seed" in note for note in notes["ours"]), notes
    assert f"noise_seed {SEED} (chosen at load; the default is 0)" in notes["seeded"], notes
    assert any(f"decode_seed {SEED}: no effect on wan21" in note for note in notes["other"]), notes
