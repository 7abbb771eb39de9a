"""Spatial tiling: exact mode equals untiled for every family, encode and decode, at tile sizes that
do not divide the frame; fast mode reproduces the community SeedVR2 node and its error is measured;
a memory budget picks the settings; out of memory mid-decode shrinks the tile and keeps finished work;
progress and cancellation per tile."""
import logging

import pytest
import torch

import vae
from tests.reference import TINY_FAMILIES, assert_exact, load_tiny, magnitude, tensors
from vae.run import engine, memory, recovery
from vae.kernels import Optimizations
from vae.model.blocks import CausalConv3d

FAMILIES = list(TINY_FAMILIES)
# (file, video input, raw decoder input) of each family's upstream fixture
FIXTURES = {
    "seedvr2": ("tiny_inputs.safetensors", "video", "tiny_outputs.safetensors", "dec.input"),
    "wan21": ("reference_io.safetensors", "video_in", "reference_io.safetensors", "dec_in_z_raw"),
    "wan22": ("reference_io.safetensors", "video_in", "reference_io.safetensors", "dec_in_z_raw"),
}
EXACT_ATOL = 1e-5  # x max(1, max |ref|): what the README promises; measured up to 5.4e-6 on the fixtures (fp32)
# pixels on the fixtures' 64x64 frames: the smallest tile (2 latent cells of Wan2.2, 4 of the others),
# one that does not divide the frame, and an uneven (h, w) pair; overlaps are ignored by exact mode.
TILES = [(32, 0), (40, 8), ((56, 32), (8, 4))]


# Tile every conv, however small its frame: on the fixtures' 64x64 frames most convs would otherwise
# run whole-frame (`Optimizations.whole_frame_small_convs`), and exactness would be tested less.
TILE_ALL = Optimizations().with_(whole_frame_small_convs=False)


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return load_tiny(request.param)


def fixture_video(family):
    file, name, _, _ = FIXTURES[family]
    return tensors(family, file)[name]


def fixture_latent(family):
    _, _, file, name = FIXTURES[family]
    return tensors(family, file)[name]


@pytest.fixture(scope="module")
def untiled(model):
    video, z = fixture_video(model.family), fixture_latent(model.family)
    one = vae.Settings(temporal_chunk=1)
    return vae.encode(model, video, one), vae.decode(model, z, one)


@pytest.mark.parametrize("tile,overlap", TILES, ids=str)
def test_exact_tiled_encode_equals_untiled(model, untiled, tile, overlap):
    got = vae.encode(model, fixture_video(model.family),
                     vae.Settings(temporal_chunk=2, tile_size=tile, tile_overlap=overlap), opts=TILE_ALL)
    assert (got - untiled[0]).abs().max() <= EXACT_ATOL * magnitude(untiled[0])


@pytest.mark.parametrize("tile,overlap", TILES, ids=str)
def test_exact_tiled_decode_equals_untiled(model, untiled, tile, overlap):
    got = vae.decode(model, fixture_latent(model.family),
                     vae.Settings(temporal_chunk=2, tile_size=tile, tile_overlap=overlap), opts=TILE_ALL)
    assert (got - untiled[1]).abs().max() <= EXACT_ATOL * magnitude(untiled[1])


def test_33_frames_in_one_frame_chunks_equal_the_whole_clip(model):
    g = torch.Generator().manual_seed(3)
    z = torch.randn(1, model.latent_channels, 9, 4, 3, generator=g)
    whole = vae.decode(model, z, vae.Settings(temporal_chunk=9))
    assert whole.shape[2] == 33
    assert_exact(vae.decode(model, z, vae.Settings(temporal_chunk=1)), whole, atol=1e-5, rtol=0)
    tiled = vae.decode(model, z, vae.Settings(temporal_chunk=1, tile_size=2 * model.spatial_factor), opts=TILE_ALL)
    assert (tiled - whole).abs().max() <= EXACT_ATOL * magnitude(whole)


def test_fast_mode_reproduces_the_community_seedvr2_node():
    """numz's tiled_decode / tiled_encode with 32 px tiles and 16 px overlap (blended moments)."""
    m = load_tiny("seedvr2")
    ref = tensors("seedvr2", "tiny_outputs.safetensors")
    video = tensors("seedvr2", "tiny_inputs.safetensors")["video"]
    decoded = vae.decode(m, ref["dec.input"], vae.Settings(tile_size=32, tile_overlap=16, tiling="fast"))
    assert_exact(decoded, ref["tiled_dec.video"], atol=1e-4, rtol=1e-4)
    mean, logvar = vae.encode(m, video, vae.Settings(tile_size=32, tile_overlap=16, tiling="fast"), return_logvar=True)
    assert_exact(torch.cat([mean, logvar], 1), ref["tiled_enc.moments"], atol=1e-4, rtol=1e-4)


