"""`python -m vae encode/decode`: its latent files are ComfyUI's (what Save Latent writes and Load Latent
reads), so a SeedVR2 file holds core's LATENT (raw x 0.9152), and decode reads core's files back to the
raw latent. The tiny SeedVR2 fixture (the CLI's default model) on a 5-frame lossless clip."""
import av
import numpy as np
import torch
from safetensors.torch import load_file

import vae
from reference import load_tiny
from vae.__main__ import main
from vae.video_codecs import resolve
from vae.video_file import to_pixels
from vae.video_reader import VideoReader
from vae.video_writer import VideoWriter


def test_latent_files_are_comfyuis_both_ways(tmp_path):
    clip, latent, out = tmp_path / "clip.mkv", tmp_path / "latent.safetensors", tmp_path / "decoded.mkv"
    frames = np.random.default_rng(2).integers(0, 256, (5, 32, 48, 3), dtype=np.uint8)
    with VideoWriter(clip, resolve("ffv1", pixel_format="rgb", fps=12), 48, 32, 5) as writer:
        writer.write(frames)
        writer.finish()
    main(["encode", "--in", str(clip), "--out", str(latent)])
    main(["decode", str(latent), "--out", str(out)])

    model = load_tiny("seedvr2")
    with VideoReader(clip) as reader:
        z = vae.encode(model, reader.read(0, reader.frames))
    torch.testing.assert_close(load_file(str(latent))["latent_tensor"], z * 0.9152, rtol=1e-5, atol=1e-5)
    with av.open(str(out)) as container:  # FFV1 rgb: the decoded frames rounded to 8 bits, nothing else
        written = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    expected = to_pixels(vae.decode(model, z, num_frames=5), 8)
    assert written.shape == expected.shape and np.abs(written.astype(int) - expected.astype(int)).max() <= 1
