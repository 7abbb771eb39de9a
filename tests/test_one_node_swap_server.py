"""The one-node swap in a real ComfyUI server: StreamVAE Load VAE's `VAE` output in core's nodes (VAE
Encode, VAE Decode, VAE Decode (Tiled), WanImageToVideo; on 0.33.0 the native SeedVR2 chain) gives what
StreamVAE Encode/Decode and the library give, with the weights loaded once.
"""
import re

import pytest
import vae

from reference import assert_exact
from test_nodes_server import (FRAMES, HEIGHT, WIDTH, as_uint8, assert_images_close, clip, models,  # noqa: F401
                               node, object_info, saved_images, saved_latent, uploaded_clip, vae_file, video_of)


def requested_loads(log: str) -> list[str]:
    """The model classes core's memory manager loaded (its "Requested to load <class>" lines)."""
    return re.findall(r"Requested to load (\w+)", log)


def test_load_vae_output_runs_core_nodes(comfy_server, comfy_client, object_info, uploaded_clip, clip, models):
    """The one-node swap: Load VAE's VAE output in core's VAE Encode, VAE Decode and WanImageToVideo (its
    start image's latent read back by a test probe), and StreamVAE to core VAE in VAE Decode (Tiled):
    all equal the library's (StreamVAE Encode/Decode), and the weights are loaded once, as STREAMVAE's."""
    loader = node(object_info, "StreamVAELoader", vae_name=vae_file("wan21"), offload_device="cpu")  # a fresh handle
    prompt = {
        "1": node(object_info, "LoadImage", image=uploaded_clip),
        "2": loader,
        "4": node(object_info, "VAEEncode", pixels=["1", 0], vae=["2", 1]),
        "5": node(object_info, "SaveLatent", samples=["4", 0], filename_prefix="core_adapter"),
        "6": node(object_info, "VAEDecode", samples=["4", 0], vae=["2", 1]),
        "7": node(object_info, "PreviewImage", images=["6", 0]),
        "3": node(object_info, "StreamVAEToCoreVAE", vae=["2", 0]),
        "8": node(object_info, "VAEDecodeTiled", samples=["4", 0], vae=["3", 0], tile_size=64, overlap=32,
                  temporal_size=8, temporal_overlap=4),
        "9": node(object_info, "PreviewImage", images=["8", 0]),
        "10": node(object_info, "StreamVAETestEmptyConditioning"),
        "11": node(object_info, "WanImageToVideo", positive=["10", 0], negative=["10", 0], vae=["2", 1], width=WIDTH,
                   height=HEIGHT, length=5, start_image=["1", 0]),
        "12": node(object_info, "StreamVAETestConcatLatent", conditioning=["11", 0]),
        "13": node(object_info, "SaveLatent", samples=["12", 0], filename_prefix="core_adapter_i2v"),
        "14": node(object_info, "StreamVAEDecode", samples=["4", 0], vae=["2", 0]),
        "15": node(object_info, "PreviewImage", images=["14", 0]),
    }
    log_before = len(comfy_server.log)
    entry = comfy_client.run(prompt, timeout=180)
    model = models("wan21")
    # Core's semantics: the 7 frames encode as their first 5 (a core video VAE drops frames past the
    # last 4n+1) and 24 x 40 is cropped, centred, to 24 x 40 (both multiples of 8 already); decode
    # gives every latent frame. WanImageToVideo encodes its 5-frame start (the clip's first 5 frames).
    z = vae.encode(model, video_of(clip[:5]))
    assert_exact(saved_latent(comfy_server, entry, "5"), z, rtol=1e-4, atol=1e-4)
    assert_exact(saved_latent(comfy_server, entry, "13"), z, rtol=1e-4, atol=1e-4)
    expected = as_uint8(vae.decode(model, z))
    assert expected.shape[0] == 5
    for preview in ("7", "9", "15"):  # core VAE Decode, exact tiles (= untiled), StreamVAE Decode
        assert_images_close(saved_images(comfy_client, entry, preview), expected)
    assert requested_loads(comfy_server.log[log_before:]) == ["PatchedVAE"]  # one model, loaded once


@pytest.mark.comfy_trees("0.33.0")
def test_load_vae_output_runs_core_seedvr2_nodes(comfy_server, comfy_client, object_info, uploaded_clip, clip):
    """Core 0.33's native SeedVR2 chain (Pre-Process -> VAE Encode -> VAE Decode -> Post-Process) on Load
    VAE's VAE output gives what StreamVAE Encode/Decode give on the same 5-D IMAGE (1 clip of 9 frames,
    padded to 32 x 48): equal LATENTs, equal frames."""
    prompt = {
        "1": node(object_info, "LoadImage", image=uploaded_clip),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file("seedvr2")),
        "3": node(object_info, "SeedVR2Preprocess", resized_images=["1", 0]),
        "4": node(object_info, "VAEEncode", pixels=["3", 0], vae=["2", 1]),
        "5": node(object_info, "StreamVAEEncode", image=["3", 0], vae=["2", 0]),
        "6": node(object_info, "VAEDecode", samples=["4", 0], vae=["2", 1]),
        "7": node(object_info, "StreamVAEDecode", samples=["5", 0], vae=["2", 0]),
    }
    for key, images in (("core", "6"), ("ours", "7")):
        prompt[f"post_{key}"] = node(object_info, "SeedVR2PostProcessing", images=[images, 0],
                                     original_resized_images=["1", 0], color_correction_method="none")
        prompt[f"show_{key}"] = node(object_info, "PreviewImage", images=[f"post_{key}", 0])
    prompt["save_core"] = node(object_info, "SaveLatent", samples=["4", 0], filename_prefix="seedvr2_swap_core")
    prompt["save_ours"] = node(object_info, "SaveLatent", samples=["5", 0], filename_prefix="seedvr2_swap_ours")
    entry = comfy_client.run(prompt, timeout=180)
    core, ours = (saved_latent(comfy_server, entry, f"save_{key}") for key in ("core", "ours"))
    assert core.shape == (1, 16, 3, 4, 6)  # 9 frames of 32 x 48
    assert_exact(core, ours, rtol=1e-4, atol=1e-4)
    frames = saved_images(comfy_client, entry, "show_core")
    assert frames.shape == (FRAMES, HEIGHT, WIDTH, 3)  # cut back to the clip's frames and size
    assert_images_close(frames, saved_images(comfy_client, entry, "show_ours"))