def test_fast_mode_error_is_measured_and_bounded(model, untiled):
    """Fast tiles are not exact (their norms and attention see one tile): the error is far above exact
    mode's, yet smaller than the signal itself."""
    z = fixture_latent(model.family)
    sf = model.spatial_factor
    tile = 4 * sf if sf == 8 else 48
    errors = [(vae.decode(model, z, vae.Settings(tile_size=tile, tile_overlap=ov, tiling="fast")) - untiled[1]).abs().mean().item()
              for ov in (sf, 2 * sf)]
    signal = untiled[1].abs().mean().item()
    assert all(1e-3 < e < signal for e in errors), (errors, signal)


def _between_tiled_and_untiled(m, shape) -> int:
    """A budget below the untiled one-frame-chunk peak that the smallest exact tile fits."""
    clip = vae.run.planning.clip_of(m, "decode", shape)
    untiled = memory.estimate(m, clip, 1, None)
    tiled = memory.estimate(m, clip, 1, 4 * m.spatial_factor)
    assert tiled < untiled
    return (tiled + untiled) // 2


def test_budget_picks_untiled_when_it_fits_and_tiles_when_not():
    m = load_tiny("seedvr2")
    shape = (1, 16, 3, 32, 48)
    roomy = vae.plan(m, "decode", shape, vae.Settings(memory_budget=2**40))
    assert roomy.tile_size is None and roomy.temporal_chunk == 3 and roomy.fits
    # caches kept on the device: a budget would offload them first (tests/test_causal_cache.py);
    # below the large tiles the planner streams frames untiled first (tests/test_frame_stream.py)
    budget = _between_tiled_and_untiled(m, shape)
    streamed = vae.plan(m, "decode", shape, vae.Settings(memory_budget=budget, cache_offload="none"))
    assert streamed.frames_streamed and streamed.tile_size is None and streamed.fits
    tight = vae.plan(m, "decode", shape,
                     vae.Settings(memory_budget=budget, cache_offload="none", stream_frames=False))
    assert tight.tile_size is not None and tight.fits and tight.peak_bytes <= tight.budget_bytes
    assert min(tight.tile_size) >= 4 * m.spatial_factor
    fast_tiles = vae.Settings(tiling="fast", tile_overlap=64, memory_budget=tight.budget_bytes, cache_offload="none")
    fast = vae.plan(m, "decode", shape, fast_tiles)
    assert fast.tile_size is None or min(fast.tile_size) > 2 * 64


def test_decode_under_a_budget_equals_untiled():
    m = load_tiny("seedvr2")
    z = torch.randn(1, 16, 3, 16, 12, generator=torch.Generator().manual_seed(4))
    whole = vae.decode(m, z)
    budget = _between_tiled_and_untiled(m, tuple(z.shape))
    settings = vae.Settings(memory_budget=budget, cache_offload="none", stream_frames=False)
    assert vae.plan(m, "decode", tuple(z.shape), settings).tile_size is not None
    assert (vae.decode(m, z, settings, opts=TILE_ALL) - whole).abs().max() <= EXACT_ATOL * magnitude(whole)


