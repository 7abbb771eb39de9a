"""The LTX-2.5 diffusion decoder's parts (vae/model/ltx25) without core (test_ltx25_core.py compares the
whole network with core's):

- an NA block (stages 1-4) and a diffusion block (stage 5) computing a tile from the tile plus its halo
  give the whole grid's tokens there (RoPE positions and window shifts are the whole grid's);
- `vae.load` detects the split file and the VAE under `vae.` in a full checkpoint (their metadata config read);
- the config read from a checkpoint: every size from the weights, core's defaults for what a file
  without metadata does not say, a metadata size that contradicts the weights refused;
- the load config's `noise_seed` (Load VAE's `decode_seed`) seeds the decode; a seed no generator takes is refused;
- the frames of each stage's grid: 8(T - 1) + 1 pixel frames from T latent frames;
- a decode is planned in temporal chunks of whole frames, a tile asked for set aside (said);
  tests/test_ltx25_chunks.py: the chunks give the whole clip's frames.
"""
import logging

import pytest
import torch

import vae
from ltx25_fixtures import VARIANTS, model, save_full_checkpoint, save_split
from vae.kernels.na_window import key_box
from vae.model.ltx25 import LTX25Config, LTX25VAE
from vae.model.ltx25.blocks import GridPart, LTX25DiffusionBlock, LTX25NABlock
from vae.model.video_vae import LayoutError
from vae.run import planning
from vae.run.recovery import OutOfMemory, smaller_plan

GRID = (9, 10, 12)


