"""StreamVAE Decode to Video / Encode from Video (and Decode's output_dtype) in a real ComfyUI 0.3.75
server: the files they write and read are checked with PyAV against the library's own decode/encode.
"""
import math

import av
import numpy as np
import pytest
import torch
import vae

from comfy_support.client import PromptRejected
from reference import assert_exact
from test_nodes_server import (FRAMES, HEIGHT, WIDTH, as_uint8, assert_images_close, clip, models,  # noqa: F401
                               node, object_info, saved_images, saved_latent, uploaded_clip, vae_file, video_of)
from vae.run import geometry
from vae.video_codecs import resolve
from vae.video_file import to_pixels
from vae.video_reader import probe
from vae.video_writer import VideoWriter

pytestmark = pytest.mark.comfy  # runs a real ComfyUI: CI's second lane (.ci/run)

FAMILY = "wan21"


def written_file(server, entry, node_id):
    info = entry["outputs"][node_id]["streamvae_video"][0]
    return server.base / "output" / info["subfolder"] / info["filename"], info


def file_frames(path) -> np.ndarray:
    """Every frame as stored, decoded by PyAV itself (uint8 RGB)."""
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def execution_error(entry) -> dict:
    return next(data for kind, data in entry["status"]["messages"] if kind == "execution_error")


def test_decode_to_video_writes_every_frame(comfy_server, comfy_client, object_info, uploaded_clip, clip, models):
    """One prompt, three outputs of the same latent: a lossless FFV1 file at an NTSC rate (pixel-exact
    against the library's decode), a default H.264 file (metadata, colour tags, every frame decodes,
    Wan2.1's 16 fps by default) and the IMAGE path in fp16 (output_dtype)."""
    prompt = {
        "1": node(object_info, "LoadImage", image=uploaded_clip),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file(FAMILY)),
        "3": node(object_info, "StreamVAEEncode", vae=["2", 0], image=["1", 0]),
        "4": node(object_info, "StreamVAEDecodeToVideo", vae=["2", 0], samples=["3", 0], codec="ffv1",
                  filename_prefix="streamvae_test/lossless", fps=23.976, temporal_chunk=1),
        "5": node(object_info, "StreamVAEDecodeToVideo", vae=["2", 0], samples=["3", 0],
                  filename_prefix="streamvae_test/h264"),
        "6": node(object_info, "StreamVAEDecode", vae=["2", 0], samples=["3", 0], output_dtype="fp16"),
        "7": node(object_info, "PreviewImage", images=["6", 0]),
    }
    entry = comfy_client.run(prompt, timeout=180)

    model = models(FAMILY)
    z = vae.encode(model, video_of(clip))
    expected = vae.decode(model, z, vae.Settings(temporal_chunk=1), num_frames=FRAMES, height=HEIGHT, width=WIDTH)
    path, info = written_file(comfy_server, entry, "4")
    assert path.name == "lossless_00001_.mkv" and info["frames"] == FRAMES
    meta = probe(path)
    assert (meta.frames, meta.width, meta.height, meta.fps) == (FRAMES, WIDTH, HEIGHT, resolve(fps=23.976).fps)
    assert_lossless(file_frames(path), expected)
    assert len(entry["outputs"]["4"]["images"]) == FRAMES  # the preview: up to 8 frames

    path, info = written_file(comfy_server, entry, "5")
    meta = probe(path)
    assert path.suffix == ".mp4" and "BT.709 matrix, limited range" in info["format"]
    assert (meta.codec, meta.pix_fmt, meta.colorspace, meta.color_range) == ("h264", "yuv420p", 1, 1)
    assert (meta.frames, meta.width, meta.height, meta.fps) == (FRAMES, WIDTH, HEIGHT, 16)  # fps auto: Wan2.1's
    assert entry["outputs"]["5"]["streamvae_run"][0]["notes"][-1].endswith("16 fps; Wan2.1's rate (fps 0 = auto)")
    assert len(file_frames(path)) == FRAMES
    assert not list(path.parent.glob("*.partial.*"))

    assert_images_close(saved_images(comfy_client, entry, "7"), as_uint8(expected))  # fp16 IMAGE: within a level


