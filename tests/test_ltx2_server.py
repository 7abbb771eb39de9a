"""LTX-2 in a real ComfyUI 0.33.0 server (issue 38): StreamVAE Load VAE reads the VAE out of a full LTX-2
checkpoint in models/checkpoints (its diffusion weights never enter the server's RAM: peak RSS measured),
and its VAE output drives core's LTX nodes (LTXV Preprocess -> LTXVImgToVideo -> LTXVAddGuide ->
LTXVCropGuides -> VAE Decode / VAE Decode (Tiled); LTXVSeparateAVLatent's video latent) to the same LATENTs and frames as core's own VAE
(core's Load VAE on the split VAE file of the same weights). StreamVAE Encode takes any frame count
(7: padded to 8n+1) and StreamVAE Decode gives it back. LATENTs cross both ways: StreamVAE Encode's
into core's VAE Decode, core's into StreamVAE Decode to Video, which muxes an AUDIO into the file and
takes the frame rate from the workflow's LTXVConditioning.

The weights are the tiny "ltx2" test variant (tests/ltx2_fixtures.py: seeded, small widths, 128 latent
channels, reflect padding); frames 64 x 96, 9 frames of guide video, a 25-frame latent.
"""
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from ltx2_fixtures import metadata, model, save_full_checkpoint
from reference import assert_exact
import vae
from test_nodes_server import (as_uint8, assert_images_close, node, object_info, saved_images, saved_latent,  # noqa: F401
                               upload_frames, video_of)

pytestmark = [pytest.mark.comfy, pytest.mark.comfy_trees("0.33.0")]

HEIGHT, WIDTH, GUIDE_FRAMES, LENGTH = 64, 96, 9, 25
FULL = "streamvae_tiny_ltx2_full.safetensors"  # in models/checkpoints
SPLIT = "streamvae_tiny_ltx2_split.safetensors"  # in models/vae, for core's Load VAE
DIFFUSION_BYTES = 512 << 20  # the stand-in diffusion weights inside the full checkpoint
RATE, TONE_HZ = 30, 440.0


def _status(pid: int, field: str) -> int:
    """A /proc/<pid>/status memory field (VmRSS, VmHWM) in bytes."""
    line = next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024


@pytest.fixture(scope="module")
def files(comfy_server):
    """The same weights as a full checkpoint (models/checkpoints) and as a split VAE file (models/vae)."""
    m = model("ltx2")
    folder = comfy_server.base / "models" / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    save_full_checkpoint(m, folder / FULL, extra_bytes=DIFFUSION_BYTES)
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(comfy_server.base / "models" / "vae" / SPLIT),
              metadata=metadata(m.config))
    return m


@pytest.fixture(scope="module")
def guide(comfy_server):
    frames = np.random.default_rng(11).integers(0, 256, (GUIDE_FRAMES, HEIGHT, WIDTH, 3), dtype=np.uint8)
    return upload_frames(comfy_server, frames, "streamvae_ltx2_guide.png"), frames


def _branch(object_info, prompt: dict, key: str, vae_link: list, conditioning: list) -> None:
    """Core's LTX image-to-video chain on one VAE; nodes named `<key>_<step>`."""
    prompt[f"{key}_i2v"] = node(object_info, "LTXVImgToVideo", positive=conditioning, negative=conditioning,
                                vae=vae_link, image=["pre", 0], width=WIDTH, height=HEIGHT, length=LENGTH,
                                batch_size=1, strength=1.0)
    prompt[f"{key}_guide"] = node(object_info, "LTXVAddGuide", positive=[f"{key}_i2v", 0], negative=[f"{key}_i2v", 1],
                                  vae=vae_link, latent=[f"{key}_i2v", 2], image=["img", 0], frame_idx=8, strength=1.0)
    prompt[f"{key}_crop"] = node(object_info, "LTXVCropGuides", positive=[f"{key}_guide", 0],
                                 negative=[f"{key}_guide", 1], latent=[f"{key}_guide", 2])
    prompt[f"{key}_save"] = node(object_info, "SaveLatent", samples=[f"{key}_guide", 2], filename_prefix=f"ltx2_{key}")
    prompt[f"{key}_idx"] = node(object_info, "StreamVAETestConcatLatent", conditioning=[f"{key}_guide", 0],
                                key="keyframe_idxs")
    prompt[f"{key}_save_idx"] = node(object_info, "SaveLatent", samples=[f"{key}_idx", 0],
                                     filename_prefix=f"ltx2_{key}_idx")


