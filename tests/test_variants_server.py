"""The Wan-architecture variants through real ComfyUI servers: an RGBA VAE of another width
(Qwen-Image-Layered's kind), a 2x upscale decoder and Qwen-Image 2.1, tiny, seeded random weights in
the upstream / ComfyUI key layout, in the server's models/vae.

On both trees StreamVAE's nodes run each variant against the library: RGBA frames go in as Load
Image's IMAGE + MASK and come out as core's 4-channel IMAGE + MASK; the upscale decoder gives frames
twice the encoded size; Qwen-Image 2.1 gives core's image-VAE LATENT (N,C,h,w). On core 0.33.0, which
loads the RGBA and upscale Wan VAEs itself (sizes from the weights), LATENTs and decoded RGBA frames
equal core's in both directions.
"""
import io

import numpy as np
import pytest
import torch
from PIL import Image

import vae
from bench.models import random_state_dict

from test_nodes_server import node, object_info, saved_latent, video_of  # noqa: F401
from test_core_interop_server import assert_frames_equal, assert_latents_equal

pytestmark = pytest.mark.comfy  # runs a real ComfyUI: CI's second lane (.ci/run)

FRAMES, SIZE = 5, 32
VARIANTS = {  # file name -> the model it holds
    "zz_variant_rgba.safetensors": (vae.Wan21VAE, vae.Wan21Config(dim=12, in_channels=4, out_channels=4)),
    "zz_variant_upscale.safetensors": (vae.Wan21VAE, vae.Wan21Config(dim=8, out_channels=12)),
    "zz_variant_qwen21.safetensors": (vae.Qwen21VAE, vae.Qwen21Config(dim=8, dec_dim=12)),
}
RGBA, UPSCALE, QWEN21 = VARIANTS
FIXED_KERNELS = "defaults"  # timing every new layer shape of three new models would be most of the run


@pytest.fixture(scope="module")
def variant_files(comfy_server):
    """The variants in the server's models/vae (removed afterwards), and the same models in this process."""
    folder = comfy_server.base / "models" / "vae"
    models = {}
    for seed, (name, (cls, config)) in enumerate(VARIANTS.items()):
        with torch.device("meta"):
            shapes = cls(config)
        weights = random_state_dict(shapes, seed=seed)
        vae.save_checkpoint(weights, folder / name)
        models[name] = vae.load(weights)
    yield models
    for name in VARIANTS:
        (folder / name).unlink()


@pytest.fixture(scope="module")
def rgba_clip(comfy_server):
    """5 random RGBA frames (uint8) uploaded as an animated PNG: Load Image gives RGB + MASK (1 - alpha)."""
    frames = np.random.default_rng(8).integers(0, 256, (FRAMES, SIZE, SIZE, 4), dtype=np.uint8)
    data = io.BytesIO()
    images = [Image.fromarray(frame, "RGBA") for frame in frames]
    images[0].save(data, format="PNG", save_all=True, append_images=images[1:], duration=40, loop=0)
    client = comfy_server.client()
    try:
        return frames, client.upload_image(data.getvalue(), "streamvae_rgba.png")["name"]
    finally:
        client.close()


def saved_rgba(client, entry, node_id):
    refs = entry["outputs"][node_id]["images"]
    return np.stack([np.asarray(Image.open(io.BytesIO(client.view(r["filename"], r["subfolder"], r["type"]))).convert("RGBA"))
                     for r in refs])


def as_uint8(video):
    """Library output 1,C,T,H,W in [-1, 1] -> uint8 T,H,W,C as PreviewImage saves it."""
    image = ((video[0] + 1) / 2).clamp(0, 1).permute(1, 2, 3, 0)
    return np.clip(255.0 * image.numpy(), 0, 255).astype(np.uint8)


def ours_prompt(info, upload):
    """StreamVAE's nodes on every variant: RGBA VAEs get Load Image's IMAGE + MASK; each LATENT is saved
    and decoded; decoded frames go to PreviewImage, the RGBA decoder's MASK through Convert Mask to Image."""
    prompt = {"frames": node(info, "LoadImage", image=upload)}
    for key, name in (("rgba", RGBA), ("up", UPSCALE), ("qwen", QWEN21)):
        prompt[f"{key}_vae"] = node(info, "StreamVAELoader", vae_name=name, kernels=FIXED_KERNELS)
        colour_only = {} if key == "up" else {"mask": ["frames", 1]}
        prompt[f"{key}_enc"] = node(info, "StreamVAEEncode", image=["frames", 0], vae=[f"{key}_vae", 0], **colour_only)
        prompt[f"{key}_dec"] = node(info, "StreamVAEDecode", samples=[f"{key}_enc", 0], vae=[f"{key}_vae", 0])
        prompt[f"save_{key}"] = node(info, "SaveLatent", samples=[f"{key}_enc", 0], filename_prefix=f"variant_{key}")
        prompt[f"show_{key}"] = node(info, "PreviewImage", images=[f"{key}_dec", 0])
    prompt["rgba_mask"] = node(info, "MaskToImage", mask=["rgba_dec", 1])
    prompt["show_rgba_mask"] = node(info, "PreviewImage", images=["rgba_mask", 0])
    return prompt


