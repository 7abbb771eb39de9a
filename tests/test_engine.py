"""The streaming engine: padding and trimming lose no frame; memory does not grow with clip length.
Runs for every family with upstream fixtures (that temporal chunks equal the whole clip, for every
registered family: test_families.py)."""
import subprocess
import sys
import textwrap

import pytest
import torch

import vae
from tests.reference import REPO, TINY_FAMILIES, assert_exact, load_tiny

FAMILIES = list(TINY_FAMILIES)


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return load_tiny(request.param)


def random_video(model, frames, height=None, width=None, batch=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    sf = model.spatial_factor
    h = height or 3 * sf
    w = width or 2 * sf
    return torch.rand(batch, 3, frames, h, w, generator=g) * 2 - 1


def random_latent(model, frames, h=3, w=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, model.latent_channels, frames, h, w, generator=g)


@pytest.mark.parametrize("frames", [1, 2, 5, 6, 8])
def test_frame_count_padding_loses_nothing(model, frames):
    """T is padded to the next 4n+1 by repeating the last frame; decode(num_frames=T) trims back."""
    video = random_video(model, frames)
    z = vae.encode(model, video)
    padded = (frames - 1 + 3) // 4 * 4 + 1
    assert z.shape[2] == (padded - 1) // 4 + 1
    repeated = torch.cat([video, video[:, :, -1:].expand(-1, -1, padded - frames, -1, -1)], dim=2)
    assert_exact(z, vae.encode(model, repeated), atol=1e-6, rtol=0)
    out = vae.decode(model, z, num_frames=frames)
    assert out.shape == video.shape
    torch.testing.assert_close(out, vae.decode(model, z)[:, :, :frames], atol=0, rtol=0)


def test_spatial_padding_and_crop(model):
    sf = model.spatial_factor
    video = random_video(model, 5, height=2 * sf + 3, width=sf + 5, batch=2)
    z = vae.encode(model, video)
    assert z.shape[-2:] == (3, 2)
    padded = torch.nn.functional.pad(video, (0, sf - 5, 0, sf - 3, 0, 0), mode="replicate")
    assert_exact(z, vae.encode(model, padded), atol=1e-6, rtol=0)
    out = vae.decode(model, z, num_frames=5, height=2 * sf + 3, width=sf + 5)
    assert out.shape == video.shape


def test_batch_items_are_independent(model):
    video = random_video(model, 5, batch=2)
    z = vae.encode(model, video)
    assert_exact(z[1:], vae.encode(model, video[1:]), atol=1e-5, rtol=0)
    assert_exact(vae.decode(model, z)[1:], vae.decode(model, z[1:]), atol=1e-5, rtol=0)


def test_decode_into_a_preallocated_output(model):
    z = random_latent(model, 3)
    expected = vae.decode(model, z)
    out = torch.full(expected.shape, float("nan"))
    result = vae.decode(model, z, vae.Settings(temporal_chunk=1), out=out)
    assert result.data_ptr() == out.data_ptr()
    assert_exact(out, expected, atol=1e-5, rtol=0)


def test_latent_channel_mismatch_is_explained(model):
    z = torch.zeros(1, model.latent_channels + 1, 2, 3, 3)
    with pytest.raises(ValueError, match="latent"):
        vae.decode(model, z)


def test_bad_temporal_chunk_is_rejected(model):
    with pytest.raises(ValueError, match="temporal_chunk"):
        vae.decode(model, random_latent(model, 2), vae.Settings(temporal_chunk=0))


PEAK_SCRIPT = textwrap.dedent("""
    import resource, torch
    import vae  # found in the working directory, the repository root
    from tests.reference import load_tiny
    m = load_tiny({family!r})
    z = torch.randn(1, m.latent_channels, {latent}, {size}, {size})
    out = torch.empty(1, 3, 4 * ({latent} - 1) + 1, {size} * m.spatial_factor, {size} * m.spatial_factor)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # fixed kernels: measuring a new layer shape allocates its candidates' outputs in one run, not the other
    vae.decode(m, z, vae.Settings(temporal_chunk={chunk}), out=out, opts=vae.Optimizations(kernel_choice="defaults"))
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024 - out.numel() * 4)
""")


def _decode_peak_beyond_output(family, latent, size, chunk=1):
    script = PEAK_SCRIPT.format(family=family, latent=latent, size=size, chunk=chunk)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO)
    return int(result.stdout.strip().splitlines()[-1])


@pytest.mark.measurement  # three fresh-process decodes per family, peak RSS: CI's second lane
@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_memory_does_not_grow_with_clip_length(model):
    """Peak memory beyond the (preallocated) output, one latent frame per chunk, grows from 3 to 17
    latent frames by less than a quarter of what decoding the 17 in one chunk adds. (A process's peak
    RSS moves by tens of MB with what else the machine runs, so the growth is compared with the one
    a whole-clip decode shows, not with the short clip's peak alone.)"""
    size = 64 // model.spatial_factor * 2
    short = _decode_peak_beyond_output(model.family, 3, size)
    long = _decode_peak_beyond_output(model.family, 17, size)
    whole = _decode_peak_beyond_output(model.family, 17, size, chunk=17)
    assert long - short < 0.25 * (whole - short), (short, long, whole)
