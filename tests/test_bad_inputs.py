"""Bad input, below the server: checkpoints that are not what they claim, IMAGEs and LATENTs the node
layer must adapt or refuse, tiling values ComfyUI does not range-check for us, and the fault hook.

Each case either gives the correct result or raises an error that names the problem and the fix.
Complements test_loading.py (missing/unexpected/mis-shaped keys, malicious pickle, truncation),
test_wan.py (diffusers names, fp16/bf16/fp8 storage) and test_engine.py (T and H/W padding); the
same cases as users meet them in ComfyUI are in test_bad_inputs_server.py.
"""
import importlib
import json
import re
import sys
import types

import pytest
import torch

import vae
from tests.comfy_support import faults
from bench import models
from vae.run.run_warnings import collected
from tests.reference import REPO, assert_exact, load_tiny, tensors, tiny_checkpoint


def node_module(name: str):
    """A pure-torch module of the node layer (nodes/<name>.py), imported without ComfyUI: inside a
    stand-in for the pack whose `vae` is the library itself and whose `nodes/__init__.py` (which needs
    ComfyUI) is not run."""
    pack = "streamvae_pack_under_test"
    if pack not in sys.modules:
        for package, path in ((pack, REPO), (f"{pack}.nodes", REPO / "nodes")):
            sys.modules[package] = types.ModuleType(package)
            sys.modules[package].__path__ = [str(path)]
    for library in [name for name in sys.modules if name == "vae" or name.startswith("vae.")]:
        sys.modules.setdefault(f"{pack}.{library}", sys.modules[library])  # one copy: a test may patch it
    return importlib.import_module(f"{pack}.nodes.{name}")


images, latents, run_settings = (node_module(name) for name in ("images", "latents", "run_settings"))

# Key layouts of models that end up in models/vae by mistake (names as the real files have them).
FOREIGN = {
    "unet": {"model.diffusion_model.input_blocks.0.0.weight": (32, 4, 3, 3),
             "model.diffusion_model.time_embed.0.weight": (128, 32),
             "model.diffusion_model.out.2.weight": (4, 32, 3, 3)},
    "wan_dit": {"patch_embedding.weight": (64, 16, 1, 2, 2), "blocks.0.self_attn.q.weight": (64, 64),
                "blocks.0.cross_attn.k.weight": (64, 64), "head.head.weight": (64, 64)},
    "clip_text": {"text_model.embeddings.token_embedding.weight": (64, 32),
                  "text_model.encoder.layers.0.self_attn.k_proj.weight": (32, 32)},
    "t5_text": {"shared.weight": (64, 32), "encoder.block.0.layer.0.SelfAttention.k.weight": (32, 32)},
    "lora": {"lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight": (4, 32),
             "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight": (32, 4),
             "lora_unet_down_blocks_0_attentions_0_proj_in.alpha": ()},
    "sd_image_vae": {"encoder.down.0.block.0.conv1.weight": (8, 8, 3, 3), "decoder.up.0.block.0.conv1.weight": (8, 8, 3, 3),
                     "encoder.mid.attn_1.q.weight": (8, 8, 1, 1)},
}
FOREIGN_SAYS = {"unet": "diffusion model", "wan_dit": "diffusion model", "clip_text": "text encoder",
                "t5_text": "text encoder", "lora": "LoRA", "sd_image_vae": "image VAE"}


def write_foreign(kind: str, path):
    vae.save_checkpoint({k: torch.zeros(shape) for k, shape in FOREIGN[kind].items()}, path)
    return path


@pytest.fixture(scope="module")
def wan21_state():
    return dict(tensors("wan21", "tiny_vae.safetensors"))


@pytest.fixture(scope="module")
def wan21():
    return load_tiny("wan21")


# -- checkpoints -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(FOREIGN))
def test_foreign_checkpoint_says_what_it_is_and_where_it_belongs(kind, tmp_path):
    path = write_foreign(kind, tmp_path / f"{kind}.safetensors")
    with pytest.raises(vae.CheckpointError) as error:
        vae.load(path)
    message = str(error.value)
    assert "not a video VAE checkpoint" in message and FOREIGN_SAYS[kind] in message, message
    assert "wan_2.1_vae.safetensors" in message  # and which files would work


