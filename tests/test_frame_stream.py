"""Frame streaming (`strategies.FrameStream`): a chunk's stages one frame at a time, with the caches and
the waiting frames off the device, read and written by bands of rows under exact tiles. Every mode
equals the whole-clip, untiled encode and decode of the same model (fp32, all three families, at
chunk and tile boundaries); a cancel leaves no file open; the planner streams where a budget needs it."""
import os

import pytest
import torch

import vae
from tests.reference import TINY_FAMILIES, load_tiny, magnitude, tensors
from vae.kernels import Optimizations
from vae.run.strategies.frame_stream import FrameStream

EXACT_ATOL = 1e-5
FIXTURES = {  # (file, video input, file, raw decoder input): 9 frames of 64x64, 3 latent frames
    "seedvr2": ("tiny_inputs.safetensors", "video", "tiny_outputs.safetensors", "dec.input"),
    "wan21": ("reference_io.safetensors", "video_in", "reference_io.safetensors", "dec_in_z_raw"),
    "wan22": ("reference_io.safetensors", "video_in", "reference_io.safetensors", "dec_in_z_raw"),
}
# Tile every conv, however small its frame, so the band-wise caches are exercised at every layer.
TILE_ALL = Optimizations().with_(whole_frame_small_convs=False)
# (temporal chunk, tile in pixels, where the caches and the waiting frames go)
MODES = [(1, None, "none"), (2, None, "disk"), (1, 32, "disk"), (2, (48, 32), "disk")]


@pytest.fixture(scope="module", params=TINY_FAMILIES)
def model(request):
    return load_tiny(request.param)


@pytest.fixture(scope="module")
def whole(model):
    """The untiled, one-chunk encode and decode of the family's fixture (what every mode must equal)."""
    video_file, video_key, latent_file, latent_key = FIXTURES[model.family]
    video, z = tensors(model.family, video_file)[video_key], tensors(model.family, latent_file)[latent_key]
    everything = vae.Settings(temporal_chunk=z.shape[2])
    return video, z, vae.encode(model, video, everything), vae.decode(model, z, everything)


@pytest.mark.parametrize("chunk,tile,offload", MODES, ids=str)
def test_streamed_decode_equals_the_whole_clip(model, whole, chunk, tile, offload):
    _, z, _, expected = whole
    settings = vae.Settings(temporal_chunk=chunk, tile_size=tile, cache_offload=offload, stream_frames=True)
    plan = vae.plan(model, "decode", tuple(z.shape), settings)
    assert plan.frames_streamed and "frames streamed one at a time" in plan.describe()
    got = vae.decode(model, z, plan, opts=TILE_ALL)
    assert (got - expected).abs().max() <= EXACT_ATOL * magnitude(expected)


@pytest.mark.parametrize("chunk,tile,offload", MODES, ids=str)
def test_streamed_encode_equals_the_whole_clip(model, whole, chunk, tile, offload):
    video, _, expected, _ = whole
    settings = vae.Settings(temporal_chunk=chunk, tile_size=tile, cache_offload=offload, stream_frames=True)
    got = vae.encode(model, video, settings, opts=TILE_ALL)
    assert (got - expected).abs().max() <= EXACT_ATOL * magnitude(expected)


def test_stages_see_one_frame_at_a_time_and_frame_zero_first(model, whole):
    """What the schedule promises, seen from the stages: every call gets at most one frame, and
    `first_chunk` is True exactly on each stage's first call of the clip."""
    _, z, _, _ = whole
    calls = []
    stages = model.decode_stages()

    def watched(i, stage):
        def run(x, ctx):
            calls.append((i, x.shape[2], ctx.first_chunk))
            return stage(x, ctx)
        return run

    ctx = vae.run.run_context.RunContext(Optimizations())
    stream = FrameStream([watched(i, s) for i, s in enumerate(stages)])
    out = []
    with torch.inference_mode():
        for first in range(z.shape[2]):
            stream.run(z[:, :, first:first + 1], ctx, out.append)
    assert all(frames == 1 for _, frames, _ in calls)
    for i in range(len(stages)):
        firsts = [first for stage, _, first in calls if stage == i]
        assert firsts[0] and not any(firsts[1:]), (i, firsts)
    assert sum(y.shape[2] for y in out) == 4 * (z.shape[2] - 1) + 1


def test_a_cancelled_streamed_decode_leaves_no_file_open(model, whole):
    _, z, _, _ = whole
    fds = len(os.listdir("/proc/self/fd"))
    steps = []
    with pytest.raises(vae.Cancelled):
        vae.decode(model, z, vae.Settings(temporal_chunk=1, tile_size=32, cache_offload="disk", stream_frames=True),
                   progress=lambda done, total: steps.append(done), cancel=lambda: len(steps) > 3)
    assert len(os.listdir("/proc/self/fd")) == fds
