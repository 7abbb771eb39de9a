"""HunyuanVideo 1.5 in a real ComfyUI server (issue 41): StreamVAE Load VAE's VAE output in core's
VAE Decode, VAE Decode (Tiled), VAE Encode and HunyuanVideo15ImageToVideo, against core's own VAE of the
same file, on both ComfyUI trees (0.3.75 has these nodes and this VAE too; there the adapter runs its own
decode and encode steps, on 0.33.0 core's chunked I/O drives it).

The file is a small seeded checkpoint in core's key names (tests/hv15_fixtures.py). Core builds this VAE
at the released widths whatever the file holds, so core's side is its Load VAE run with the file's widths
(the StreamVAETestCoreVAEAtFileWidths probe: core's `VAELoader` and modules, only `block_out_channels`
read from the file). Core's mid-block attention is unmasked: Load VAE's `clip_attention` "full" gives core's
output (within 1e-4 of its magnitude), the default "causal" (the trained, frame-causal model) visibly
differs. Images are compared as floats (the StreamVAETestImageLatent probe into Save Latent).
"""
import av
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from hv15_fixtures import save_small_checkpoint
from reference import assert_exact
from test_nodes_server import node, object_info, saved_latent, upload_frames, vae_file  # noqa: F401

pytestmark = pytest.mark.comfy  # runs a real ComfyUI: CI's second lane (.ci/run)

HEIGHT, WIDTH, FRAMES, START_FRAMES = 64, 96, 9, 5
FILE = "streamvae_small_hv15.safetensors"
LATENT = "streamvae_hv15.latent"
ONE_LEVEL = 1 / 255  # of the IMAGE range 0..1