@pytest.mark.parametrize("damage", ["garbage_header", "header_longer_than_file", "zero_bytes"])
def test_corrupt_safetensors_is_reported_with_the_fix(damage, tmp_path):
    data = bytearray(tiny_checkpoint("wan21").read_bytes())
    if damage == "garbage_header":
        data[8:40] = b"\x00\xff" * 16
    elif damage == "header_longer_than_file":
        data[0:8] = (len(data) * 2).to_bytes(8, "little")
    else:
        data = b""
    path = tmp_path / "broken.safetensors"
    path.write_bytes(bytes(data))
    for read in (vae.read_checkpoint, vae.loading.read_shapes):
        with pytest.raises(vae.CheckpointError, match="truncated or corrupt.*download it again"):
            read(path)


def test_truncated_pickle_is_reported_with_the_fix(tmp_path, wan21_state):
    path = tmp_path / "wan.pth"
    torch.save(wan21_state, path)
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(vae.CheckpointError, match="truncated or corrupt: download it again"):
        vae.load(path)


@pytest.mark.parametrize("zipfile", [True, False], ids=["zip", "legacy"])
def test_pickle_checkpoints_load_the_same_model(zipfile, tmp_path, wan21_state, wan21):
    """Both torch.save formats: the structure is read without the weights (mmap), then loaded with
    weights_only=True; the model equals the safetensors one."""
    path = tmp_path / "wan.ckpt"
    torch.save({"state_dict": wan21_state}, path, _use_new_zipfile_serialization=zipfile)
    shapes, _ = vae.loading.read_shapes(path)
    assert all(t.device.type == "meta" for t in shapes.values()) and len(shapes) == len(wan21_state)
    loaded = vae.load(path)
    z = torch.randn(1, 16, 2, 3, 2, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(vae.decode(loaded, z), vae.decode(wan21, z), atol=0, rtol=0)


def test_vae_inside_a_full_checkpoint_is_found(wan21_state, wan21):
    """A checkpoint bundling the VAE under `first_stage_model.` next to other weights (ComfyUI's
    full-checkpoint layout) loads its VAE part."""
    bundled = {f"first_stage_model.{k}": v for k, v in wan21_state.items()}
    bundled["model.diffusion_model.out.weight"] = torch.zeros(4, 4)
    bundled["cond_stage_model.transformer.shared.weight"] = torch.zeros(4, 4)
    loaded = vae.load(bundled)
    assert loaded.family == "wan21"
    for k, v in wan21.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_incomplete_checkpoint_names_the_missing_key():
    """A key the config is read from (not one of the family's probe keys) is missing: a CheckpointError
    naming it, not a KeyError from deep inside."""
    partial = {k: v for k, v in tensors("seedvr2", "tiny_vae.safetensors").items() if k != "encoder.conv_in.weight"}
    with pytest.raises(vae.CheckpointError, match=r"seedvr2 VAE layout; missing: encoder\.conv_in\.weight.*download it again"):
        vae.load(partial, config={"norm_num_groups": 8})


def test_empty_checkpoint_is_not_mistaken_for_a_model(tmp_path):
    path = tmp_path / "empty.safetensors"
    vae.save_checkpoint({}, path)
    with pytest.raises(vae.CheckpointError, match="holds no tensors"):
        vae.load(path)


def test_broken_config_metadata_is_reported(tmp_path, wan21_state):
    from safetensors.torch import save_file

    path = tmp_path / "meta.safetensors"
    save_file(wan21_state, str(path), metadata={vae.loading.CONFIG_METADATA_KEY: "{not json"})
    with pytest.raises(vae.CheckpointError, match="streamvae_config metadata is not valid JSON"):
        vae.load(path)


# -- IMAGE inputs ---------------------------------------------------------------------------------------


def frames(n=3, h=5, w=7, c=3, seed=0):
    return torch.rand(n, h, w, c, generator=torch.Generator().manual_seed(seed))


def test_alpha_channel_is_dropped_and_said():
    rgba = frames(c=4)
    image, notes = images.check_image(rgba)
    assert torch.equal(image, rgba[..., :3])
    assert len(notes) == 1 and "alpha dropped" in notes[0]


@pytest.mark.parametrize("channels", [1, 2])
def test_grayscale_is_copied_to_rgb_and_said(channels):
    gray = frames(c=channels)
    image, notes = images.check_image(gray)
    assert image.shape == (3, 5, 7, 3)
    for c in range(3):
        assert torch.equal(image[..., c], gray[..., 0])
    assert any("grayscale" in n for n in notes) and (channels == 1 or any("alpha" in n for n in notes))


def test_uint8_image_is_scaled_to_0_1():
    pixels = (frames() * 255).round().to(torch.uint8)
    image, notes = images.check_image(pixels)
    assert image.dtype == torch.float32 and torch.equal(image, pixels.float() / 255)
    assert notes == ["8-bit IMAGE: values divided by 255"]


@pytest.mark.parametrize("image, message", [
    (torch.zeros(0, 8, 8, 3), "IMAGE is empty"),
    (torch.zeros(2, 0, 8, 3), "IMAGE is empty"),
    (torch.zeros(8, 8, 3), "must be 4-D"),
    (torch.zeros(2, 3, 16, 16), "looks channels-first"),
    (torch.zeros(2, 8, 8, 3, dtype=torch.int32), "int32; StreamVAE needs floats in 0..1"),
    (torch.full((2, 8, 8, 3), 200.0), "divide by 255"),
    (torch.full((2, 8, 8, 3), -1.0), r"map -1..1 to 0..1"),
], ids=["no_frames", "no_rows", "rank3", "channels_first", "int32", "0_255_floats", "minus1_1_floats"])
def test_unusable_image_is_refused_with_the_fix(image, message):
    with pytest.raises(ValueError, match=message):
        images.check_image(image)


def test_nonfinite_image_names_the_frames():
    image = frames(n=5)
    image[1, 2, 3, 0] = float("nan")
    image[3, 0, 0, 2] = float("inf")
    with pytest.raises(ValueError, match=r"frame\(s\) 1, 3 \(0-based\)"):
        images.check_image(image)


# -- LATENT inputs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("latent, message", [
    ({"samples": torch.zeros(1, 16, 4)}, "must be 5-D"),
    ({"samples": torch.zeros(1, 16, 2, 4, 4, 1)}, "must be 5-D"),
    ({"samples": torch.zeros(1, 16, 0, 4, 4)}, "LATENT is empty"),
    ({"samples": torch.zeros(0, 16, 2, 4, 4)}, "LATENT is empty"),
    ({"samples": torch.zeros(1, 16, 2, 4, 4, dtype=torch.int64)}, "not floats"),
    ({"noise_mask": torch.zeros(1)}, "no 'samples' tensor"),
    ({"samples": torch.zeros(1, 48, 2, 4, 4)}, "Load the VAE that made it"),
], ids=["rank3", "rank6", "no_frames", "no_batch", "int64", "no_samples", "other_family"])
def test_unusable_latent_is_refused_with_the_fix(latent, message, wan21):
    with pytest.raises(ValueError, match=message):
        latents.read_latent(latent, wan21)