def test_core_ltx_nodes_on_the_drop_in_vae(comfy_server, comfy_client, object_info, files, guide):
    """Core's LTX nodes give the same LATENT on both VAEs (core's latent of the guide and the start image,
    appended by LTXVAddGuide: within 1e-4 of its range; the guide's frame coordinates equal); the cropped latent decodes to the same frames
    through VAE Decode and VAE Decode (Tiled) (exact tiles: untiled) on ours, and out of an audio-video
    latent through LTXVSeparateAVLatent and StreamVAE Decode, as VAE Decode on core's (one 8-bit level); StreamVAE Encode's LATENT is core's VAE Encode's and core's VAE Decode takes it; core's
    LATENT in StreamVAE Decode to Video gives a file at the LTXVConditioning's 30 fps with the AUDIO in it;
    and the server's peak RSS while it loads the full checkpoint grows by less than half the checkpoint's
    diffusion weights (about 90 MiB of 512)."""
    spec = comfy_client.object_info("StreamVAELoader")["input"]["required"]["vae_name"]
    assert FULL in (spec[1]["options"] if spec[0] == "COMBO" else spec[0])  # listed from models/checkpoints
    prompt = {
        "img": node(object_info, "LoadImage", image=guide[0]),
        "pre": node(object_info, "LTXVPreprocess", image=["img", 0]),
        "cond": node(object_info, "StreamVAETestEmptyConditioning"),
        "rate": node(object_info, "LTXVConditioning", positive=["cond", 0], negative=["cond", 0], frame_rate=RATE),
        "ours": node(object_info, "StreamVAELoader", vae_name=FULL),
        "core": node(object_info, "VAELoader", vae_name=SPLIT),
        "tone": node(object_info, "StreamVAETestTone", hz=TONE_HZ, seconds=2.0, sample_rate=44100),
    }
    _branch(object_info, prompt, "o", ["ours", 1], ["rate", 0])
    _branch(object_info, prompt, "c", ["core", 0], ["rate", 0])
    prompt.update({
        # core's cropped latent, decoded by core's VAE, by ours (untiled, exact tiles of 64 px)
        "dec_core": node(object_info, "VAEDecode", samples=["c_crop", 2], vae=["core", 0]),
        "dec_ours": node(object_info, "VAEDecode", samples=["c_crop", 2], vae=["ours", 1]),
        "tiled_ours": node(object_info, "VAEDecodeTiled", samples=["c_crop", 2], vae=["ours", 1], tile_size=64,
                           overlap=32, temporal_size=16, temporal_overlap=8),
        # the video half of an audio-video latent (any LATENT stands in for the audio one)
        "av": node(object_info, "LTXVConcatAVLatent", video_latent=["c_crop", 2], audio_latent=["enc_core", 0]),
        "sep": node(object_info, "LTXVSeparateAVLatent", av_latent=["av", 0]),
        "dec_sep": node(object_info, "StreamVAEDecode", samples=["sep", 0], vae=["ours", 0]),
        # LATENTs both ways
        "enc_ours": node(object_info, "StreamVAEEncode", image=["img", 0], vae=["ours", 0]),
        "enc_core": node(object_info, "VAEEncode", pixels=["img", 0], vae=["core", 0]),
        "save_enc_ours": node(object_info, "SaveLatent", samples=["enc_ours", 0], filename_prefix="ltx2_enc_ours"),
        "save_enc_core": node(object_info, "SaveLatent", samples=["enc_core", 0], filename_prefix="ltx2_enc_core"),
        "dec_enc_ours": node(object_info, "VAEDecode", samples=["enc_ours", 0], vae=["core", 0]),
        "dec_enc_core": node(object_info, "VAEDecode", samples=["enc_core", 0], vae=["core", 0]),
        # 7 frames (no 8n+1): padded to 9 by StreamVAE Encode, given back as 7 by StreamVAE Decode
        "img7": node(object_info, "ImageFromBatch", image=["img", 0], batch_index=0, length=7),
        "enc7": node(object_info, "StreamVAEEncode", image=["img7", 0], vae=["ours", 0]),
        "dec7": node(object_info, "StreamVAEDecode", samples=["enc7", 0], vae=["ours", 0]),
        "video": node(object_info, "StreamVAEDecodeToVideo", vae=["ours", 0], samples=["c_crop", 2], fps=0.0,
                      audio=["tone", 0], filename_prefix="ltx2/av"),
    })
    for name in ("dec_core", "dec_ours", "tiled_ours", "dec_enc_ours", "dec_enc_core", "dec7", "dec_sep"):
        prompt[f"show_{name}"] = node(object_info, "PreviewImage", images=[name, 0])
    pid = comfy_server._process.pid
    rss_before = _status(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM from here
    entry = comfy_client.run(prompt, timeout=300)
    peak_growth = _status(pid, "VmHWM") - rss_before

    ours, core = (saved_latent(comfy_server, entry, f"{k}_save") for k in "oc")
    assert core.shape == (1, 128, 3 + 2, HEIGHT // 32, WIDTH // 32)  # 3 latent frames, the 9-frame guide's 2 appended
    assert_exact(ours, core, 1e-4)
    # where LTXVAddGuide put the guide's frames (pixel coordinates from the VAE's frame ratios)
    torch.testing.assert_close(*(saved_latent(comfy_server, entry, f"{k}_save_idx") for k in "oc"), rtol=0, atol=0)
    ours, core = (saved_latent(comfy_server, entry, f"save_enc_{k}") for k in ("ours", "core"))
    assert core.shape == (1, 128, 2, HEIGHT // 32, WIDTH // 32)
    assert_exact(ours, core, 1e-4)

    frames = saved_images(comfy_client, entry, "show_dec_core")
    assert frames.shape == (LENGTH, HEIGHT, WIDTH, 3)
    for name in ("dec_ours", "tiled_ours", "dec_sep"):
        assert_images_close(saved_images(comfy_client, entry, f"show_{name}"), frames)
    assert_images_close(saved_images(comfy_client, entry, "show_dec_enc_ours"),
                        saved_images(comfy_client, entry, "show_dec_enc_core"))

    seven = video_of(guide[1][:7])
    padded = torch.cat([seven, seven[:, :, -1:].expand(-1, -1, 2, -1, -1)], dim=2)  # the last frame repeated
    expected = as_uint8(vae.decode(files, vae.encode(files, padded)))[:7]
    assert_images_close(saved_images(comfy_client, entry, "show_dec7"), expected)

    written = entry["outputs"]["video"]["streamvae_video"][0]
    path = comfy_server.base / "output" / written["subfolder"] / written["filename"]
    with av.open(str(path)) as container:
        (video,), (audio,) = container.streams.video, container.streams.audio
        assert video.average_rate == RATE and video.frames in (0, LENGTH), (video.average_rate, video.frames)
        rate = audio.codec_context.sample_rate
        sound = np.concatenate([f.to_ndarray()[0] for f in container.decode(audio=0)])
    assert abs(len(sound) / rate - LENGTH / RATE) < 0.05  # cut to the video's length
    spectrum = np.abs(np.fft.rfft(sound))
    assert abs(np.argmax(spectrum) * rate / len(sound) - TONE_HZ) < 5  # the tone, through AAC

    # The full checkpoint's 512 MiB of diffusion weights were never read: the whole prompt (both VAEs'
    # weights, tiny; their activations at 64 x 96; 90 MiB here) grew the server's peak resident memory by
    # less than half of what reading them would add.
    assert peak_growth < DIFFUSION_BYTES / 2, f"peak RSS grew by {peak_growth / 2**20:.0f} MiB"