@pytest.fixture(scope="module")
def entry(comfy_server, object_info):
    """One prompt for the whole module: every decode, encode and image-to-video of the tests below, on
    core's VAE ("core"), ours with core's attention ("full") and ours with the trained one ("ours")."""
    save_small_checkpoint(comfy_server.base / "models" / "vae" / FILE)
    latent = torch.randn(1, 32, 3, HEIGHT // 16, WIDTH // 16, generator=torch.Generator().manual_seed(5))
    save_file({"latent_tensor": latent, "latent_format_version_0": torch.tensor([])},
              str(comfy_server.base / "input" / LATENT))
    frames = np.random.default_rng(41).integers(0, 256, (FRAMES, HEIGHT, WIDTH, 3), dtype=np.uint8)
    prompt = {
        "img": node(object_info, "LoadImage", image=upload_frames(comfy_server, frames, "streamvae_hv15.png")),
        "start": node(object_info, "ImageFromBatch", image=["img", 0], batch_index=0, length=START_FRAMES),
        "lat": node(object_info, "LoadLatent", latent=LATENT),
        "cond": node(object_info, "StreamVAETestEmptyConditioning"),
        "core": node(object_info, "StreamVAETestCoreVAEAtFileWidths", vae_name=FILE),
        "full": node(object_info, "StreamVAELoader", vae_name=FILE, clip_attention="full"),
        "ours": node(object_info, "StreamVAELoader", vae_name=FILE),
        # decodes of one latent
        "dec_core": node(object_info, "VAEDecode", samples=["lat", 0], vae=["core", 0]),
        "dec_full": node(object_info, "VAEDecode", samples=["lat", 0], vae=["full", 1]),
        "tiled_full": node(object_info, "VAEDecodeTiled", samples=["lat", 0], vae=["full", 1], tile_size=64,
                           overlap=32, temporal_size=8, temporal_overlap=4),
        "stream_full": node(object_info, "StreamVAEDecode", samples=["lat", 0], vae=["full", 0]),
        "dec_ours": node(object_info, "VAEDecode", samples=["lat", 0], vae=["ours", 1]),
        # encodes, and each side's LATENT decoded by the other side
        "enc_core": node(object_info, "VAEEncode", pixels=["img", 0], vae=["core", 0]),
        "enc_full": node(object_info, "VAEEncode", pixels=["img", 0], vae=["full", 1]),
        "stream_enc_full": node(object_info, "StreamVAEEncode", image=["img", 0], vae=["full", 0]),
        # 6 frames of 90 x 56: no 4n+1 frames, no multiple of 16 (core drops the 6th frame, crops centred to 80 x 48)
        "odd_size": node(object_info, "ImageScale", image=["img", 0], upscale_method="bilinear", width=90, height=56,
                         crop="disabled"),
        "odd": node(object_info, "ImageFromBatch", image=["odd_size", 0], batch_index=0, length=6),
        "enc_odd_core": node(object_info, "VAEEncode", pixels=["odd", 0], vae=["core", 0]),
        "enc_odd_full": node(object_info, "VAEEncode", pixels=["odd", 0], vae=["full", 1]),
        "core_of_core": node(object_info, "VAEDecode", samples=["enc_core", 0], vae=["core", 0]),
        "full_of_core": node(object_info, "VAEDecode", samples=["enc_core", 0], vae=["full", 1]),
        "core_of_full": node(object_info, "VAEDecode", samples=["enc_full", 0], vae=["core", 0]),
        "video": node(object_info, "StreamVAEDecodeToVideo", vae=["ours", 0], samples=["lat", 0], fps=0.0,
                      filename_prefix="hv15/auto_fps"),
        # the attention choice on a family without it
        "wan_full": node(object_info, "StreamVAELoader", vae_name=vae_file("wan21"), clip_attention="full"),
        "wan_enc": node(object_info, "StreamVAEEncode", image=["img", 0], vae=["wan_full", 0]),
        "wan_save": node(object_info, "SaveLatent", samples=["wan_enc", 0], filename_prefix="hv15_wan"),
    }
    for key in ("core", "full"):  # image to video: its start image encoded by each VAE
        prompt[f"i2v_{key}"] = node(object_info, "HunyuanVideo15ImageToVideo", positive=["cond", 0],
                                    negative=["cond", 0], vae=[key, 1 if key == "full" else 0], width=WIDTH,
                                    height=HEIGHT, length=FRAMES, batch_size=1, start_image=["start", 0])
        for name in ("concat_latent_image", "concat_mask"):
            prompt[f"{name}_{key}"] = node(object_info, "StreamVAETestConcatLatent", conditioning=[f"i2v_{key}", 0],
                                           key=name)
        prompt[f"latent_{key}"] = node(object_info, "SaveLatent", samples=[f"i2v_{key}", 2],
                                       filename_prefix=f"hv15_i2v_latent_{key}")
    for name in ("dec_core", "dec_full", "tiled_full", "stream_full", "dec_ours", "core_of_core", "full_of_core",
                 "core_of_full"):
        prompt[f"as_latent_{name}"] = node(object_info, "StreamVAETestImageLatent", image=[name, 0])
    saved = [n for n in prompt if n.startswith(("as_latent_", "enc_", "stream_enc_", "concat_"))]
    for name in saved:
        prompt[f"save_{name}"] = node(object_info, "SaveLatent", samples=[name, 0], filename_prefix=f"hv15_{name}")
    return comfy_server.run(prompt, timeout=600)


def image(server, entry, name: str) -> torch.Tensor:
    """A decoded IMAGE (T,H,W,3, 0..1) as the server computed it, in float."""
    return saved_latent(server, entry, f"save_as_latent_{name}")


def test_core_decode_equals_ours_with_full_attention(comfy_server, entry):
    """(a) One LATENT through core's VAE Decode on core's VAE and on ours with `clip_attention` full: VAE
    Decode, VAE Decode (Tiled) (exact 64 px tiles, 2-latent-frame chunks) and StreamVAE Decode all give
    core's frames within 1e-4 of their magnitude."""
    core = image(comfy_server, entry, "dec_core")
    assert core.shape == (FRAMES, HEIGHT, WIDTH, 3)  # 3 latent frames -> 4n+1 = 9, 16x
    for name in ("dec_full", "tiled_full", "stream_full"):
        assert_exact(image(comfy_server, entry, name), core, 1e-4, msg=name)


def test_latents_cross_both_ways(comfy_server, entry):
    """(b) Core's VAE Encode and ours (through core's VAE Encode and StreamVAE Encode) give the same LATENT
    of 9 frames, and through VAE Encode of 6 frames of 90 x 56 (core's frame count and crop); core's LATENT
    decoded by ours and ours decoded by core give core's round trip."""
    core = saved_latent(comfy_server, entry, "save_enc_core")
    assert core.shape == (1, 32, 3, HEIGHT // 16, WIDTH // 16)
    for name in ("enc_full", "stream_enc_full"):
        assert_exact(saved_latent(comfy_server, entry, f"save_{name}"), core, 1e-4, msg=name)
    odd = saved_latent(comfy_server, entry, "save_enc_odd_core")
    assert odd.shape == (1, 32, 2, 3, 5)
    assert_exact(saved_latent(comfy_server, entry, "save_enc_odd_full"), odd, 1e-4)
    round_trip = image(comfy_server, entry, "core_of_core")
    for name in ("full_of_core", "core_of_full"):
        assert_exact(image(comfy_server, entry, name), round_trip, 1e-4, msg=name)


def test_image_to_video_conditioning_equals_cores(comfy_server, entry):
    """(c) HunyuanVideo15ImageToVideo with a 5-frame start image: the start image's latent and the mask it
    puts into the conditioning, and the empty latent it hands on, are core's with our VAE."""
    latents = {key: saved_latent(comfy_server, entry, f"save_concat_latent_image_{key}") for key in ("core", "full")}
    assert latents["core"].shape == (1, 32, 3, HEIGHT // 16, WIDTH // 16)
    assert latents["core"][:, :, :2].abs().amax() > 0 and latents["core"][:, :, 2:].abs().amax() == 0  # 5 frames: 2
    assert_exact(latents["full"], latents["core"], 1e-4)
    masks = [saved_latent(comfy_server, entry, f"save_concat_mask_{key}") for key in ("core", "full")]
    assert torch.equal(*masks) and masks[0][0, 0].flatten(1).amax(1).tolist() == [0, 0, 1]
    empty = [saved_latent(comfy_server, entry, f"latent_{key}") for key in ("core", "full")]
    assert empty[0].shape == empty[1].shape == (1, 32, 3, HEIGHT // 16, WIDTH // 16)


def test_the_trained_attention_differs_from_cores(comfy_server, entry):
    """(d) The default, masked attention (the model as trained) decodes the same LATENT more than one 8-bit
    level away from core's unmasked one (docs/families.md gives the measured value)."""
    difference = (image(comfy_server, entry, "dec_ours") - image(comfy_server, entry, "dec_core")).abs().max().item()
    print(f"masked vs core's unmasked decode: max difference {difference:.4f} of the IMAGE range "
          f"({difference * 255:.1f} levels of 255)")
    assert difference > ONE_LEVEL, difference


def test_the_attention_choice_is_shown_on_the_node(entry):
    """Load VAE says which attention a HunyuanVideo 1.5 VAE runs when it is not the default, and that the
    choice does nothing on a Wan VAE."""
    notes = {key: entry["outputs"][key]["streamvae_model"][0]["notes"] for key in ("full", "ours", "wan_full")}
    assert any(note.startswith("attention full") for note in notes["full"]), notes
    assert not any("attention" in note for note in notes["ours"]), notes
    assert any("clip_attention full: no effect on wan21" in note for note in notes["wan_full"]), notes


def test_decode_to_video_takes_24_fps(comfy_server, entry):
    """StreamVAE Decode to Video with fps 0 (auto) writes HunyuanVideo 1.5's 24 fps, every frame."""
    written = entry["outputs"]["video"]["streamvae_video"][0]
    assert (written["fps"], written["frames"]) == (24.0, FRAMES)
    with av.open(str(comfy_server.base / "output" / written["subfolder"] / written["filename"])) as container:
        assert container.streams.video[0].average_rate == 24