def test_streamvae_nodes_run_every_variant(comfy_server, comfy_client, object_info, variant_files, rgba_clip):
    frames, upload = rgba_clip
    entry = comfy_client.run(ours_prompt(object_info, upload), timeout=300)
    assert entry["status"]["status_str"] == "success", entry["status"]
    rgba = video_of(frames[..., :3]), torch.from_numpy(frames[..., 3:]).float().permute(3, 0, 1, 2).unsqueeze(0) / 255
    video = torch.cat([rgba[0], rgba[1] * 2 - 1], dim=1)  # 1,4,T,H,W in [-1, 1]: RGB and the PNG's alpha

    model = variant_files[RGBA]
    z = vae.encode(model, video)
    assert_latents_equal(saved_latent(comfy_server, entry, "save_rgba"), z)
    decoded = as_uint8(vae.decode(model, z))
    assert_frames_equal(saved_rgba(comfy_client, entry, "show_rgba"), decoded)
    mask = np.asarray(saved_rgba(comfy_client, entry, "show_rgba_mask"))[..., 0]
    # MASK = 1 - alpha: truncated to 8 bits from the other side (one level) of a float one level off
    assert int(np.abs(mask.astype(int) - (255 - decoded[..., 3].astype(int))).max()) <= 2

    model = variant_files[UPSCALE]
    z = vae.encode(model, rgba[0])
    assert_latents_equal(saved_latent(comfy_server, entry, "save_up"), z)
    shown = saved_rgba(comfy_client, entry, "show_up")
    assert shown.shape == (FRAMES, 2 * SIZE, 2 * SIZE, 4)  # twice the encoded size
    assert_frames_equal(shown[..., :3], as_uint8(vae.decode(model, z)))

    model = variant_files[QWEN21]
    latent = saved_latent(comfy_server, entry, "save_qwen")
    assert latent.shape == (FRAMES, 64, SIZE // 16, SIZE // 16)  # core's image-VAE layout: one frame per entry
    z = vae.encode(model, video)
    assert_latents_equal(latent, z[0].transpose(0, 1))
    assert_frames_equal(saved_rgba(comfy_client, entry, "show_qwen"), as_uint8(vae.decode(model, z)))


def core_prompt(info, upload):
    """Core 0.33.0's VAE nodes and StreamVAE's on the RGBA and upscale variants, each decoding the other's LATENT."""
    prompt = {"frames": node(info, "LoadImage", image=upload),
              "rgba": node(info, "JoinImageWithAlpha", image=["frames", 0], alpha=["frames", 1])}
    for key, name, pixels in (("rgba", RGBA, "rgba"), ("up", UPSCALE, "frames")):
        prompt[f"core_{key}"] = node(info, "VAELoader", vae_name=name)
        prompt[f"ours_{key}"] = node(info, "StreamVAELoader", vae_name=name, kernels=FIXED_KERNELS)
        prompt[f"core_enc_{key}"] = node(info, "VAEEncode", pixels=[pixels, 0], vae=[f"core_{key}", 0])
        prompt[f"ours_enc_{key}"] = node(info, "StreamVAEEncode", image=[pixels, 0], vae=[f"ours_{key}", 0])
        prompt[f"ours_dec_{key}"] = node(info, "StreamVAEDecode", samples=[f"core_enc_{key}", 0], vae=[f"ours_{key}", 0])
        for side in ("core", "ours"):
            prompt[f"save_{side}_{key}"] = node(info, "SaveLatent", samples=[f"{side}_enc_{key}", 0],
                                                filename_prefix=f"variant_{side}_{key}")
    prompt["core_dec_rgba"] = node(info, "VAEDecode", samples=["ours_enc_rgba", 0], vae=["core_rgba", 0])
    for key in ("core_dec_rgba", "ours_dec_rgba"):
        prompt[f"show_{key}"] = node(info, "PreviewImage", images=[key, 0])
    return prompt


@pytest.mark.comfy_trees("0.33.0")
def test_latents_and_rgba_frames_equal_core(comfy_server, comfy_client, object_info, variant_files, rgba_clip):
    _, upload = rgba_clip
    entry = comfy_client.run(core_prompt(object_info, upload), timeout=300)
    for key in ("rgba", "up"):
        assert_latents_equal(saved_latent(comfy_server, entry, f"save_ours_{key}"),
                             saved_latent(comfy_server, entry, f"save_core_{key}"))
    core, ours = (saved_rgba(comfy_client, entry, f"show_{key}") for key in ("core_dec_rgba", "ours_dec_rgba"))
    assert core.shape == (FRAMES, SIZE, SIZE, 4)
    assert_frames_equal(ours, core)