def test_stale_latent_metadata_is_ignored_not_applied(wan21):
    """Frame counts/sizes from Encode that no longer fit the latent (it was cut or resized on the way)
    must not trim the wrong frames: Decode then returns everything."""
    latent = latents.make_latent(torch.zeros(1, 16, 3, 4, 4), [30], (100, 100))
    clips = latents.read_latent(latent, wan21)
    assert clips.frames == [9] and clips.size is None


def test_every_latent_layout_reads_as_the_same_clip():
    """Core's B,C,T,H,W, channels-last B,T,H,W,C and SeedVR2's folded B,16*T,H,W are the same latent;
    which one was read is reported. A SeedVR2 LATENT is core's (raw * 0.9152), a Wan LATENT raw."""
    seedvr2, wan21 = load_tiny("seedvr2"), load_tiny("wan21")
    core = torch.randn(2, 16, 3, 4, 5, generator=torch.Generator().manual_seed(3))
    layouts = {latents.CORE_LAYOUT: core, latents.CHANNELS_LAST_LAYOUT: core.permute(0, 2, 3, 4, 1),
               latents.FOLDED_LAYOUT: core.reshape(2, 48, 4, 5)}
    for layout, samples in layouts.items():
        clips = latents.read_latent({"samples": samples}, seedvr2)
        assert clips.layout == layout and clips.frames == [9, 9]
        torch.testing.assert_close(clips.samples, core / 0.9152, rtol=0, atol=0)
    wan = latents.read_latent({"samples": core.permute(0, 2, 3, 4, 1).half()}, wan21)
    assert wan.layout == latents.CHANNELS_LAST_LAYOUT and wan.samples.dtype == torch.float32
    torch.testing.assert_close(wan.samples, core.half().float(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="48 channels"):  # folding is SeedVR2's, never a Wan guess
        latents.read_latent({"samples": core.reshape(2, 48, 4, 5)}, wan21)
    # dim 1 wins when the last dim has the channel count too: read as core's layout, and said so
    square = latents.read_latent({"samples": torch.zeros(1, 16, 2, 3, 16)}, wan21)
    assert square.layout == latents.CORE_LAYOUT and square.samples.shape == (1, 16, 2, 3, 16)


@pytest.mark.parametrize("family", ["wan21", "wan22"])
def test_wanvideowrapper_latents_read_as_the_raw_latent_they_came_from(family):
    """WanVideoWrapper's sampler hands out (raw - mean) / std per channel, with keys of its own, and its
    WanVideoLatentReScale turns that into core's raw latent and keeps the keys. Both, and core's own,
    read as the same raw latent; only the normalized one is converted, and the report says so."""
    model = load_tiny(family)
    g = torch.Generator().manual_seed(7)
    c = model.latent_channels
    # A clip's channels sit near Wan's data-set statistics, not on them: means off by up to 0.2 std,
    # spreads by up to 20 %.
    shift, scale = (torch.rand(1, c, 1, 1, 1, generator=g) * 2 - 1) * 0.2, 1 + (torch.rand(1, c, 1, 1, 1, generator=g) * 2 - 1) * 0.2
    raw = model.from_model_space(torch.randn(1, c, 3, 6, 8, generator=g) * scale + shift)
    keys = {"looped": False, "end_image": None, "has_ref": False, "drop_last": False}  # the sampler's LATENT
    normalized = latents.read_latent({"samples": model.to_model_space(raw), **keys}, model)
    rescaled = latents.read_latent({"samples": raw.clone(), **keys}, model)  # after wrapper_to_comfy
    core = latents.read_latent({"samples": raw.clone()}, model)
    for clips in (normalized, rescaled, core):
        assert_exact(clips.samples, raw, rtol=1e-5, atol=1e-5)
    assert "WanVideoWrapper" in normalized.notes[0] and rescaled.notes == core.notes == []
    # Save Latent / Load Latent drops the keys: latent_source says where it came from
    keyless = latents.read_latent({"samples": model.to_model_space(raw)}, model, "WanVideoWrapper")
    assert_exact(keyless.samples, raw, rtol=1e-5, atol=1e-5)
    assert latents.read_latent({"samples": raw.clone(), **keys}, model, "core").notes == []
    # values that fit neither space clearly (an empty latent with the keys) are refused with the fix
    with pytest.raises(ValueError, match="latent_source to WanVideoWrapper"):
        latents.read_latent({"samples": torch.zeros(1, c, 3, 6, 8), **keys}, model)


# -- tiling values ComfyUI does not range-check once a node validates them -------------------------------


@pytest.mark.parametrize("values, message", [
    ({"tile_size": -8}, "between 0 (automatic) and 8192"),
    ({"tile_size": 100_000}, "between 0 (automatic) and 8192"),
    ({"tile_size": 8}, "is below 16 px"),
    ({"tile_size": 256, "tile_overlap": 300, "tiling": "fast"}, "must be smaller than tile_size"),
    ({"tile_overlap": 100_000}, "between 0 and 4096"),
    ({"temporal_chunk": -1}, "0 (automatic) or 1 to 4096"),
    ({"temporal_chunk": 10**9}, "0 (automatic) or 1 to 4096"),
    ({"memory_budget_gb": float("nan")}, "memory_budget_gb must be 0"),
    ({"memory_budget_gb": float("inf")}, "memory_budget_gb must be 0"),
    ({"memory_budget_gb": 5000.0}, "up to 1024"),
    ({"memory_budget_gb": "abc"}, "memory_budget_gb must be a number; got 'abc' (str)"),  # API JSON, a link
    ({"tile_size": 64.5}, "tile_size must be a whole number; got 64.5 (float)"),
    ({"temporal_chunk": True}, "temporal_chunk must be a whole number; got True (bool)"),
])
def test_absurd_tiling_values_are_refused(values, message):
    error = run_settings.check_tiling(**values)
    assert error is not None and message in error, error
    assert run_settings.check_tiling(tile_size=256, tile_overlap=64, temporal_chunk=4, memory_budget_gb=8.0) is None


@pytest.mark.parametrize("tile", [16, 24, 32, 64])
def test_small_exact_tiles_take_the_default_overlap_they_do_not_use(tile, wan21):
    """tile_size 16-64 with the nodes' default overlap of 64: refused before, though exact tiles do not
    use the overlap; now they run, and equal the untiled decode. Fast tiles blend over it: refused."""
    assert run_settings.check_tiling(tile_size=tile, tile_overlap=64, tiling="exact") is None
    assert "must be smaller than tile_size" in run_settings.check_tiling(tile_size=tile, tile_overlap=64, tiling="fast")
    assert run_settings.check_tile_size(tile) is None  # the queue-time check
    z = torch.randn(1, 16, 2, 8, 8, generator=torch.Generator().manual_seed(tile))
    tiled = vae.decode(wan21, z, run_settings.settings_from_inputs(tile_size=tile, tile_overlap=64))
    assert_exact(tiled, vae.decode(wan21, z))


def test_the_queue_time_check_takes_one_input_and_any_type():
    """ComfyUI shows a validate_inputs error on every input the function takes: the nodes' take tile_size
    alone (ComfyUI range-checks the others on their own widgets), and a value of another type gets the
    node's message, not Python's."""
    assert run_settings.check_tile_size("abc") == "tile_size must be a whole number; got 'abc' (str)."
    assert "is below 16 px" in run_settings.check_tile_size(8) and run_settings.check_tile_size(0) is None
    for node in ("decode", "encode", "video_output", "video_input", "core_vae"):
        source = (REPO / "nodes" / f"{node}.py").read_text()
        assert "def validate_inputs(cls, tile_size=None)" in source, node


def test_a_tiny_budget_is_refused_with_its_floor_in_the_surfaces_words(wan21):
    """1e-12 GiB is not 0 (automatic) on a node; it is a budget of one byte, refused with the GiB it needs
    and what 0 means there. The library says it in bytes and None."""
    settings = run_settings.settings_from_inputs(memory_budget_gb=1e-12)
    assert settings.memory_budget == 1
    z = torch.zeros(1, 16, 2, 4, 4)
    with pytest.raises(vae.run.planning.BudgetTooSmall) as refused:
        vae.decode(wan21, z, settings)
    library = str(refused.value)
    assert "memory budget of 9.31e-10 GiB" in library and "or None for no limit" in library, library
    assert re.search(r"set memory_budget to at least [\d.]+ GiB \(\d+ bytes\)", library), library
    node = refused.value.plan.below_floor("memory_budget_gb", "0 for automatic (what is free)", in_bytes=False)
    assert re.search(r"set memory_budget_gb to at least [\d.]+ GiB, or 0 for automatic", node) and "bytes" not in node


# -- pixels the library encodes -------------------------------------------------------------------------------


def test_encode_refuses_nonfinite_pixels_naming_the_frames(wan21):
    video = torch.rand(1, 3, 9, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    video[0, 1, 2, 3, 4] = float("nan")
    video[0, 0, 7, 0, 0] = float("-inf")
    with pytest.raises(ValueError, match=r"NaN/Inf pixels in frame\(s\) 2, 7 \(0-based\)"):
        vae.encode(wan21, video)


@pytest.mark.parametrize("scale, message", [(255, r"range from 0 to 255: 0..255 values: x / 127.5 - 1"),
                                            (1.01, r"range from -1.01 to 1.01: clamp to \[-1, 1\] first")])
def test_encode_refuses_pixels_outside_minus_one_to_one(scale, message, wan21):
    """0..255 frames, or frames past [-1, 1] by more than rounding, would encode to a wrong latent
    without a word; the message says the range encode expects. Rounding past it is accepted."""
    unit = torch.linspace(-1, 1, 9 * 16 * 16 * 3).reshape(1, 3, 9, 16, 16)
    pixels = (unit + 1) * 127.5 if scale == 255 else unit * scale
    with pytest.raises(ValueError, match=r"encode takes pixels in \[-1, 1\].*" + message):
        vae.encode(wan21, pixels)
    assert_exact(vae.encode(wan21, unit * (1 + 5e-4)), vae.encode(wan21, (unit * (1 + 5e-4)).clamp(-1, 1)), 1e-3)


def test_a_filters_overshoot_is_clamped_and_said_not_refused():
    """Resize filters overshoot 0..1 a little; core's VAE Encode takes that as it is, the library refuses
    it, so the nodes clamp it to 0..1 and say so."""
    image = frames()
    image[0, 0, 0, 0], image[1, 0, 0, 1] = 1.03, -0.02
    checked, notes = images.check_image(image)
    assert notes == ["IMAGE values range from -0.02 to 1.03 (a filter's overshoot): clamped to 0..1"]
    video = images.clip_video(checked, (0, 3), 3)
    assert float(video.max()) == 1 and float(video.min()) == -1
    assert torch.equal(video, images.clip_video(image.clamp(0, 1), (0, 3), 3))


def test_run_warnings_reach_the_report_once(wan21, recwarn):
    """nonfinite="zero" logs a warning and raises it as a Python warning; a front end collecting the run's
    warnings gets it once, as text, and the Python warning is not printed a second time."""
    z = torch.randn(1, 16, 3, 2, 2, generator=torch.Generator().manual_seed(1))
    z[0, 0, 1] = float("nan")
    with collected() as notes:
        vae.decode(wan21, z, nonfinite="zero")
    assert notes == ["latent frame(s) [1] have NaN/Inf values; decoding with them set to 0"]
    assert not [w for w in recwarn if "NaN/Inf" in str(w.message)], "said again as a Python warning"


# -- plans: the caller's tiles are a limit, not a reason to leave memory ------------------------------------


@pytest.mark.parametrize("tile, overlap", [(17, 3), (16, 15), (24, 0)])
def test_small_user_tiles_run_in_memory_when_it_is_ample(tile, overlap):
    """The issue's case: Wan2.1 at 128x128, 9 frames, an odd small tile and memory_budget auto with GiB
    free. The plan was one frame at a time with the caches on disk (113-263 s against 9.7 s untiled);
    with the untiled plan fitting, the tiles run whole chunks with the caches in memory (bench_user_tiles:
    within 3x the untiled time)."""
    model = models.meta_model("wan21")
    shape = (1, 16, 3, 16, 16)
    budget = 8 * 2**30
    untiled = vae.plan(model, "decode", shape, vae.Settings(memory_budget=budget), device="cpu")
    assert untiled.fits and untiled.tile_size is None
    plan = vae.plan(model, "decode", shape, vae.Settings(tile_size=tile, tile_overlap=overlap, memory_budget=budget),
                    device="cpu")
    assert plan.fits and not plan.frames_streamed and plan.cache_offload == "none", plan.describe()
    assert plan.tile_size == (tile, tile) and plan.temporal_chunk == 3, plan.describe()


# -- node messages --------------------------------------------------------------------------------------------


def test_an_image_models_latent_is_named_as_one(wan21):
    with pytest.raises(ValueError, match=r"4 channels and one frame: an image model's latent \(SD 1.x / SD 2.x / SDXL\)"):
        latents.read_latent({"samples": torch.zeros(1, 4, 8, 8)}, wan21)


# -- the fault hook the server tests and bench/soak.py inject with (tests/comfy_support/faults.py) -------------------------------------------


def test_fault_hook_is_one_shot_and_inert_without_the_variable(tmp_path, monkeypatch, wan21):
    path = tmp_path / "faults.json"
    path.write_text(json.dumps({"op": "decode", "oom_at_call": 1, "times": 2}))
    monkeypatch.delenv(faults.ENV, raising=False)
    with faults.injected(wan21, "decode"):  # no variable: nothing happens, the file stays
        vae.decode(wan21, torch.zeros(1, 16, 1, 2, 2))
    assert path.exists()
    monkeypatch.setenv(faults.ENV, str(path))
    with faults.injected(wan21, "encode"):  # another op: left for the decode
        vae.encode(wan21, torch.zeros(1, 3, 1, 8, 8))
    with pytest.raises(torch.OutOfMemoryError, match="injected"), faults.injected(wan21, "decode"):
        # one 16 px frame, caches kept on the device: its one smaller setting (frames streamed) fails too
        vae.decode(wan21, torch.zeros(1, 16, 1, 2, 2), vae.Settings(cache_offload="none"))
    assert not path.exists()
    with faults.injected(wan21, "decode"):  # consumed: the next run is clean
        vae.decode(wan21, torch.zeros(1, 16, 1, 2, 2))
    assert not any(m._forward_pre_hooks for m in wan21.modules())
