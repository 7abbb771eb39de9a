"""The contract every registered family passes, run over the registry (`vae.families.SPECS`), so a new family
gets it by registering:
- its tiny model as a real safetensors file in its key layout (the upstream fixture's checkpoint, or one
  written from its tiny config with seeded random weights) loads, is detected as this family (no family
  before it in the registry claims it) and gives its weights back;
- its spec is complete and agrees with its network: the released and the tiny network's factors and latent
  channels, the capabilities the engine derives from the modules, the load choices (config values, the
  config's default first), its memory calibration, its bench workloads (clips its frame rule allows), and
  core's module for its VAE (one the benchmarks can build);
- temporal chunks, exact tiles and frames streamed (every conv tiled, caches on disk) equal the whole clip,
  encode and decode, within 1e-5 x max(1, |ref|);
- it is compared with a reference (upstream's outputs, diffusers', or core's) by a test of its own
  (`REFERENCES`: their parity tests are slow, so they are not repeated here).
"""
import ast
import dataclasses
import json

import pytest
import torch

import vae
from bench import models
from bench.core_vae import BUILDS
from reference import REPO, assert_exact, tiny_checkpoint
from vae import families
from vae.kernels import Optimizations
from vae.model.family_spec import Capability, LoadChoice
from vae.model.video_vae import ClipExtent
from vae.run import memory
from vae.run.clip_statistics import clip_norm_count
from vae.run.geometry import min_tile

SPECS = {spec.name: spec for spec in families.SPECS}
# The test that compares each family with a reference implementation, within 1e-4 x max(1, |ref|).
REFERENCES = {
    "seedvr2": "test_seedvr2.py::test_decode_matches_reference",  # upstream's outputs
    "wan21": "test_wan.py::test_output_matches_upstream",  # upstream's outputs
    "wan22": "test_wan.py::test_output_matches_upstream",
    "qwen21": "test_wan_variants.py::test_decode_matches_diffusers",  # diffusers' AutoencoderKLQwenImage21
    "ltx2": "test_ltx2.py::test_decode_matches_diffusers",  # diffusers' AutoencoderKLLTX2Video
    "ltx25": "test_ltx25_core.py::test_decode_matches_core",  # core 0.33.0's CausalDiffusionVAE
    "hv10": "test_hv10.py::test_decode_matches_diffusers",  # diffusers' AutoencoderKLHunyuanVideo
    "hv15": "test_hv15.py::test_decode_matches_diffusers",  # diffusers' AutoencoderKLHunyuanVideo15
    "minimax_h3": "test_minimax_h3_core.py::test_matches_core",  # core 0.33.0's MiniMaxH3VideoVAE
}
# The kernels' default rules (no timing of every tile's conv shapes), every conv tiled however small its frame
# (`Optimizations.whole_frame_small_convs`).
OPTS = Optimizations(kernel_choice="defaults").with_(whole_frame_small_convs=False)
LATENT = (3, 3, 2)  # latent frames, rows, columns of the clips below


@pytest.fixture(scope="module", params=list(SPECS))
def family(request, tmp_path_factory):
    """(spec, the tiny model's safetensors file, the model loaded from it)."""
    spec = SPECS[request.param]
    if spec.tiny.fixture_config is not None:
        path = tiny_checkpoint(spec.name)
    else:
        config, state = models.weights(spec.name, tiny=True)
        path = tmp_path_factory.mktemp(spec.name) / "tiny.safetensors"
        vae.save_checkpoint(state, path)
    return spec, path, vae.load(path, config=spec.tiny.fixture_config)


def test_its_checkpoint_loads_and_is_detected_as_it(family):
    spec, path, model = family
    state, _ = vae.read_checkpoint(path)
    cls, native = vae.detect_family(state)
    assert cls is spec.vae_class and type(model) is spec.vae_class and families.spec(model.family) is spec
    if spec.tiny.config is not None:
        assert model.config == spec.tiny.config
    loaded = model.state_dict()
    assert native.keys() == loaded.keys() and all(torch.equal(native[k].float(), loaded[k]) for k in native)


def test_the_spec_is_complete():
    assert families.NAMES == tuple(SPECS) and len(set(families.NAMES)) == len(families.NAMES)
    for spec in families.SPECS:
        assert spec.display_name and spec.download and spec.fps > 0, spec.name
        assert (spec.tiny.fixture_config is None) != (spec.tiny.config is None), spec.name  # one tiny model
        assert spec.tiny.config is None or isinstance(spec.tiny.config, spec.config_class), spec.name
        assert families.spec(spec.name) is spec
    with pytest.raises(KeyError, match="the families are seedvr2"):
        families.spec("no_such_family")


def _capabilities(model) -> set:
    """What the engine derives from `model`'s modules (the `VideoVAE` methods each `Capability` names)."""
    found = set()
    for op in ("encode", "decode"):
        found |= {Capability.LOOKAHEAD} if model.looks_ahead(op) else set()
        found |= {Capability.KV_CACHE} if model.attention_cache_elements(op, 1, 1, (1, 1)) else set()
        found |= {Capability.PREFILL} if model.prefill_stages(op) else set()
        found |= {Capability.WHOLE_CLIP} if model.clip_extent(op) is ClipExtent.WHOLE_CLIP else set()
        found |= {Capability.UNTILED_CHUNKS} if model.clip_extent(op) is ClipExtent.UNTILED_CHUNKS else set()
        found |= {Capability.OWN_TILES} if model.clip_extent(op) is ClipExtent.OWN_TILES else set()
        modules = model.decode_modules() if op == "decode" else model.encode_modules()
        if clip_norm_count(modules):  # norms over the whole clip: chunks only after their statistics, or none
            found.add(Capability.CLIP_STATISTICS)
            assert model.clip_extent(op) in (ClipExtent.CHUNKS_AFTER_STATISTICS, ClipExtent.WHOLE_CLIP), model.family
        else:
            assert not model.clip_extent(op).gathers_statistics, model.family
    return found


