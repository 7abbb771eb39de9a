"""MiniMax-H3 without core: every size read from the weights (released shapes on the meta device, and
the small test file), shapes that fit no network and the int8 file refused by `vae.load` with what to load
instead, the VAE inside a full checkpoint loaded, the tiles of a clip batched or one at a time giving the same frames, the decoder's blocks run layer
by layer over groups of tiles giving its whole run, core's blend weights summing to one over every pixel of
a frame, and the plan of StreamVAE's tiles, chunks or streamed frames falling back to the whole clip with a
warning naming them (an out-of-memory error then has no smaller plan). Against core itself:
test_minimax_h3_core.py."""
import dataclasses

import pytest
import torch
from safetensors.torch import save_file

import vae
from minimax_h3_fixtures import SMALL, model, with_tiles
from reference import assert_exact
from vae.loading import CheckpointError
from vae.model.execution import OwnTiles
from vae.model.minimax_h3 import MiniMaxH3Config, MiniMaxH3VAE, tiled
from vae.model.minimax_h3.checkpoint import config_from_state_dict as from_state_dict
from vae.model.minimax_h3.config import LATENTS_MEAN, LATENTS_STD
from vae.model.minimax_h3.tiles import TileGrid, decode_plan
from vae.run import planning, recovery


def _released_state_dict() -> dict:
    with torch.device("meta"):
        return MiniMaxH3VAE().state_dict()


def test_sizes_come_from_the_weights():
    assert from_state_dict(_released_state_dict()) == MiniMaxH3Config()
    assert from_state_dict(model(SMALL).state_dict()) == SMALL
    deeper = dataclasses.replace(SMALL, layers=3, register_tokens=2, ff_mult=2, res_blocks=(2, 1, 1, 1, 1, 1))
    assert from_state_dict(MiniMaxH3VAE(deeper).state_dict()) == deeper


def test_shapes_that_fit_no_network_are_named():
    sd = model(SMALL).state_dict()
    sd["decoder.proj_out.weight"] = torch.zeros(1000, SMALL.dim)
    with pytest.raises(CheckpointError, match=r"decoder\.proj_out\.weight \(1000, 128\)"):
        vae.load(sd)
    del sd["encoder.down.1.downsample.conv.weight"]
    with pytest.raises(CheckpointError, match="downsampler"):
        vae.load(sd)


def test_the_int8_file_is_refused_with_what_to_load():
    sd = model(SMALL).state_dict()
    sd["decoder.transformer_blocks.0.ff.w1.weight"] = sd["decoder.transformer_blocks.0.ff.w1.weight"].to(torch.int8)
    sd["decoder.transformer_blocks.0.ff.w1.comfy_quant"] = torch.tensor(list(b'{"format": "int8_tensorwise"}'),
                                                                         dtype=torch.uint8)
    with pytest.raises(CheckpointError, match=r"int8 .*transformer_blocks\.0\.ff\.w1.*load the bf16/fp32 MiniMax-H3 VAE"):
        vae.load(sd)


def test_the_vae_inside_a_full_checkpoint_loads(tmp_path):
    """A file with a diffusion model's keys and the VAE under `vae.` (a full checkpoint) loads as MiniMax-H3, lazily
    from a real safetensors file, and decodes as the VAE's own weights do."""
    ours = model(SMALL, seed=7)
    sd = {f"vae.{k}": v.contiguous() for k, v in ours.state_dict().items()}
    sd |= {"model.diffusion_model.blocks.0.attn.qkv.weight": torch.zeros(8, 8),
           "model.diffusion_model.final_layer.linear.weight": torch.zeros(4, 4)}
    save_file(sd, str(tmp_path / "minimax_h3_full.safetensors"))
    loaded = vae.load(tmp_path / "minimax_h3_full.safetensors")
    assert loaded.family == "minimax_h3"
    z = torch.randn(1, 24, 2, 2, 3, generator=torch.Generator().manual_seed(8))
    assert_exact(vae.decode(loaded, z), vae.decode(ours, z), 1e-6)


