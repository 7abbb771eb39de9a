"""HunyuanVideo 1.0 / Kandinsky 5 and 6 (`hv10`) through the public API (`vae.load`, `vae.decode`, `vae.encode`)
against diffusers' `AutoencoderKLHunyuanVideo` decoding and encoding the whole clip (frame-wise decoding and
tiling off: whole-clip GroupNorms, frame-causal mid-block attention) and against ComfyUI 0.33.0's own VAE
(`frames="core"`), with seeded random weights at reduced widths saved through real safetensors files in both
key layouts: the original one (the released file's, diffusers') and core's (written by core's own modules
after its loader's conversion, in a process of its own: tests/comfy_support/core_hv10.py).

Encode and decode match diffusers within 1e-4 x max(1, |ref|) from both files; the core setting matches
core's encode and decode within the same bound, untiled and in exact tiles, and the trained model's frames
differ from core's by more than 1/255 of the image range; HunyuanVideo 1.5's key sets (released, diffusers',
a real small file) are never read as 1.0's, and 1.0's files load as 1.0, not as 1.5; the released sizes are
read from the released key set's shapes; sizes that fit no rule are refused by name. The whole-clip norms let
the clip run in chunks once their statistics are gathered (`ClipExtent.CHUNKS_AFTER_STATISTICS`): the plan
prefers the whole clip in tiles, then chunks, then frames streamed. (That chunks and tiles equal
the whole clip is test_clip_statistics.py's and the contract of test_families.py; the engine's reading of the
extent is test_clip_extent.py's, the norm's test_clip_norm.py's.)"""
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import vae
from bench.core_vae import TREES
from comfy_support import environment
from hv15_fixtures import save_small_checkpoint
from reference import assert_exact, random_weights
from vae.loading import save_checkpoint
from vae.model.hv10 import Hv10Config, Hv10VAE
from vae.model.hv10 import checkpoint
from vae.model.hv15 import Hv15Config, Hv15VAE
from vae.model.video_vae import LayoutError
from vae.run import planning, recovery

diffusers = pytest.importorskip("diffusers")

# Reduced widths with the released structure (4 stages, 8x / 4x), one residual block per encoder stage (two
# per decoder stage); 32 norm groups as released and as core's GroupNorms have, whatever the width.
TINY = dict(latent_channels=4, block_out_channels=(32, 32, 32, 64), layers_per_block=1)
CORE_RUNNER = Path(__file__).resolve().parent / "comfy_support" / "core_hv10.py"
LATENT = torch.randn(1, 4, 3, 2, 3, generator=torch.Generator().manual_seed(52))  # B,C,T',h,w
VIDEO = torch.rand(1, 3, 9, 16, 24, generator=torch.Generator().manual_seed(53)) * 2 - 1  # B,3,T,H,W
OPTS = vae.Optimizations(kernel_choice="defaults")  # no timing of every layer's kernels


@pytest.fixture(scope="module")
def reference():
    with torch.device("meta"):  # initialised once, by random_weights
        model = diffusers.AutoencoderKLHunyuanVideo(**TINY)
    model = random_weights(model.to_empty(device="cpu"), seed=10)
    model.use_framewise_encoding = model.use_framewise_decoding = False  # the whole clip at once
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("hv10")


@pytest.fixture(scope="module")
def original(reference, folder) -> Path:
    """The reference's weights in the original key names, as a real safetensors file."""
    save_checkpoint(reference.state_dict(), folder / "original.safetensors")
    return folder / "original.safetensors"