# How far (in 8-bit levels) the server's decode may be from this process's: both encode and decode the
# clip, each with the kernels its process measured and its own thread count, which round differently
# (1e-5 in [-1, 1] is 1.3e-3 levels).
FLOAT_NOISE_LEVELS = 0.01


def assert_lossless(pixels: np.ndarray, expected: torch.Tensor) -> None:
    """8-bit frames from a lossless file equal the decoder output `expected` (1,3,T,H,W in [-1, 1])
    rounded to the nearest level, except where that output lies within float noise of a rounding
    boundary, where the neighbouring level is as right."""
    exact = to_pixels(expected, 8)
    assert pixels.shape == exact.shape, (pixels.shape, exact.shape)
    levels = (expected[0].float().add(1).mul(255 / 2)).permute(1, 2, 3, 0).clamp(0, 255).numpy()
    off = pixels != exact
    distance = np.abs(pixels.astype(np.float64) - levels)  # 0.5 at a boundary
    assert not off.any() or distance[off].max() <= 0.5 + FLOAT_NOISE_LEVELS, (
        f"{off.sum()} pixels differ, up to {distance[off].max():.3f} levels from the decoder output")


@pytest.mark.comfy_trees("0.3.75")
def test_encode_from_video_equals_encode_of_the_same_frames(comfy_server, comfy_client, object_info, clip):
    """The clip as a lossless video file in ComfyUI's input folder: Encode from Video gives the latent
    that core Load Video -> Get Video Components -> StreamVAE Encode gives for the same frames, and
    Decode to Video writes it back at the file's rate (fps auto), not the family's.
    (0.3.75 only: 0.33.0's Get Video Components converts through FFmpeg's float RGB path, which moves
    8-bit RGB values by up to 1.1 levels, so its frames are not the file's.)"""
    name = "streamvae_clip.mkv"
    with VideoWriter(comfy_server.base / "input" / name, resolve("ffv1", fps=15), WIDTH, HEIGHT, FRAMES,
                     overwrite=True) as writer:
        writer.write(clip)
        writer.finish()
    prompt = {
        "1": node(object_info, "LoadVideo", file=name),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file(FAMILY)),
        "3": node(object_info, "StreamVAEEncodeFromVideo", vae=["2", 0], video=["1", 0], temporal_chunk=1),
        "4": node(object_info, "SaveLatent", samples=["3", 0], filename_prefix="from_video"),
        "5": node(object_info, "GetVideoComponents", video=["1", 0]),
        "6": node(object_info, "StreamVAEEncode", vae=["2", 0], image=["5", 0]),
        "7": node(object_info, "SaveLatent", samples=["6", 0], filename_prefix="from_image"),
        "8": node(object_info, "StreamVAEDecodeToVideo", vae=["2", 0], samples=["3", 0],
                  filename_prefix="streamvae_test/source_rate"),
    }
    entry = comfy_client.run(prompt, timeout=180)
    from_file, from_image = saved_latent(comfy_server, entry, "4"), saved_latent(comfy_server, entry, "7")
    assert from_file.shape == (1, 16, geometry.latent_frames(FRAMES), math.ceil(HEIGHT / 8), math.ceil(WIDTH / 8))
    assert_exact(from_file, from_image, rtol=1e-5, atol=1e-5)
    assert entry["outputs"]["3"]["streamvae_run"][0]["notes"][-1].startswith(f"read {FRAMES} frames of {WIDTH}x{HEIGHT}")
    assert probe(written_file(comfy_server, entry, "8")[0]).fps == 15


