"""RGBA at the edges, without a server: what StreamVAE Encode hands an RGBA VAE (the IMAGE's alpha,
1 - MASK, or opaque like core's VAE Encode), the MASK Decode gives, and alpha in video files (kept
by FFV1, written opaque with a note by H.264; read back from the file, opaque where it has none)."""
import pytest
import torch

import vae
from bench.models import random_state_dict
from test_bad_inputs import node_module
from vae.video_codecs import resolve
from vae.video_reader import VideoReader

alpha = node_module("alpha")


@pytest.fixture(scope="module")
def rgba_model():
    config = vae.Wan21Config(dim=8, in_channels=4, out_channels=4)
    with torch.device("meta"):
        shapes = vae.Wan21VAE(config)
    return vae.load(random_state_dict(shapes, seed=2))


def test_rgba_vae_takes_the_image_alpha_or_one_minus_mask_or_opaque():
    g = torch.Generator().manual_seed(0)
    rgba = torch.rand(2, 6, 5, 4, generator=g)
    image, notes = alpha.encode_input(rgba, None, 4)
    assert torch.equal(image, rgba) and not notes
    mask = torch.rand(1, 6, 5, generator=g)  # one mask for both frames, Load Image's 1 - alpha
    image, notes = alpha.encode_input(rgba[..., :3], mask, 4)
    assert torch.equal(image[..., :3], rgba[..., :3]) and torch.allclose(image[..., 3], (1 - mask).expand(2, 6, 5))
    image, notes = alpha.encode_input(rgba[..., :3], None, 4)
    assert torch.equal(image[..., 3], torch.ones(2, 6, 5)) and "opaque" in notes[0]
    small = alpha.encode_input(rgba[..., :3], torch.zeros(1, 3, 3), 4)  # resized to the frames
    assert torch.equal(small[0][..., 3], torch.ones(2, 6, 5)) and "resized" in small[1][0]
    with pytest.raises(ValueError, match="MASK has 3 frames but the IMAGE 2"):
        alpha.encode_input(rgba[..., :3], torch.zeros(3, 6, 5), 4)


def test_rgb_vae_drops_alpha_and_ignores_the_mask():
    image, notes = alpha.encode_input(torch.rand(2, 6, 5, 4), torch.zeros(6, 5), 3)
    assert image.shape == (2, 6, 5, 3) and any("alpha dropped" in n for n in notes) and any("MASK ignored" in n for n in notes)


def test_decoded_mask_is_one_minus_alpha():
    image = torch.rand(3, 4, 5, 4)
    assert torch.equal(alpha.decoded_mask(image), 1 - image[..., 3])
    assert alpha.decoded_mask(image[..., :3]).shape == (1, 64, 64)


def test_ffv1_keeps_alpha_and_h264_writes_opaque_with_a_note(rgba_model, tmp_path):
    z = torch.randn(1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    decoded = vae.decode(rgba_model, z)  # 1,4,5,32,32
    expected = decoded[0].add(1).mul(255 / 2).round().clamp(0, 255).permute(1, 2, 3, 0)
    path = vae.decode_to_file(rgba_model, z, tmp_path / "rgba.mkv", codec="ffv1")
    with VideoReader(path, channels=4) as reader:
        back = (reader.read(0, reader.frames)[0].permute(1, 2, 3, 0) + 1) * 255 / 2
    assert torch.equal(back.round(), expected)  # lossless, alpha included
    assert resolve("ffv1").with_alpha(4)[0].alpha and resolve("prores", "yuv444").with_alpha(4)[0].alpha
    with pytest.warns(RuntimeWarning, match="H.264 yuv444 cannot store alpha"):
        path = vae.decode_to_file(rgba_model, z, tmp_path / "rgba.mp4", codec="h264", pixel_format="yuv444")
    with VideoReader(path, channels=4) as reader:  # no alpha plane in the file: read opaque
        assert torch.equal(reader.read(0, 2)[0, 3], torch.ones(2, 32, 32))
