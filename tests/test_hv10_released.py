"""HunyuanVideo 1.0 / Kandinsky (`hv10`) at its released widths (diffusers' `AutoencoderKLHunyuanVideo` defaults:
widths 128-512, two residual blocks per stage, 16 latent channels; seeded random weights saved in the original key
names to a real safetensors file): StreamVAE's decode and encode (float32, CPU) against diffusers' model on the
whole clip (frame-wise decoding and tiling off), within 1e-4 x max(1, |ref|), and the decode in chunks of one
latent frame (a statistics pass per norm first: `vae/run/clip_statistics.py`) against the same frames. (The
reduced widths, core's key layout and core's frames: test_hv10.py.)

Heavy: the released network is 250 M parameters, about 1 GB of float32 weights per copy; both tests took 147 s
on two busy cores (Intel Xeon)."""
import pytest
import torch

import vae
from hv10_fixtures import norm_scales_near_one
from reference import assert_exact, random_weights
from vae.loading import save_checkpoint
from vae.model.hv10 import Hv10Config, Hv10VAE

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)

LATENT = torch.randn(1, 16, 3, 4, 6, generator=torch.Generator().manual_seed(52))  # B,C,T',h,w: 9 x 32 x 48 frames
VIDEO = torch.rand(1, 3, 9, 32, 48, generator=torch.Generator().manual_seed(53)) * 2 - 1  # B,3,T,H,W
OPTS = vae.Optimizations(kernel_choice="defaults")  # no timing of every layer's kernels


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """(the released-width file loaded by `vae.load`, diffusers' decode of LATENT and encode of VIDEO)."""
    with torch.device("meta"):  # initialised once, by random_weights
        reference = diffusers.AutoencoderKLHunyuanVideo()
    reference = norm_scales_near_one(random_weights(reference.to_empty(device="cpu"), seed=52))  # residuals count
    reference.use_framewise_encoding = reference.use_framewise_decoding = False  # the whole clip at once
    with torch.no_grad():
        expected = {"decode": reference.decode(LATENT).sample, "encode": reference.encode(VIDEO).latent_dist.mode()}
    path = tmp_path_factory.mktemp("hv10-released") / "hunyuan_video_vae.safetensors"
    save_checkpoint(reference.state_dict(), path)
    del reference
    return vae.load(path), expected


def test_the_released_widths_decode_and_encode_as_diffusers(released):
    model, expected = released
    assert type(model) is Hv10VAE and model.config == Hv10Config()
    assert_exact(vae.decode(model, LATENT, opts=OPTS), expected["decode"], atol=1e-4)
    assert_exact(vae.encode(model, VIDEO, opts=OPTS), expected["encode"], atol=1e-4)


def test_the_released_widths_in_chunks_after_the_statistics_passes(released):
    model, expected = released
    got = vae.decode(model, LATENT, vae.Settings(temporal_chunk=1, tile_size=16), opts=OPTS)
    assert_exact(got, expected["decode"], atol=1e-4)
