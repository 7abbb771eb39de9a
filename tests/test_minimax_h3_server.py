"""MiniMax-H3's one-node swap in real ComfyUI 0.33.0 and 0.3.75 servers (0.3.75 has no MiniMax-H3 of its own; its
VAE Encode and VAE Decode run the pack's): StreamVAE Load VAE's VAE output in core's VAE Encode
and VAE Decode gives the library's LATENT and frames, with the network's frame counts (18 frames encode to 7 latent
frames, where the 4n+1 rule drops 1 frame and makes 5; a LATENT of 6 latent frames decodes to 18 frames, not 21).
The file is the tiny model's seeded weights in core's key names (tests/minimax_h3_fixtures.py); the library itself
is compared with core's own MiniMaxH3VideoVAE in test_minimax_h3_core.py. Images are compared as floats (the
StreamVAETestImageLatent probe into Save Latent)."""
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import vae
from minimax_h3_fixtures import SMALL, model, save
from reference import assert_exact
from test_nodes_server import node, object_info, saved_latent, upload_frames, video_of  # noqa: F401

pytestmark = pytest.mark.comfy  # a real ComfyUI on each tree: CI's second lane

HEIGHT, WIDTH, FRAMES, LATENT_FRAMES = 32, 48, 18, 6
FILE = "streamvae_small_minimax_h3.safetensors"
LATENT = "streamvae_minimax_h3.latent"


@pytest.fixture(scope="module")
def run(comfy_server, object_info):
    """(the library's model of the file, the frames, the LATENT, the server's outputs) of one prompt."""
    ours = model(SMALL, seed=4)
    path = save(ours, comfy_server.base / "models" / "vae" / FILE)
    latent = torch.randn(1, 24, LATENT_FRAMES, HEIGHT // 16, WIDTH // 16, generator=torch.Generator().manual_seed(5))
    save_file({"latent_tensor": latent, "latent_format_version_0": torch.tensor([])},
              str(comfy_server.base / "input" / LATENT))
    frames = np.random.default_rng(51).integers(0, 256, (FRAMES, HEIGHT, WIDTH, 3), dtype=np.uint8)
    prompt = {
        "img": node(object_info, "LoadImage", image=upload_frames(comfy_server, frames, "streamvae_minimax_h3.png")),
        "lat": node(object_info, "LoadLatent", latent=LATENT),
        "vae": node(object_info, "StreamVAELoader", vae_name=FILE),
        "enc": node(object_info, "VAEEncode", pixels=["img", 0], vae=["vae", 1]),
        "save_enc": node(object_info, "SaveLatent", samples=["enc", 0], filename_prefix="minimax_h3_enc"),
        "dec": node(object_info, "VAEDecode", samples=["lat", 0], vae=["vae", 1]),
        "as_latent": node(object_info, "StreamVAETestImageLatent", image=["dec", 0]),
        "save_dec": node(object_info, "SaveLatent", samples=["as_latent", 0], filename_prefix="minimax_h3_dec"),
    }
    entry = comfy_server.run(prompt)
    return vae.load(path), frames, latent, entry


def test_core_nodes_on_load_vae_give_the_librarys(comfy_server, run):
    ours, frames, latent, entry = run
    encoded = saved_latent(comfy_server, entry, "save_enc")
    assert encoded.shape == (1, 24, 7, HEIGHT // 16, WIDTH // 16)
    assert_exact(encoded, ours.to_comfy_latent(vae.encode(ours, video_of(frames))), 1e-4)
    decoded = saved_latent(comfy_server, entry, "save_dec")  # IMAGE T,H,W,3 in 0..1
    expected = ((vae.decode(ours, ours.from_comfy_latent(latent)) + 1) / 2).clamp(0, 1)[0].permute(1, 2, 3, 0)
    assert decoded.shape == (FRAMES, HEIGHT, WIDTH, 3)
    assert_exact(decoded, expected, 1e-4)