def test_cancel_mid_run_leaves_only_a_partial_file(comfy_server, comfy_client, object_info):
    prefix = "streamvae_test/cancelled"
    prompt = {
        "1": node(object_info, "EmptyHunyuanLatentVideo", width=128, height=128, length=81, batch_size=1),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file(FAMILY)),
        "3": node(object_info, "StreamVAEDecodeToVideo", vae=["2", 0], samples=["1", 0], filename_prefix=prefix,
                  codec="ffv1", temporal_chunk=1),
    }
    prompt_id = comfy_client.queue(prompt)
    comfy_client.wait_for(prompt_id, lambda m: m["type"] == "progress" and m["data"]["node"] == "3"
                          and m["data"]["value"] >= 3, timeout=120)
    comfy_client.interrupt(prompt_id)
    comfy_client.wait(prompt_id, timeout=120)
    entry = comfy_client.history(prompt_id)
    interrupted = [data for kind, data in entry["status"]["messages"] if kind == "execution_interrupted"]
    assert len(interrupted) == 1 and interrupted[0]["node_type"] == "StreamVAEDecodeToVideo"
    folder = comfy_server.base / "output" / "streamvae_test"
    assert not list(folder.glob("cancelled_*_.mkv"))  # nothing that looks complete
    (partial,) = folder.glob("cancelled_*_.partial.mkv")
    kept = len(file_frames(partial))
    assert 9 <= kept < 81  # the frames decoded before the cancel, readable
    assert f"The first {kept} of the 81 frames stay readable in" in comfy_server.log and partial.name in comfy_server.log


def test_unwritable_output_folder_is_a_clear_error(comfy_server, comfy_client, object_info):
    (comfy_server.base / "output" / "blocked").write_text("a file where the output folder should be")
    prompt = {
        "1": node(object_info, "EmptyHunyuanLatentVideo", width=32, height=32, length=5, batch_size=1),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file(FAMILY)),
        "3": node(object_info, "StreamVAEDecodeToVideo", vae=["2", 0], samples=["1", 0],
                  filename_prefix="blocked/video"),
    }
    entry = comfy_client.run(prompt, timeout=60, check=False)
    error = execution_error(entry)
    assert error["node_type"] == "StreamVAEDecodeToVideo"
    assert "cannot write into the output folder" in error["exception_message"]
    assert "Choose another filename_prefix" in error["exception_message"]


def test_bad_video_settings_fail_before_anything_is_decoded(comfy_server, comfy_client, object_info):
    """A format the codec cannot store (a rule across three widgets: checked when the node starts, so that
    queue-time errors stay on the widget at fault), and a file name too long for the file system: refused
    before the first progress step, naming no file. tile_size is the one widget checked when queued: one
    error, not one per input."""
    name_too_long = "streamvae_test/" + "v" * 300
    for inputs, says in (({"codec": "prores", "bit_depth": "8"}, "ProRes cannot store yuv422 at 8 bit"),
                         ({"filename_prefix": name_too_long}, "is too long for this file system")):
        prompt = {
            "1": node(object_info, "EmptyHunyuanLatentVideo", width=32, height=32, length=5, batch_size=1),
            "2": node(object_info, "StreamVAELoader", vae_name=vae_file(FAMILY)),
            "3": node(object_info, "StreamVAEDecodeToVideo", vae=["2", 0], samples=["1", 0], **inputs),
        }
        prompt_id = comfy_client.queue(prompt)
        events = comfy_client.wait(prompt_id, timeout=60)
        error = execution_error(comfy_client.history(prompt_id))
        assert says in error["exception_message"] and "stay readable" not in error["exception_message"], error
        assert not [p for p in events.progress if p["node"] == "3"], "it decoded before finding out"
    assert not list((comfy_server.base / "output" / "streamvae_test").glob("v*"))
    prompt["3"]["inputs"].update(filename_prefix="streamvae_test/ok", tile_size=8)
    with pytest.raises(PromptRejected) as rejected:
        comfy_client.queue(prompt)
    errors = rejected.value.node_errors["3"]["errors"]
    assert len(errors) == 1 and errors[0]["extra_info"]["input_name"] == "tile_size", errors