@pytest.fixture(scope="module")
def core(original, folder) -> dict:
    """Core 0.33.0 on the original file: {"layout": the file in core's key names, "decode", "encode": its
    results on LATENT and VIDEO}."""
    environment.require((TREES["0.33.0"].path / "comfy").is_dir(), f"ComfyUI 0.33.0 at {TREES['0.33.0'].path}")
    save_file({"decode:clip": LATENT, "encode:clip": VIDEO}, str(folder / "inputs.safetensors"))
    job = {"checkpoint": str(original), "core_layout": str(folder / "core.safetensors"),
           "inputs": str(folder / "inputs.safetensors"), "outputs": str(folder / "outputs.safetensors")}
    (folder / "job.json").write_text(json.dumps(job))
    done = subprocess.run([sys.executable, str(CORE_RUNNER), str(folder / "job.json")], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = load_file(job["outputs"])
    return {"layout": folder / "core.safetensors", "decode": outputs["decode:clip"], "encode": outputs["encode:clip"]}


@pytest.fixture(scope="module")
def expected(reference) -> dict:
    """diffusers' whole-clip decode of LATENT and encode (posterior mode) of VIDEO."""
    with torch.no_grad():
        return {"decode": reference.decode(LATENT).sample, "encode": reference.encode(VIDEO).latent_dist.mode()}


def test_decode_matches_diffusers(original, expected):
    """From the original file, as `vae.load` detects it (exact tiles and chunks: test_families.py's contract)."""
    model = vae.load(original)
    assert type(model) is Hv10VAE and model.config == Hv10Config(**TINY)
    got = vae.decode(model, LATENT, opts=OPTS)
    assert got.shape == (1, 3, 9, 16, 24)
    assert_exact(got, expected["decode"], atol=1e-4)


def test_encode_matches_diffusers(original, expected):
    assert_exact(vae.encode(vae.load(original), VIDEO, opts=OPTS), expected["encode"], atol=1e-4)


@pytest.mark.comfy
def test_the_core_layout_and_the_core_setting_give_cores_frames(core, expected):
    """The file in core's key names loads as the same model (diffusers' frames); `frames="core"` gives core's
    decode and encode, untiled and in exact tiles; the trained model's decode differs from core's by more than
    1/255 of the range."""
    state = load_file(str(core["layout"]))
    assert checkpoint.layout_of(state) == "core" and checkpoint.layout_of(Hv10VAE.native_state_dict(state)) == "original"
    trained, ours = vae.load(core["layout"]), vae.load(core["layout"], config={"frames": "core"})
    assert_exact(vae.decode(trained, LATENT, opts=OPTS), expected["decode"], atol=1e-4)
    assert_exact(vae.encode(trained, VIDEO, opts=OPTS), expected["encode"], atol=1e-4)
    for settings in (vae.Settings(), vae.Settings(tile_size=16)):
        assert_exact(vae.decode(ours, LATENT, settings, opts=OPTS), core["decode"], atol=1e-4)
        assert_exact(vae.encode(ours, VIDEO, settings, opts=OPTS), core["encode"], atol=1e-4)
    assert (vae.decode(trained, LATENT, opts=OPTS) - core["decode"]).abs().max().item() / 2 * 255 > 1  # [-1, 1] -> 0..255


def _meta_state(module_class, *args) -> dict:
    with torch.device("meta"):
        return module_class(*args).state_dict()


def test_hv15_files_are_never_read_as_hv10(tmp_path, original):
    """HunyuanVideo 1.5's released and diffusers' key sets and a real small 1.5 file have 1.0's module paths
    but not its GroupNorms: the 1.0 rule refuses them and 1.5's claims them; a 1.0 file, which 1.5's probe
    keys match too, is detected as 1.0."""
    save_small_checkpoint(tmp_path / "hv15.safetensors")
    hv15_sets = {"released": _meta_state(Hv15VAE, Hv15Config()),
                 "diffusers": _meta_state(diffusers.AutoencoderKLHunyuanVideo15),
                 "small file": load_file(str(tmp_path / "hv15.safetensors"))}
    for name, state in hv15_sets.items():
        assert checkpoint.layout_of(state) is None and Hv10VAE.native_state_dict(state) is None, name
        assert vae.detect_family(state)[0] is Hv15VAE, name
    assert type(vae.load(tmp_path / "hv15.safetensors")) is Hv15VAE
    released = _meta_state(diffusers.AutoencoderKLHunyuanVideo)
    assert checkpoint.layout_of(released) == "original" and vae.detect_family(released)[0] is Hv10VAE
    assert vae.detect_family(load_file(str(original)))[0] is Hv10VAE


def test_the_released_sizes_are_read_from_the_shapes():
    """diffusers' released config, as a key set with shapes: our released config, key for key and shape for shape."""
    released = _meta_state(diffusers.AutoencoderKLHunyuanVideo)
    cfg = Hv10VAE.config_from_state_dict(Hv10VAE.native_state_dict(released), {})
    assert cfg == Hv10Config() and cfg.spatial_compression == 8 and cfg.temporal_stages() == {1, 2}
    ours = _meta_state(Hv10VAE, cfg)
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in released.items()}


