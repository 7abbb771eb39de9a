"""MiniMax-H3 run as its plan says: the model's own clips handed on as each is final (to a sink, as a video
file's), a batch of its tiles at a time, the decoder's blocks streamed from host memory, under memory budgets
(an encode's too); each equal within 1e-5 to the model's function run whole (`tiled.decode`: every tile of a
clip in one call, weights resident; core's frames in test_minimax_h3_core.py). A decode to a sink keeps host
memory flat in the clip's length (peak RSS of a fresh process per length). Progress counts each batch of
tiles. A clip that runs out of memory runs again with fewer tiles at once, the clips before it kept. The
planner's CUDA plans for 1280x720x241 fit 6 GiB
with the weights resident and 2 GiB with them streamed (the meta-device count's coefficients)."""
import dataclasses
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import vae
from bench import card_table, models
from minimax_h3_fixtures import SMALL, model, with_tiles
from reference import assert_exact
from vae.model.execution import OwnTiles
from vae.model.minimax_h3 import tiled
from vae.run import memory, planning, recovery
from vae.run.progress import Cancelled

GIB = 2**30
DEEPER = dataclasses.replace(with_tiles(SMALL, 64, 32), layers=4)  # 4 blocks: streaming leaves 2 of them resident


def _latent(frames: int, rows: int, cols: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(1, 24, frames, rows, cols, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("settings", [
    vae.Settings(),  # the CPU's default: one tile at a time
    vae.Settings(own_tile_batch=4),
    vae.Settings(stream_weights=True),
    vae.Settings(own_tile_batch=3, stream_weights=True),
], ids=["default", "batch4", "streamed", "batch3-streamed"])
def test_every_plan_gives_the_whole_decode(settings):
    """Two clips (12 latent frames) over a 3x2 grid of 64 px tiles."""
    m = model(DEEPER, seed=4)
    z = _latent(12, 7, 5)
    plan = vae.plan(m, "decode", tuple(z.shape), settings)
    assert plan.own_tiles.batch == (settings.own_tile_batch or 1)
    assert plan.own_tiles.weights_streamed == bool(settings.stream_weights)
    with torch.no_grad():
        whole = tiled.decode(m, z)
    assert_exact(vae.decode(m, z, plan), whole, 1e-5)
    assert all(p.device.type == "cpu" for p in m.parameters())  # streamed or not, the CPU's own memory


def test_clips_reach_the_sink_as_each_is_final():
    """Three clips: three hand-overs, in frame order, each of the frames no later clip changes."""
    m = model(DEEPER, seed=5)
    z = _latent(17, 5, 5, seed=6)
    got = []
    vae.decode(m, z, sink=lambda first, frames: got.append((first, frames.clone())))
    clips = tiled.decode_plan(17, m.config).clips
    assert [first for first, _ in got] == [clip.out_start for clip in clips]
    with torch.no_grad():
        assert_exact(torch.cat([frames for _, frames in got], dim=2), tiled.decode(m, z), 1e-5)


def test_progress_counts_each_batch_of_tiles_and_a_cancel_stops_the_run():
    """Two clips of a 3x2 grid, 4 tiles at a time: 2 batches per clip, 4 steps, counted as they are done; a
    cancel after the first batch stops the decode there."""
    m = model(DEEPER, seed=4)
    z = _latent(12, 7, 5)
    seen = []
    vae.decode(m, z, vae.Settings(own_tile_batch=4), progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    seen.clear()
    with pytest.raises(Cancelled):
        vae.decode(m, z, progress=lambda done, total: seen.append(done), cancel=lambda: bool(seen))
    assert seen == [1]


def _out_of_memory_when(monkeypatch, fails) -> list[tuple[int, int]]:
    """Each clip's tiles (`tiled._blend_tiles`) raise CUDA's out-of-memory error once their first batch is done
    where `fails(clip, batch)` (the clip, from 0; the tiles at once it runs with); the (clip, batch) of every
    try, in order."""
    blend, tries, done = tiled._blend_tiles, [], []

    def flaky(run, x, grid_in, grid_out, batch, step):
        clip = len(done)
        tries.append((clip, batch))

        def failing(cuts):
            for out in run(cuts):
                if fails(clip, batch):
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected)")
                yield out

        result = blend(failing, x, grid_in, grid_out, batch, step)
        done.append(clip)
        return result

    monkeypatch.setattr(tiled, "_blend_tiles", flaky)
    return tries


def test_out_of_memory_in_a_clip_retries_it_with_fewer_tiles_and_keeps_the_clips_before(monkeypatch, caplog):
    """Two clips over a 3x2 grid, all 6 tiles at once; the second clip runs out of memory with 6 and with 3 at
    once: it runs again with 3, then 1 (the first clip, handed on already, is not run again), and the frames
    reach the sink once each, in order, equal to the whole decode."""
    m = model(DEEPER, seed=4)
    z = _latent(12, 7, 5)
    with torch.no_grad():
        whole = tiled.decode(m, z)
    tries = _out_of_memory_when(monkeypatch, lambda clip, batch: clip == 1 and batch >= 3)
    got = []
    with caplog.at_level(logging.WARNING, logger="streamvae"):
        vae.decode(m, z, vae.Settings(own_tile_batch=6), sink=lambda first, frames: got.append((first, frames.clone())))
    assert tries == [(0, 6), (1, 6), (1, 3), (1, 1)]
    assert [first for first, _ in got] == [clip.out_start for clip in tiled.decode_plan(12, m.config).clips]
    assert_exact(torch.cat([frames for _, frames in got], dim=2), whole, 1e-5)
    assert "retrying the clip with 3 of its 6 tiles at a time" in caplog.text
    assert "retrying the clip with 1 of its 6 tiles at a time" in caplog.text


def test_out_of_memory_in_an_encode_clip_keeps_the_smaller_batch_for_the_clips_after(monkeypatch):
    """An encode of two clips, 2 tiles at once: the first clip runs out of memory and runs again one tile at a
    time, as the second then does; the latent equals the whole encode's."""
    m = model(DEEPER, seed=4)
    x = torch.rand(1, 3, 22, 96, 48, generator=torch.Generator().manual_seed(9)) * 2 - 1
    with torch.no_grad():
        whole = tiled.encode(m, x)[:, :24]  # the mean
    tries = _out_of_memory_when(monkeypatch, lambda clip, batch: batch > 1)
    got = vae.encode(m, x, vae.Settings(own_tile_batch=2))
    assert tries == [(0, 2), (0, 1), (1, 1)]
    assert_exact(got, whole, 1e-5)


def test_out_of_memory_with_one_tile_at_a_time_says_what_to_do(monkeypatch):
    m = model(DEEPER, seed=4)
    _out_of_memory_when(monkeypatch, lambda clip, batch: True)
    with pytest.raises(recovery.OutOfMemory) as caught:
        vae.decode(m, _latent(7, 5, 5), vae.Settings(own_tile_batch=2))
    text = str(caught.value)
    assert "one of the model's own tiles at a time" in text and "memory_budget" in text and "injected" in text
    assert isinstance(caught.value, torch.OutOfMemoryError)


def test_a_budget_runs_fewer_tiles_then_streams_the_weights():
    """Under a budget the plan keeps the most tiles at once that fits, then (on a GPU) streams the weights; on
    the CPU, whose memory streaming would not spare, it never streams unasked. The predicted peaks order as the
    choices do, and each budgeted run (a GPU's plan run here) gives the whole decode. (Blocks of 256 channels, 8
    of them: enough weight that streaming them saves more than holding a clip's tokens costs.)"""
    m = model(dataclasses.replace(DEEPER, dim=256, layers=8), seed=7)
    z = _latent(7, 7, 5, seed=8)
    shape = tuple(z.shape)
    clip = planning.clip_of(m, "decode", shape)
    gpu = dict(device="cuda", opts=vae.Optimizations(kernel_choice="defaults"))
    peak = {own: memory.estimate_own_tiles(m, clip, shape, own, "cuda")
            for own in (OwnTiles(4), OwnTiles(2), OwnTiles(1), OwnTiles(2, True), OwnTiles(1, True))}
    assert peak[OwnTiles(4)] > peak[OwnTiles(2)] > peak[OwnTiles(1)] > peak[OwnTiles(1, True)]
    assert peak[OwnTiles(2, True)] > peak[OwnTiles(1, True)]
    with torch.no_grad():
        whole = tiled.decode(m, z)
    for own, budget in ((OwnTiles(2), peak[OwnTiles(2)]), (OwnTiles(1, True), peak[OwnTiles(1, True)])):
        plan = vae.plan(m, "decode", shape, vae.Settings(own_tile_batch=4, memory_budget=budget), **gpu)
        assert (plan.own_tiles, plan.fits) == (own, True), plan.describe()
        assert_exact(vae.decode(m, z, plan), whole, 1e-5)
    on_cpu = vae.plan(m, "decode", shape, vae.Settings(own_tile_batch=4, memory_budget=peak[OwnTiles(1, True)]))
    assert not on_cpu.own_tiles.weights_streamed


def test_an_encode_under_a_budget_runs_fewer_tiles_at_once():
    """Two clips of 17 frames over a 2x2 grid of 64 px tiles: a budget at the two-tiles plan's peak gets two tiles
    at a time, and the encode equals every tile of a clip at once."""
    m = model(DEEPER, seed=11)
    x = torch.rand(1, 3, 34, 96, 96, generator=torch.Generator().manual_seed(12)) * 2 - 1
    clip = planning.clip_of(m, "encode", tuple(x.shape))
    budget = memory.estimate_own_tiles(m, clip, tuple(x.shape), OwnTiles(2), "cpu")
    settings = vae.Settings(own_tile_batch=4, memory_budget=budget)
    assert vae.plan(m, "encode", tuple(x.shape), settings).own_tiles == OwnTiles(2)
    with torch.no_grad():
        whole = tiled.encode(m, x)[:, :24]  # the mean
    assert_exact(vae.encode(m, x, settings), whole, 1e-5)


@pytest.mark.parametrize("budget, streamed", [(6, False), (2, True)])
def test_the_cuda_targets_fit(budget, streamed):
    """1280x720x241 in bf16 within 6 GiB with the weights resident (a clip's tiles a few at a time) and within
    2 GiB with the transformer blocks streamed from host memory; without a budget (every tile of a clip at once,
    weights resident) neither fits."""
    model = models.meta_model("minimax_h3")
    model.set_dtypes(encode=torch.float32, decode=torch.bfloat16)
    shape = (1, 24, card_table.decode_latent_frames(model, 241), 720 // 16, 1280 // 16)
    placement = dict(device="cuda", io_on_device=(False, False), opts=vae.Optimizations(kernel_choice="defaults"))
    plan = vae.plan(model, "decode", shape, vae.Settings(memory_budget=budget * GIB), **placement)
    assert plan.fits and plan.peak_bytes <= budget * GIB and plan.own_tiles.weights_streamed == streamed, plan.describe()
    unbudgeted = vae.plan(model, "decode", shape, **placement)
    assert unbudgeted.own_tiles == OwnTiles(28) and unbudgeted.peak_bytes > budget * GIB
    assert memory.calibration_source("minimax_h3", "decode", "own_tiles", "cuda") == "meta-device count"


_FLAT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import torch
    import vae
    from bench.memory_worker import fixed_mmap_threshold
    from vae.video_file import to_pixels
    sys.path.insert(0, "tests")
    from minimax_h3_fixtures import SMALL, model

    fixed_mmap_threshold()  # peak RSS follows the live tensors, not what malloc keeps (as bench's measurements)

    def status(field):
        line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    m = model(SMALL, seed=9)
    z = torch.randn(1, 24, int(sys.argv[1]), 24, 24, generator=torch.Generator().manual_seed(10))  # 384 x 384 px
    frames = []
    sink = lambda first, clip: frames.append(to_pixels(clip, 8).shape[0])  # what a file sink converts, then drops
    vae.decode(m, z[:, :, :2], sink=sink)  # warm-up: kernels, allocator
    before = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here
    frames.clear()
    vae.decode(m, z, sink=sink)
    print(json.dumps({"growth": status("VmHWM") - before, "frames": sum(frames)}))
""")


def test_a_decode_to_a_sink_keeps_host_memory_flat_in_length():
    """32 latent frames (6 clips, 107 frames) and 64 (13 clips, 217 frames) at 384x384 px, each clip converted to
    8-bit frames as a file sink does: the longer clip's peak RSS (malloc returning what is freed, as the memory
    measurements run) grows by less than a fifth of its float32 frames (384 MB; one clip's 39 MB). (A video file's writer thread adds a plateau of its own, 60-100 MB with timing:
    tests/test_video_file.py bounds the writer.)"""
    runs = {}
    for latent_frames in (32, 64):
        done = subprocess.run([sys.executable, "-c", _FLAT, str(latent_frames)], capture_output=True, text=True,
                              timeout=600, cwd=Path(__file__).parents[1])
        assert done.returncode == 0, done.stderr[-3000:]
        runs[latent_frames] = json.loads(done.stdout.strip().splitlines()[-1])
    whole = 3 * runs[64]["frames"] * 384 * 384 * 4
    assert [runs[n]["frames"] for n in runs] == [model(SMALL).frames_made("decode", n) for n in runs]
    assert runs[64]["growth"] - runs[32]["growth"] < whole / 5, runs