def test_the_spec_agrees_with_the_network(family):
    """The released network (on the meta device) and the tiny one have the spec's factors; the released one its
    latent channels; under every load choice the modules ask the engine for exactly the declared capabilities;
    the memory model is calibrated for it on the CPU; core's module for it is one the benchmarks can build."""
    spec, _, model = family
    released = models.meta_model(spec.name)
    for network in (released, model):
        assert (network.spatial_factor, network.temporal_factor) == (spec.spatial_factor, spec.temporal_factor)
    assert released.latent_channels == spec.latent_channels
    variants = [{}] + [{choice.field: value} for choice in spec.load_choices for value in _offered(choice)]
    with torch.device("meta"):
        found = set().union(*(_capabilities(spec.vae_class(dataclasses.replace(spec.config_class(), **change)))
                              for change in variants))
    assert found == spec.capabilities
    calibration = memory.calibration_path(spec.name)  # in the family's folder
    assert "cpu" in json.loads(calibration.read_text())
    assert all(model.memory_calibration(op)[0] == spec.name for op in ("encode", "decode"))
    assert spec.core is None or spec.core.module in BUILDS


def _offered(choice) -> tuple:
    """The values a front end offers for a load choice: each of a `LoadChoice`'s, a `LoadInteger`'s bounds."""
    return choice.values if isinstance(choice, LoadChoice) else (choice.minimum, choice.maximum)


def test_load_choices_are_config_values_the_default_first(family):
    """What a front end offers (Load VAE's input of each choice, in the order the families declared them) is what
    `vae.load(config=)` takes: the config's default (a list's first value, within a number's bounds), every
    value offered, each input name taken once among the families."""
    spec, path, _ = family
    assert (spec in families.CHOOSING) is bool(spec.load_choices)  # offered, after the families declared before it
    for choice in spec.load_choices:
        assert getattr(spec.config_class(), choice.field) == choice.default
        if isinstance(choice, LoadChoice):
            assert choice.default == choice.values[0]
        else:
            assert choice.minimum <= choice.default <= choice.maximum
        assert [c.input for c in families.load_choices()].count(choice.input) == 1
        # the frontend gives an input so named a "randomize after each run" widget (an extra widget value)
        assert choice.input not in ("seed", "noise_seed"), f"{choice.input}: name it otherwise (e.g. decode_seed)"
        for value in _offered(choice):
            assert getattr(vae.load(path, config={choice.field: value}).config, choice.field) == value


def test_bench_workloads_follow_the_frame_rule(family):
    spec = family[0]
    bench = spec.bench
    clips = [*bench.gpu, *([bench.dry] if bench.dry else []), *(row.clip for row in bench.cards),
             *(time.clip for time in bench.one_gpu)]
    assert all(clip.frames % spec.temporal_factor == 1 % spec.temporal_factor for clip in clips), clips
    assert all(row.op in ("encode", "decode") for row in bench.cards)


def _clips(model) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixels, latent) of LATENT's size: seeded, pixels in [-1, 1]."""
    t, h, w = LATENT
    g = torch.Generator().manual_seed(54)
    frames = (t - 1) * model.temporal_factor + 1
    video = torch.rand(1, model.in_channels, frames, h * model.spatial_factor, w * model.spatial_factor, generator=g)
    return video * 2 - 1, torch.randn(1, model.latent_channels, t, h, w, generator=g)


def _partition(model, op: str, x, settings) -> tuple:
    """How the plan for `settings` cuts the clip: (temporal chunk, tile, frames streamed)."""
    planned = vae.plan(model, op, x.shape, settings, opts=OPTS)
    return planned.temporal_chunk, planned.tile_size, planned.frames_streamed


@pytest.mark.parametrize("op", ["decode", "encode"])
def test_chunks_tiles_and_streamed_frames_equal_the_whole_clip(family, op):
    """Each partition the settings below ask for, as far as the op's `clip_extent` allows them (one its plan set
    aside into a partition already run is not run again), equals the whole clip."""
    spec, _, model = family
    x = _clips(model)[0 if op == "encode" else 1]
    run = vae.decode if op == "decode" else vae.encode
    whole_clip = vae.Settings(temporal_chunk=LATENT[0])
    whole, ran = run(model, x, whole_clip, opts=OPTS), {_partition(model, op, x, whole_clip)}
    tile = min_tile(model.spatial_factor)
    for settings in (vae.Settings(temporal_chunk=1), vae.Settings(temporal_chunk=2, tile_size=tile),
                     vae.Settings(temporal_chunk=1, stream_frames=True, tile_size=tile, cache_offload="disk")):
        if _partition(model, op, x, settings) not in ran:
            ran.add(_partition(model, op, x, settings))
            assert_exact(run(model, x, settings, opts=OPTS), whole, msg=lambda m, s=settings: f"{s}: {m}")
    assert len(ran) > 1 or not model.clip_extent(op).tiled  # at least the whole clip in tiles


def test_every_family_is_compared_with_a_reference():
    """Each registered family names its parity test (`REFERENCES`), and that test exists."""
    assert REFERENCES.keys() == SPECS.keys()
    for target in REFERENCES.values():
        file, name = target.split("::")
        tree = ast.parse((REPO / "tests" / file).read_text())
        assert name in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}, target
