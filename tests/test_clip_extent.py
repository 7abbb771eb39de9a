"""How much of the clip an op must see at once (`VideoVAE.clip_extent`), as the planner, the out-of-memory retries
and row bands read it, on the released Wan2.1 network (meta device: plans only) declaring each extent: chunks (its
own), chunks after whole-clip statistics (norms over the clip: every tile of the whole clip before shorter chunks),
chunks of whole frames (never tiles), the whole clip untiled. (A model that runs its own tiles, `ClipExtent.OWN_TILES`, must say what its tiles are:
its plans are tested on the one that does, tests/test_minimax_h3_plans.py.)"""
import logging

import pytest

import vae
from bench import models
from vae.model.video_vae import ClipExtent
from vae.run import planning
from vae.run.recovery import OutOfMemory, smaller_plan

LATENT = (1, 16, 5, 32, 32)  # B,C,T',h,w: 17 frames of 256 x 256 px
ASKED = vae.Settings(temporal_chunk=1, tile_size=128, stream_frames=True)


def _model(extent: ClipExtent, monkeypatch):
    model = models.meta_model("wan21")
    monkeypatch.setattr(model, "clip_extent", lambda op: extent)
    return model


def _planned_under_budget(extent: ClipExtent):
    """The plan of LATENT under a budget that the whole clip fits in small tiles, and two latent frames untiled."""
    model = models.meta_model("wan21")
    model.clip_extent = lambda op: extent
    tiled, two = (planning.plan(model, "decode", LATENT, vae.Settings(temporal_chunk=c, tile_size=t), device="cpu")
                  for c, t in ((5, 64), (2, None)))
    assert two.peak_bytes < tiled.peak_bytes  # (the numbers of the released network)
    return planning.plan(model, "decode", LATENT, vae.Settings(memory_budget=tiled.peak_bytes), device="cpu")


def _retries(model, plan) -> list:
    """Every plan an out-of-memory error retries with, down to the refusal at the floor."""
    plans = [plan]
    with pytest.raises(OutOfMemory, match="fewer frames or a smaller size") as refused:
        while True:
            plans.append(smaller_plan(model, plans[-1], "out of memory"))
    return plans, str(refused.value)


@pytest.mark.parametrize("extent", [extent for extent in ClipExtent if extent is not ClipExtent.OWN_TILES])
def test_a_plan_and_its_retries_keep_what_the_extent_asks(extent, monkeypatch, caplog):
    model = _model(extent, monkeypatch)
    planning._warn_once.cache_clear()  # said once per process
    with caplog.at_level(logging.WARNING, logger="streamvae"):
        planned = planning.plan(model, "decode", LATENT, ASKED, device="cpu")
    tile = (128, 128) if extent.tiled else None
    chunk = 1 if extent.chunked else 5
    assert (planned.temporal_chunk, planned.tile_size, planned.frames_streamed) == (chunk, tile, extent.chunked)
    assert ("set aside" in caplog.text) is not extent.tiled
    if not extent.tiled:
        assert "tile_size=(128, 128)" in caplog.text
    # a budget nothing fits: the smallest plan the extent allows
    tight = planning.plan(model, "decode", LATENT, vae.Settings(memory_budget=1), device="cpu")
    assert tight.temporal_chunk == (1 if extent.chunked else 5)
    assert tight.frames_streamed or not extent.tiled
    assert (tight.tile_size is not None) is extent.tiled
    plans, refusal = _retries(model, planned)
    assert {p.temporal_chunk for p in plans} == ({1} if extent.chunked else {5})
    assert any(p.frames_streamed for p in plans) is extent.chunked
    assert (len({p.tile_size for p in plans}) > 1) is extent.tiled
    assert ("sees the whole clip" in refusal) is not extent.chunked


def test_chunks_after_statistics_take_every_tile_before_a_shorter_chunk():
    """Each chunk more costs passes over the clip: under a budget the whole clip in the smallest tile that fits comes
    before two chunks untiled (which plain chunks take first)."""
    plain, gathering = (_planned_under_budget(extent) for extent in (ClipExtent.CHUNKS, ClipExtent.CHUNKS_AFTER_STATISTICS))
    assert plain.temporal_chunk < 5 and plain.tile_size is None
    assert gathering.temporal_chunk == 5 and gathering.tile_size is not None and gathering.kept_stage_bytes == 0
