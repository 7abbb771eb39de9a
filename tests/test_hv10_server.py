"""HunyuanVideo 1.0 / Kandinsky 5's one-node swap in a real ComfyUI 0.33.0 server (issue 52): StreamVAE Load VAE's
VAE output in core's VAE Encode and VAE Decode, HunyuanVideo 1.0's HunyuanImageToVideo and Kandinsky 5's
Kandinsky5ImageToVideo (each encodes a start image through it), and core's 16-channel latents (Empty HunyuanVideo
1.0 Latent, a saved LATENT) decoded through it, give the library's LATENTs and frames (`vae.encode`,
`vae.decode`) within 1e-4, in the shapes core makes: 9 frames of 48 x 32 <-> 3 latent frames of 6 x 4.

The file is a small seeded checkpoint in the released key names (tests/hv10_fixtures.py); the library itself is
compared with diffusers' model and core's own VAE in test_hv10.py. Images are compared as floats (the
StreamVAETestImageLatent probe into Save Latent), conditionings through the StreamVAETestConcatLatent probe."""
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import vae
from hv10_fixtures import save_small_checkpoint
from reference import assert_exact
from test_nodes_server import frames_of, node, object_info, saved_latent, upload_frames, video_of  # noqa: F401

pytestmark = [pytest.mark.comfy, pytest.mark.comfy_trees("0.33.0")]  # a real ComfyUI: CI's second lane

HEIGHT, WIDTH, FRAMES, START_FRAMES = 32, 48, 9, 5
SHAPE = (1, 16, 3, HEIGHT // 8, WIDTH // 8)  # the LATENT of 9 frames: 4n+1 -> n+1 latent frames, 8x
FILE = "streamvae_small_hv10.safetensors"
LATENT = "streamvae_hv10.latent"


@pytest.fixture(scope="module")
def run(comfy_server, object_info):
    """(the file's path, the frames, the saved LATENT, the server's outputs) of one prompt."""
    path = comfy_server.base / "models" / "vae" / FILE
    save_small_checkpoint(path)
    latent = torch.randn(*SHAPE, generator=torch.Generator().manual_seed(5))
    save_file({"latent_tensor": latent, "latent_format_version_0": torch.tensor([])},
              str(comfy_server.base / "input" / LATENT))
    frames = np.random.default_rng(52).integers(0, 256, (FRAMES, HEIGHT, WIDTH, 3), dtype=np.uint8)
    size = dict(width=WIDTH, height=HEIGHT, length=FRAMES, batch_size=1)
    prompt = {
        "img": node(object_info, "LoadImage", image=upload_frames(comfy_server, frames, "streamvae_hv10.png")),
        "start": node(object_info, "ImageFromBatch", image=["img", 0], batch_index=0, length=START_FRAMES),
        "lat": node(object_info, "LoadLatent", latent=LATENT),
        "empty": node(object_info, "EmptyHunyuanLatentVideo", **size),
        "cond": node(object_info, "StreamVAETestEmptyConditioning"),
        "vae": node(object_info, "StreamVAELoader", vae_name=FILE),
        "vae_core": node(object_info, "StreamVAELoader", vae_name=FILE, hunyuan_frames="core"),
        "enc": node(object_info, "VAEEncode", pixels=["img", 0], vae=["vae", 1]),
        "dec": node(object_info, "VAEDecode", samples=["lat", 0], vae=["vae", 1]),
        "dec_core": node(object_info, "VAEDecode", samples=["lat", 0], vae=["vae_core", 1]),
        "dec_empty": node(object_info, "VAEDecode", samples=["empty", 0], vae=["vae", 1]),
        "hv_i2v": node(object_info, "HunyuanImageToVideo", positive=["cond", 0], vae=["vae", 1],
                       guidance_type="v2 (replace)", start_image=["start", 0], **size),
        "k5_i2v": node(object_info, "Kandinsky5ImageToVideo", positive=["cond", 0], negative=["cond", 0],
                       vae=["vae", 1], start_image=["start", 0], **size),
        "k5_mask": node(object_info, "StreamVAETestConcatLatent", conditioning=["k5_i2v", 0], key="concat_mask"),
    }
    latents = {"enc": ["enc", 0], "empty": ["empty", 0], "hv_i2v": ["hv_i2v", 1], "k5_latent": ["k5_i2v", 2],
               "k5_cond": ["k5_i2v", 3], "k5_mask": ["k5_mask", 0]}
    for name in ("dec", "dec_core", "dec_empty"):
        prompt[f"as_latent_{name}"] = node(object_info, "StreamVAETestImageLatent", image=[name, 0])
        latents[name] = [f"as_latent_{name}", 0]
    for name, link in latents.items():
        prompt[f"save_{name}"] = node(object_info, "SaveLatent", samples=link, filename_prefix=f"hv10_{name}")
    entry = comfy_server.run(prompt)
    return path, frames, latent, entry


def test_core_encode_and_decode_give_the_librarys(comfy_server, run):
    """VAE Encode of 9 frames and VAE Decode of a saved LATENT (Load VAE's default `hunyuan_frames` "model", and
    "core": core's chunked frames) and of Empty HunyuanVideo 1.0 Latent's."""
    path, frames, latent, entry = run
    ours = vae.load(path)
    encoded = saved_latent(comfy_server, entry, "save_enc")
    assert encoded.shape == SHAPE
    assert_exact(encoded, ours.to_comfy_latent(vae.encode(ours, video_of(frames))), 1e-4)
    empty = saved_latent(comfy_server, entry, "save_empty")
    assert empty.shape == SHAPE and not empty.any()
    for name, model, z in (("dec", ours, latent), ("dec_core", vae.load(path, config={"frames": "core"}), latent),
                           ("dec_empty", ours, empty)):
        decoded = saved_latent(comfy_server, entry, f"save_{name}")
        assert decoded.shape == (FRAMES, HEIGHT, WIDTH, 3), name
        assert_exact(decoded, frames_of(vae.decode(model, model.from_comfy_latent(z))), 1e-4, msg=name)
    assert (saved_latent(comfy_server, entry, "save_dec") - saved_latent(comfy_server, entry, "save_dec_core")
            ).abs().max() > 1 / 255  # the load choice reached the model


def test_image_to_video_nodes_encode_the_start_image_as_the_library(comfy_server, run):
    """HunyuanImageToVideo ("v2 (replace)") and Kandinsky5ImageToVideo on a 5-frame start image: its 2 latent
    frames are the library's encode, in the first frames of the 3-frame LATENT the former hands on and in the
    latter's `cond_latent`; Kandinsky 5's mask marks them and its empty latent has core's shape."""
    path, frames, _, entry = run
    ours = vae.load(path)
    start = ours.to_comfy_latent(vae.encode(ours, video_of(frames[:START_FRAMES])))
    assert start.shape == (1, 16, 2, HEIGHT // 8, WIDTH // 8)
    replaced = saved_latent(comfy_server, entry, "save_hv_i2v")
    assert replaced.shape == SHAPE and not replaced[:, :, 2:].any()
    assert_exact(replaced[:, :, :2], start, 1e-4)
    assert_exact(saved_latent(comfy_server, entry, "save_k5_cond"), start, 1e-4)
    mask = saved_latent(comfy_server, entry, "save_k5_mask")
    assert mask.shape == (1, 1, 3, HEIGHT // 8, WIDTH // 8) and mask.flatten(3).amax(3).flatten().tolist() == [0, 0, 1]
    empty = saved_latent(comfy_server, entry, "save_k5_latent")
    assert empty.shape == SHAPE and not empty.any()