def test_shapes_that_fit_no_rule_are_refused(reference):
    state = dict(reference.state_dict())
    state["decoder.up_blocks.1.resnets.0.conv1.conv.weight"] = state["decoder.up_blocks.1.resnets.0.conv1.conv.weight"][:16]
    with pytest.raises(LayoutError, match=r"decoder stage widths \(64, 16, 32, 32\)"):
        Hv10VAE.config_from_state_dict(state, {})
    state = dict(reference.state_dict())
    del state["encoder.down_blocks.1.downsamplers.0.conv.conv.weight"]
    with pytest.raises(LayoutError, match=r"encoder.down_blocks \[0, 2\] have downsamplers"):
        Hv10VAE.config_from_state_dict(state, {})
    with pytest.raises(ValueError, match="frames must be one of"):
        Hv10VAE.config_from_state_dict(reference.state_dict(), {"frames": "chunked"})
    with pytest.raises(ValueError, match=r"widths \[32, 32, 32\] do not split into 64 norm groups"):
        Hv10VAE.config_from_state_dict(reference.state_dict(), {"norm_groups": 64})


def test_the_latent_format():
    """ComfyUI's LATENT is the raw latent, the DiT sees it x 0.476986 (core's latent format `HunyuanVideo`)."""
    model = Hv10VAE(Hv10Config(**TINY))
    assert model.comfy_latent_in_model_space is False and torch.equal(model.to_comfy_latent(LATENT), LATENT)
    torch.testing.assert_close(model.to_model_space(LATENT), LATENT * 0.476986)
    torch.testing.assert_close(model.from_model_space(model.to_model_space(LATENT)), LATENT)


def test_chunks_come_after_every_tile_of_the_whole_clip():
    """The chunks, tiles and streamed frames asked for are kept (no chunk asked: one); under a budget the whole
    clip in tiles comes before chunks (each costs passes over the clip); an out-of-memory retry offloads the
    caches, halves the tile, then the chunk, then streams frames. (That they give the whole clip's frames is
    test_clip_statistics.py's.)"""
    with torch.device("meta"):
        model = Hv10VAE()
    shape = (1, 16, 9, 40, 64)  # 9 latent frames at 512x320
    plan = planning.plan(model, "decode", shape, vae.Settings(temporal_chunk=2, tile_size=128), device="cpu")
    assert (plan.temporal_chunk, plan.tile_size, plan.frames_streamed) == (2, (128, 128), False)
    assert plan.kept_stage_bytes > 0
    assert planning.plan(model, "decode", shape, vae.Settings(), device="cpu").grid[2] == 1
    tiled = planning.plan(model, "decode", shape, vae.Settings(temporal_chunk=9, tile_size=128), device="cpu").peak_bytes
    budgeted = planning.plan(model, "decode", shape, vae.Settings(memory_budget=tiled), device="cpu")
    assert (budgeted.temporal_chunk, budgeted.frames_streamed) == (9, False) and budgeted.tile_size is not None
    assert planning.plan(model, "decode", shape, vae.Settings(temporal_chunk=8), device="cpu").peak_bytes > tiled
    plans = [plan]
    while not plans[-1].frames_streamed:
        plans.append(recovery.smaller_plan(model, plans[-1], "out of memory"))
    tiles = [p.tile_size[0] for p in plans]
    assert tiles == sorted(tiles, reverse=True) and tiles[-1] < 64
    assert [p.temporal_chunk for p in plans[-3:]] == [2, 1, 1]
