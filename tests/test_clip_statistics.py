"""A clip in several chunks through a model whose norms span the whole clip (`ClipExtent.CHUNKS_AFTER_STATISTICS`,
`vae.run.clip_statistics`), on the tiny HunyuanVideo 1.0 network, as trained and as core computes it: chunks of 1
and 2 latent frames, exact tiles, frames streamed one at a time (caches on disk) and frames handed to a sink
equal the clip in one chunk within 1e-5 (fp32),
encode and decode; they take one pass per norm first, and where stage inputs are kept between passes, fewer
convolutions than where every pass starts again from the op's input, with the same frames; the statistics
gathered outlive an out-of-memory retry."""
import dataclasses

import pytest
import torch

import vae
from reference import assert_exact, random_weights
from vae.kernels import KernelLog
from vae.model.hv10 import Hv10Config, Hv10VAE
from vae.run import clip_statistics, planning, recovery
from vae.run.clip_statistics import clip_norm_count

OPTS = vae.Optimizations(kernel_choice="defaults")
TINY = dict(latent_channels=4, block_out_channels=(32, 32, 32, 64), layers_per_block=1)
LATENT = torch.randn(1, 4, 5, 4, 6, generator=torch.Generator().manual_seed(60)) * 2 + 0.5  # B,C,T',h,w
VIDEO = torch.rand(1, 3, 17, 32, 48, generator=torch.Generator().manual_seed(61)) * 2 - 1  # B,3,T,H,W
SETTINGS = [vae.Settings(temporal_chunk=1), vae.Settings(temporal_chunk=2), vae.Settings(temporal_chunk=2, tile_size=16),
            vae.Settings(temporal_chunk=1, tile_size=16, stream_frames=True, cache_offload="disk")]


@pytest.fixture(scope="module", params=["model", "core"])
def model(request):
    return random_weights(Hv10VAE(Hv10Config(**TINY, frames=request.param)), seed=62).eval()


def _passes(monkeypatch) -> list:
    """The gathering passes of the runs after this call, counted as they end."""
    ended = []
    end_pass = clip_statistics.GatheredStatistics.end_pass
    monkeypatch.setattr(clip_statistics.GatheredStatistics, "end_pass", lambda self: ended.append(1) or end_pass(self))
    return ended


def _convs(log: KernelLog) -> int:
    return sum(n for (op, _, _), n in log.calls.items() if op == "conv3d")


@pytest.mark.parametrize("settings", SETTINGS, ids=["chunk1", "chunk2", "chunk2-tiles16", "streamed-tiles16"])
def test_chunks_and_tiles_equal_the_clip_in_one_chunk(model, settings, monkeypatch):
    whole = vae.decode(model, LATENT, vae.Settings(temporal_chunk=LATENT.shape[2]), opts=OPTS)
    passes = _passes(monkeypatch)
    assert_exact(vae.decode(model, LATENT, settings, opts=OPTS), whole, 1e-5)
    assert len(passes) == clip_norm_count(model.decode_modules())
    encoded = vae.encode(model, VIDEO, vae.Settings(temporal_chunk=5), opts=OPTS)
    assert_exact(vae.encode(model, VIDEO, settings, opts=OPTS), encoded, 1e-5)


def test_frames_handed_to_a_sink_equal_the_clip(model):
    whole = vae.decode(model, LATENT, opts=OPTS, num_frames=15)
    frames = {}
    vae.decode(model, LATENT, vae.Settings(temporal_chunk=1, tile_size=16), opts=OPTS, num_frames=15,
               sink=lambda first, y: frames.update({first: y.clone()}))
    assert sorted(frames) == [0, 1, 5, 9, 13]  # one chunk at a time, written once each, cut at 15 frames
    assert_exact(torch.cat([frames[f] for f in sorted(frames)], dim=2), whole, 1e-5)


def test_kept_stage_inputs_save_work_not_frames(model):
    """The same run with its passes keeping stage inputs, and keeping none (every pass from the latent): equal
    frames; the kept inputs leave under half the convolutions, and under twice those of the clip's chunks run
    once each (one chunk: one call of each conv)."""
    plan = planning.plan(model, "decode", LATENT.shape, vae.Settings(temporal_chunk=1), opts=OPTS)
    assert plan.kept_stage_bytes > 0
    runs = {}
    for kept in (plan.kept_stage_bytes, 0):
        log = KernelLog()
        runs[kept] = vae.decode(model, LATENT, dataclasses.replace(plan, kept_stage_bytes=kept), opts=OPTS,
                                kernel_log=log), _convs(log)
    (kept_frames, kept_convs), (none_frames, none_convs) = runs.values()
    torch.testing.assert_close(kept_frames, none_frames, rtol=0, atol=0)
    log = KernelLog()
    vae.decode(model, LATENT, vae.Settings(temporal_chunk=LATENT.shape[2]), opts=OPTS, kernel_log=log)
    assert kept_convs < none_convs / 2 and kept_convs < 2 * LATENT.shape[2] * _convs(log)


@pytest.mark.parametrize("failing", [2, LATENT.shape[2] + 2], ids=["last-pass", "clip"])
def test_statistics_outlive_an_out_of_memory_retry(model, failing, monkeypatch):
    """An out-of-memory error in the second chunk of the last gathering pass, or of the clip after the passes:
    the retry (half the tile) gathers no norm twice and gives the clip's frames."""
    whole = vae.decode(model, LATENT, opts=OPTS)
    passes = _passes(monkeypatch)
    stage = model.decode_stages()[-1]  # holds the last norm: reached in the last pass and the clip
    calls = []

    def failing_once(x, ctx):
        calls.append(1)
        if len(calls) == failing:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return stage(x, ctx)

    monkeypatch.setattr(model, "decode_stages", lambda: [*type(model).decode_stages(model)[:-1], failing_once])
    monkeypatch.setattr(recovery, "free_cached_memory", lambda device: None)
    y = vae.decode(model, LATENT, vae.Settings(temporal_chunk=1, tile_size=32), opts=OPTS)
    assert_exact(y, whole, 1e-5)
    assert len(passes) == clip_norm_count(model.decode_modules())