@pytest.mark.parametrize("op", ["decode", "encode"])
def test_tiles_batched_or_one_at_a_time(op):
    """Every tile of a clip in one batch (one attention call per layer over all of them) or one by one."""
    m = model(with_tiles(SMALL, 64, 32), seed=5)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 24, 5, 6, 4, generator=g) if op == "decode" else torch.rand(1, 3, 5, 96, 48, generator=g) * 2 - 1
    run = getattr(tiled, op)
    with torch.no_grad():
        assert_exact(run(m, x, OwnTiles(batch=1)), run(m, x))


def test_blocks_run_layer_by_layer_over_groups_of_tiles():
    """What a run with the weights streamed does: each block over every tile of a clip, two tiles at a
    time, before the next block's weights are needed."""
    m = model(SMALL, seed=7)
    z = torch.randn(4, 24, 7, 4, 4, generator=torch.Generator().manual_seed(8))  # 4 tiles of one clip
    with torch.no_grad():
        streamed = torch.cat(list(m.decode_tile_batches(iter([z[:2], z[2:]]), OwnTiles(2, weights_streamed=True))))
        assert_exact(streamed, m.decode_tiles(z))


@pytest.mark.parametrize("size", [(320, 288), (144, 112), (48, 80), (720, 1280), (272, 48)])
def test_blend_weights_sum_to_one(size):
    for tiles in ((256, 64), (64, 32)):
        grid = TileGrid.of(*size, with_tiles(SMALL, *tiles))
        total = torch.zeros(size)
        for i, j in grid.tiles:
            y, x = grid.rows.starts[i], grid.cols.starts[j]
            total[y:y + grid.rows.size, x:x + grid.cols.size] += tiled.tile_weights(grid, i, j)
        assert_exact(total, torch.ones(size), atol=1e-6)


def test_the_file_without_statistics_takes_cores():
    """Core holds the latent statistics as constants: a file without them loads with those."""
    sd = model(SMALL).state_dict()
    del sd["latents_mean"], sd["latents_std"]
    loaded = vae.load(sd)
    assert_exact(loaded.to_comfy_latent(torch.zeros(1, 24, 1, 1, 1)).flatten(),
                 -torch.tensor(LATENTS_MEAN) / torch.tensor(LATENTS_STD))


@pytest.mark.parametrize("asked", [dict(tile_size=64), dict(temporal_chunk=4), dict(stream_frames=True, tile_size=32)])
def test_streamvae_tiles_and_chunks_fall_back_to_the_whole_clip(asked, caplog):
    """The model's own tiles and clips are its function: the plan runs the clip in one chunk, untiled, with
    core's frame count (6 latent frames make 18 frames, not 21), says which settings it did not apply, and an
    out-of-memory error in it has no smaller plan to go on with."""
    m = model(SMALL)
    planning._warn_once.cache_clear()  # said once per process
    plan = vae.plan(m, "decode", (1, 24, 6, 6, 4), vae.Settings(**asked))  # 96 x 64 px
    assert (plan.temporal_chunk, plan.tile_size, plan.frames_streamed, plan.clip.frames) == (6, None, False, 18)
    assert decode_plan(6, SMALL).frames == 18
    assert all(f"{name}=" in caplog.text for name in asked) and "set aside" in caplog.text
    with pytest.raises(recovery.OutOfMemory, match="sees the whole clip at once: the model's own tiles and clips\\); "
                                                   "with a memory budget"):
        recovery.smaller_plan(m, plan, "CUDA out of memory")


def test_the_nodes_count_its_frames():
    """The node layer's LATENT reading (core's VAE Decode on Load VAE's output reads it too) takes the network's
    frame counts: 6 latent frames decode to core's 18 frames, and StreamVAE Encode's count of a 20-frame clip
    (7 latent frames) is kept, where the 4n+1 rule would give 21 and 25 (and refuse the 20)."""
    from test_bad_inputs import latents

    m = model(SMALL)
    assert latents.read_latent({"samples": torch.zeros(1, 24, 6, 2, 2)}, m).frames == [18]
    assert latents.read_latent(latents.make_latent(torch.zeros(1, 24, 7, 2, 2), [20], (32, 32)), m).frames == [20]