def _random(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(noise / p.shape[-1] ** 0.5 if p.dim() > 1 else (2.0 if "_norm" in name else 1.0) + 0.3 * noise)
    return module.eval()


def _box(x, origin, size):
    return x[:, origin[0]:origin[0] + size[0], origin[1]:origin[1] + size[1], origin[2]:origin[2] + size[2]]


KERNEL, WIDTH = (5, 5, 7), 32


@pytest.fixture(scope="module", params=["na", "diffusion"])
def whole_grid(request):
    """(block, x, context, modulation, the block's output on the whole grid) for an NA and a diffusion block."""
    g = torch.Generator().manual_seed(9)
    x, context = (torch.randn(1, *GRID, WIDTH, generator=g) for _ in range(2))
    if request.param == "na":
        block, context, modulation = _random(LTX25NABlock(WIDTH, KERNEL, 16, 64), 1), None, None
    else:
        block = _random(LTX25DiffusionBlock(WIDTH, KERNEL, 16, 64), 2)
        modulation = tuple(0.1 * torch.randn(1, 1, 1, 1, WIDTH, generator=g) for _ in range(7))
    with torch.no_grad():
        whole = block(x) if context is None else block(x, context, modulation)
    return block, x, context, modulation, whole


@pytest.mark.parametrize("origin, size", [((0, 0, 0), (3, 4, 5)), ((4, 3, 5), (3, 4, 4)), ((6, 7, 9), (3, 3, 3))])
def test_a_tile_with_its_halo_gives_the_whole_grids_tokens(whole_grid, origin, size):
    block, x, context, modulation, whole = whole_grid
    halo_origin, halo_size = key_box(origin, size, KERNEL, GRID)
    assert halo_size != GRID
    part = GridPart(GRID, halo_origin, tuple(o - h for o, h in zip(origin, halo_origin)), size)
    with torch.no_grad():
        if context is None:
            tile = block(_box(x, halo_origin, halo_size), part)
        else:
            tile = block(_box(x, halo_origin, halo_size), _box(context, halo_origin, halo_size), modulation, part)
    expected = _box(whole, origin, size)
    assert tile.shape == expected.shape
    assert (tile - expected).abs().max() <= 1e-5 * max(1.0, expected.abs().max().item())


def _state_dict(variant: str) -> dict:
    return {k: v for k, v in model(variant).state_dict().items()}


@pytest.mark.parametrize("write", [save_split, save_full_checkpoint])
def test_the_split_file_and_the_full_checkpoint_load(tmp_path, write):
    ours = model("other_windows")
    loaded = vae.load(write(ours, tmp_path / "file.safetensors"))
    assert type(loaded) is LTX25VAE and loaded.config == VARIANTS["other_windows"]
    assert all(torch.equal(value, loaded.state_dict()[key]) for key, value in ours.state_dict().items())


def test_every_size_comes_from_the_weights():
    """Without metadata: the sizes of the file, core's windows and sampling, strides by their volume."""
    cfg = LTX25VAE.config_from_state_dict(_state_dict("released_windows"), {})
    assert cfg == VARIANTS["released_windows"]
    other = LTX25VAE.config_from_state_dict(_state_dict("other_windows"), {})
    expected = VARIANTS["other_windows"]
    assert (other.stage_channels, other.stage_depths, other.head_dim, other.mlp_hidden) == \
           (expected.stage_channels, expected.stage_depths, expected.head_dim, expected.mlp_hidden)
    defaults = LTX25Config()
    assert (other.stage_kernels, other.stage5_kernel, other.num_inference_steps, other.model_output_type) == \
           (defaults.stage_kernels, defaults.stage5_kernel, defaults.num_inference_steps, defaults.model_output_type)
    assert other.upsample_strides == ((1, 2, 2), (2, 1, 1), (2, 2, 2), (2, 2, 2))  # its volumes split as released


@pytest.mark.parametrize("overrides, message", [
    ({"stage_channels": (128, 64, 32, 32, 32)}, "stage_channels"),
    ({"upsample_strides": ((1, 2, 2), (1, 2, 2), (2, 2, 2), (2, 2, 2))}, "stride volumes"),
    ({"out_channels": 4}, "square patch"),
    ({"model_output_type": "eps"}, "sampling"),
])
def test_a_config_the_weights_contradict_is_refused(overrides, message):
    with pytest.raises(LayoutError, match=message):
        LTX25VAE.config_from_state_dict(_state_dict("released_windows"), overrides)


def test_weights_that_fit_no_rule_are_refused():
    sd = _state_dict("released_windows")
    sd["decoder.upsamples.1.proj.weight"] = torch.zeros(3 * 32, 64)
    with pytest.raises(LayoutError, match="stride volume"):
        LTX25VAE.config_from_state_dict(sd, {})


def test_the_seed_reaches_the_decode(tmp_path):
    """The load config's `noise_seed` (Load VAE's `decode_seed`) seeds the decoder's noise: seed 7 decodes as
    `decode_clip` with 7, other frames than seed 0's; the largest seed a generator takes decodes too."""
    path = save_split(model("released_windows"), tmp_path / "vae.safetensors")
    z = torch.randn(1, 128, 2, 1, 2, generator=torch.Generator().manual_seed(3))
    default, seven = vae.load(path), vae.load(path, config={"noise_seed": 7})
    frames = vae.decode(seven, z)
    torch.testing.assert_close(frames, seven.decode_clip(z, 7), rtol=0, atol=1e-4)  # chunks: float32 rounding
    assert (frames - vae.decode(default, z)).abs().max() > 0.1
    largest = vae.load(path, config={"noise_seed": 2 ** 64 - 1})
    assert torch.isfinite(vae.decode(largest, z)).all()


@pytest.mark.parametrize("seed, message", [
    (2 ** 64, rf"ltx25 noise_seed must be an integer from 0 to {2 ** 64 - 1} .*got {2 ** 64}"),
    (-1, "noise_seed must be a whole number >= 0, got -1"),
    (1.5, "noise_seed must be a whole number >= 0, got 1.5"),
    ("7", 'noise_seed must be a whole number >= 0, got "7"'),
    (True, "noise_seed must be a whole number >= 0, got true"),
])
def test_a_seed_no_generator_takes_is_refused(tmp_path, seed, message):
    path = save_split(model("released_windows"), tmp_path / "vae.safetensors")
    with pytest.raises(ValueError, match=message):
        vae.load(path, config={"noise_seed": seed})


def test_stage_frames():
    """T latent frames: T + 2 in stage 1 (the trailing copies), 8(T - 1) + 1 pixel frames."""
    cfg = LTX25Config()
    for t in (1, 2, 16):
        frames = cfg.stage_frames(t)
        assert frames[0] == t + 2 and frames[-1] == 8 * (t - 1) + 1


def test_a_decode_is_planned_in_untiled_chunks_and_says_so(caplog):
    """The decoder runs in temporal chunks of whole frames (`clip_extent`: `ClipExtent.UNTILED_CHUNKS`): a tile
    asked for is set aside with a warning naming it, the chunk and streamed frames are kept (the encoder is chunked
    and tiled as asked); an out-of-memory error shrinks the chunk to one latent frame, then says what to do."""
    m = model("released_windows")
    settings = vae.Settings(temporal_chunk=2, tile_size=64, stream_frames=False)
    planning._warn_once.cache_clear()  # said once per process: another test may have planned this clip before
    with caplog.at_level(logging.WARNING, logger="streamvae"):
        planned = vae.plan(m, "decode", (1, 128, 3, 4, 4), settings)
    assert (planned.temporal_chunk, planned.tile_size, planned.frames_streamed) == (2, None, False)
    assert "tile_size=(64, 64) is set aside: it runs untiled, in temporal chunks" in caplog.text
    encode = vae.plan(m, "encode", (1, 3, 17, 128, 128), vae.Settings(temporal_chunk=1, tile_size=64, stream_frames=True))
    assert (encode.temporal_chunk, encode.tile_size, encode.frames_streamed) == (1, (64, 64), True)
    plans = [planned]
    with pytest.raises(OutOfMemory, match="fewer frames or a smaller size"):
        while True:
            plans.append(smaller_plan(m, plans[-1], "CUDA out of memory"))
    assert [p.temporal_chunk for p in plans][-1] == 1 and {p.tile_size for p in plans} == {None}