def test_low_resolution_convs_run_on_the_whole_frame(monkeypatch):
    """A 256x256 decode in 128 px tiles: once the full-resolution tiles have been seen, a conv whose
    whole frame is no larger than the largest tile buffer runs untiled (the latent-resolution
    ones); the full-resolution convs stay tiled; the result equals untiled."""
    m = load_tiny("seedvr2")
    z = torch.randn(1, 16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    whole = vae.decode(m, z, vae.Settings(temporal_chunk=1))
    chunks, widths = [], {}
    conv5d, run_chunk = CausalConv3d.conv5d, engine._run_chunk

    def counted(self, buf, ctx, padded=True):
        widths.setdefault((len(chunks), self), []).append(buf.shape[-1])
        return conv5d(self, buf, ctx, padded)

    monkeypatch.setattr(CausalConv3d, "conv5d", counted)
    monkeypatch.setattr(engine, "_run_chunk", lambda *args: chunks.append(1) or run_chunk(*args))
    got = vae.decode(m, z, vae.Settings(temporal_chunk=1, tile_size=128))
    assert (got - whole).abs().max() <= EXACT_ATOL * magnitude(whole)
    last = {conv: w for (chunk, conv), w in widths.items() if chunk == 3}
    assert last[m.decoder.conv_in] == [34]  # latent resolution: one whole-frame call (32 px + 1 px halo a side)
    assert last[m.decoder.conv_out] == [130] * 4  # full resolution: 4 tiles of 128 px + 1 px halo a side


def _last_causal_conv(model):
    return [m for m in model.decoder.modules() if isinstance(m, CausalConv3d)][-1]


def test_out_of_memory_retries_with_smaller_tiles_and_keeps_finished_chunks(model, monkeypatch, caplog):
    """The decoder's last conv runs out of memory on every untiled chunk after the first, after all
    other convs of the chunk updated their caches: the caches are rebuilt from the finished first
    chunk (run again, its output not rewritten) and the chunk is redone in tiles; the result still
    equals the untiled decode. (Caches pinned to the device: with cache_offload "auto" the first
    retry offloads them, tests/test_causal_cache.py.)"""
    z = fixture_latent(model.family)
    whole = vae.decode(model, z, vae.Settings(temporal_chunk=1))
    conv, forward = _last_causal_conv(model), _last_causal_conv(model).forward
    failures = []

    def flaky(x, ctx, *args, **kwargs):
        if ctx.execution is None and not ctx.first_chunk:
            failures.append(x.shape[2])
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return forward(x, ctx, *args, **kwargs)

    chunks = []
    run_chunk = engine._run_chunk
    monkeypatch.setattr(conv, "forward", flaky)
    monkeypatch.setattr(engine, "_run_chunk", lambda m, zc, *args: chunks.append(zc.shape[2]) or run_chunk(m, zc, *args))
    reports = []
    with caplog.at_level(logging.WARNING, logger="streamvae"):
        got = vae.decode(model, z, vae.Settings(temporal_chunk=1, cache_offload="none"), progress=lambda d,
                         t: reports.append((d, t)), opts=TILE_ALL)
    assert len(failures) == 1  # only chunk 1 failed; chunk 2 ran tiled straight away
    assert chunks == [1, 1, 1, 1, 1]  # chunk 0, chunk 1 failed, chunk 0 rebuilt its caches, chunk 1 redone, chunk 2
    assert (got - whole).abs().max() <= EXACT_ATOL * magnitude(whole)
    assert "retrying the chunk with exact tiles" in caplog.text
    assert reports[-1][0] == reports[-1][1] and all(d <= t for d, t in reports)


def test_out_of_memory_at_the_floor_says_what_was_tried(monkeypatch):
    m = load_tiny("seedvr2")
    conv = _last_causal_conv(m)

    def always(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")

    monkeypatch.setattr(conv, "forward", always)
    z = torch.randn(1, 16, 3, 8, 8)
    with pytest.raises(recovery.OutOfMemory) as caught:
        vae.decode(m, z, vae.Settings(temporal_chunk=2))
    text = str(caught.value)
    assert "untiled, 2 latent frame(s)" in text and "tiles 16x16 px, 1 latent frame(s)" in text
    assert isinstance(caught.value, torch.OutOfMemoryError)


def test_progress_counts_every_tile_and_cancel_stops_within_one(model):
    z = fixture_latent(model.family)
    reports = []
    vae.decode(model, z, vae.Settings(temporal_chunk=1, tile_size=32), progress=lambda d, t: reports.append((d, t)),
               opts=TILE_ALL)
    totals = {t for _, t in reports}
    assert len(totals) == 1 and reports[-1][0] == reports[-1][1]
    assert [d for d, _ in reports] == sorted(d for d, _ in reports) and len(reports) > 3 * 4
    seen = []
    with pytest.raises(vae.Cancelled):
        vae.decode(model, z, vae.Settings(temporal_chunk=1, tile_size=32), progress=lambda d, t: seen.append(d),
                   cancel=lambda: len(seen) >= 5, opts=TILE_ALL)
    assert len(seen) == 5


def test_fp16_overflow_falls_back_and_says_so_once(monkeypatch, caplog):
    """Inf from fp16 compute (forced here by scaling the last conv's weights past fp16's range; the weights stay finite) reruns
    the decode in float32 on the CPU, warns once, and the model stays in float32."""
    m = load_tiny("seedvr2")
    z = fixture_latent("seedvr2")
    m.set_dtypes(decode=torch.float16)
    with torch.no_grad():
        _last_causal_conv(m).weight.mul_(3e4)
    with caplog.at_level(logging.WARNING, logger="streamvae"), pytest.warns(RuntimeWarning, match="fp16 decode overflowed"):
        y = vae.decode(m, z)
    assert m.decode_dtype == torch.float32
    assert torch.isfinite(y).all()
    vae.decode(m, z)
    assert caplog.text.count("overflowed") == 1


def test_nonfinite_latent_names_its_frames_or_decodes_with_zeros():
    m = load_tiny("seedvr2")
    z = fixture_latent("seedvr2").clone()
    z[0, 3, 2, 1, 1] = float("nan")
    with pytest.raises(ValueError, match=r"latent frame\(s\) \[2\]"):
        vae.decode(m, z)
    with pytest.warns(RuntimeWarning, match=r"\[2\]"):
        y = vae.decode(m, z, nonfinite="zero")
    assert torch.isfinite(y).all() and y.shape[2] == 9
