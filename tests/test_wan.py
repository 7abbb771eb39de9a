"""Wan2.1 / Wan2.2: checkpoint-exact against the upstream fixtures, full layouts, key naming,
storage dtypes, and every optimization switch on a streamed clip (that any temporal chunking equals one
whole-clip pass, and that no other family claims their checkpoints: test_families.py)."""
import dataclasses
import os
import sys

import pytest
import torch

import vae
from vae.kernels import Optimizations
from tests.reference import assert_exact, load_tiny, magnitude, manifest, tensors
from vae.loading import CheckpointError, detect_family, save_checkpoint

FAMILIES = {"wan21": vae.Wan21VAE, "wan22": vae.Wan22VAE}
CONFIGS = {"wan21": vae.Wan21Config, "wan22": vae.Wan22Config}
SWITCHES = [f.name for f in dataclasses.fields(Optimizations) if isinstance(f.default, bool)]


def assert_matches_fixture(actual, expected):
    """The fixture README's float32 tolerance: atol 1e-4 * max(1, max |ref|) (observed noise ~1e-6)."""
    assert actual.shape == expected.shape
    assert_exact(actual, expected, rtol=0, atol=1e-4)


def assert_same_result(actual, expected, atol=1e-5):
    """Two computations of the same thing (other chunking / code path): float32 rounding only."""
    assert actual.shape == expected.shape
    assert_exact(actual, expected, rtol=0, atol=atol)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def model(family):
    return load_tiny(family)


@pytest.fixture(scope="module")
def ref(family):
    return tensors(family, "reference_io.safetensors")


@pytest.fixture(scope="module")
def clip():
    """19 frames (padded to 21 = 1 + 4*5) of odd size 21x27 (padded to the spatial factor)."""
    return torch.rand(1, 3, 19, 21, 27, generator=torch.Generator().manual_seed(7)) * 2 - 1


def run_all(model, ref, opts=None) -> dict:
    """Every fixture output, computed by `model` the way a user would (with `opts`, default all on)."""
    mu = vae.encode(model, ref["video_in"], opts=opts)
    return {
        "enc_mu_raw": mu,
        "enc_mu_norm": model.to_model_space(mu),
        "dec_out": vae.decode(model, ref["dec_in_z_raw"], opts=opts),
        "dec_out_via_norm": vae.decode(model, model.from_model_space(ref["dec_in_z_norm"]), opts=opts),
        "image_enc_mu_raw": vae.encode(model, ref["image_in"], opts=opts),
        "image_dec_out": vae.decode(model, ref["image_dec_in_z_raw"], opts=opts),
    }


@pytest.fixture(scope="module")
def outputs(model, ref):
    return run_all(model, ref)


# --- exactness against upstream --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["enc_mu_raw", "enc_mu_norm", "dec_out", "dec_out_via_norm", "image_enc_mu_raw", "image_dec_out"])
def test_output_matches_upstream(outputs, ref, name):
    assert_matches_fixture(outputs[name], ref["dec_out" if name == "dec_out_via_norm" else name])


def test_model_space_constants(model, ref):
    assert model.latent_channels == ref["latents_mean"].numel()
    assert_same_result(torch.tensor(model.latents_mean), ref["latents_mean"], atol=0)
    assert_same_result(torch.tensor(model.latents_std), ref["latents_std"], atol=0)
    assert_matches_fixture(model.from_model_space(ref["enc_mu_norm"]), ref["enc_mu_raw"])
    assert_matches_fixture(model.from_model_space(ref["dec_in_z_norm"]), ref["dec_in_z_raw"])


def test_4d_image_api(model, ref, outputs):
    image = ref["image_in"][:, :, 0]  # B,3,H,W
    latent = vae.encode(model, image)
    assert latent.shape == ref["image_enc_mu_raw"][:, :, 0].shape
    assert_same_result(latent, outputs["image_enc_mu_raw"][:, :, 0])
    assert_same_result(vae.decode(model, ref["image_dec_in_z_raw"][:, :, 0]), outputs["image_dec_out"][:, :, 0])


def test_straightforward_path_equals_optimized(family, outputs, ref):
    """Every switch off (upstream's data movement), one latent frame per step like upstream."""
    for name, value in run_all(load_tiny(family), ref, Optimizations.straightforward()).items():
        assert_same_result(value, outputs[name])


# --- layouts, detection, storage ------------------------------------------------------------------

def test_full_config_reproduces_release_manifest(family):
    released = manifest(family)
    cls, cfg = FAMILIES[family], CONFIGS[family]()
    assert cfg.dim == released["constructor_kwargs"]["dim"] and cfg.z_dim == released["constructor_kwargs"]["z_dim"]
    with torch.device("meta"):
        full = cls(cfg)
    layout = {k: list(v.shape) for k, v in full.state_dict().items()}
    assert len(layout) == {"wan21": 194, "wan22": 196}[family] == released["num_tensors"]
    assert layout == released["tensors"]
    assert sum(v.numel() for v in full.state_dict().values()) == released["num_params"]
    assert sum(p.numel() for p in full.encoder.parameters()) == released["encoder_params"]
    assert sum(p.numel() for p in full.decoder.parameters()) == released["decoder_params"]


def _meta_state_dict(shapes: dict) -> dict:
    return {k: torch.empty(shape, device="meta") for k, shape in shapes.items()}


@pytest.mark.parametrize("naming", ["native", "diffusers"])
def test_release_layout_is_detected_with_its_config(family, naming):
    released = manifest(family)
    shapes = released["tensors"]
    if naming == "diffusers":
        shapes = {released["diffusers_keys"][k]: v for k, v in shapes.items()}
    cls, native = detect_family(_meta_state_dict(shapes))
    assert cls is FAMILIES[family]
    assert {k: list(v.shape) for k, v in native.items()} == released["tensors"]
    assert cls.config_from_state_dict(native, {}) == CONFIGS[family]()


def test_diffusers_named_checkpoint_loads_the_same_model(family, model, ref, outputs):
    diffusers_keys = manifest(family)["diffusers_keys"]  # upstream name -> AutoencoderKLWan name
    native = tensors(family, "tiny_vae.safetensors")
    renamed = {diffusers_keys[k]: v for k, v in native.items()}
    assert not set(renamed) & set(native) - {"decoder.head.0.gamma"}  # really another naming
    loaded = vae.load(renamed)
    assert type(loaded) is FAMILIES[family] and loaded.config == model.config
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert_same_result(vae.decode(loaded, ref["image_dec_in_z_raw"]), outputs["image_dec_out"], atol=0)


def test_unknown_checkpoint_lists_families_and_missing_keys():
    with pytest.raises(CheckpointError) as err:
        detect_family({"decoder.middle.0.residual.0.gamma": torch.ones(4, 1, 1, 1), "foo.weight": torch.ones(1)})
    message = str(err.value)
    for cls in FAMILIES.values():
        assert f"{cls.family}: missing" in message
        assert cls.probe_keys[1] in message  # the layout-specific key is named as missing


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float8_e4m3fn])
def test_half_and_fp8_storage_loads_with_float32_compute(family, ref, tmp_path, dtype):
    stored = {k: v.to(dtype) for k, v in tensors(family, "tiny_vae.safetensors").items()}
    path = tmp_path / "vae.safetensors"
    save_checkpoint(stored, path)
    loaded = vae.load(path)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    for k, v in stored.items():
        assert torch.equal(loaded.state_dict()[k], v.float()), k  # exact upcast of what is stored
    upcast = vae.load({k: v.float() for k, v in stored.items()})
    image = vae.decode(loaded, ref["image_dec_in_z_raw"])
    assert_same_result(image, vae.decode(upcast, ref["image_dec_in_z_raw"]), atol=0)
    # Sanity only: rounding the weights to 16 / 8 bits moves the output by ~1e-3 / ~1e-2 / ~0.5.
    bound = {torch.float16: 0.02, torch.bfloat16: 0.1, torch.float8_e4m3fn: 2.0}[dtype]
    assert (image - ref["image_dec_out"]).abs().max() < bound * magnitude(ref["image_dec_out"])


def test_bf16_compute_decodes_close_to_float32(family, ref):
    half = load_tiny(family, dtype=torch.bfloat16)
    assert half.decode_dtype == torch.bfloat16
    out = vae.decode(half, ref["dec_in_z_raw"])
    assert (out.float() - ref["dec_out"]).abs().max() < 0.15 * magnitude(ref["dec_out"])  # observed 0.04 / 0.06


# --- streaming ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def whole_clip(model, clip):
    """Encode and decode of `clip` in one temporal chunk each."""
    z = vae.encode(model, clip, vae.Settings(temporal_chunk=1000))
    return z, vae.decode(model, z, vae.Settings(temporal_chunk=1000))


def test_whole_clip_shapes(model, clip, whole_clip):
    z, video = whole_clip
    f = model.spatial_factor
    assert z.shape == (1, model.latent_channels, 6, -(-21 // f), -(-27 // f))
    assert video.shape == (1, 3, 21, z.shape[3] * f, z.shape[4] * f)
    trimmed = vae.decode(model, z, num_frames=19, height=21, width=27)
    assert_same_result(trimmed, video[:, :, :19, :21, :27])


# Switches that cannot act on a tiny model streamed untiled on the CPU: Triton needs CUDA, whole-frame
# small convs need exact tiles. The test checks they do not.
INERT_HERE = {"wan21": {"triton_norm", "whole_frame_small_convs"},
              "wan22": {"triton_norm", "whole_frame_small_convs"}}


def calls_made(fn) -> set[str]:
    """The library functions and the builtins (torch ops among them) that `fn()` calls."""
    seen = set()

    def record(frame, event, arg):
        if event == "call" and f"{os.sep}vae{os.sep}" in frame.f_code.co_filename:
            seen.add(frame.f_code.co_qualname)
        elif event == "c_call":
            seen.add(getattr(arg, "__qualname__", repr(arg)))

    sys.setprofile(record)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("switch", SWITCHES)
def test_each_optimization_switch_keeps_the_streamed_result(family, clip, whole_clip, switch):
    """Off, every switch gives the streamed result; and it changes what runs, so the comparison is not
    of a path with itself (except where it cannot act, INERT_HERE, which is checked too)."""
    z, video = whole_clip
    other, on, off = load_tiny(family), Optimizations(), Optimizations().with_(**{switch: False})

    def run(opts):
        return (vae.encode(other, clip, vae.Settings(temporal_chunk=2), opts=opts),
                vae.decode(other, z, vae.Settings(temporal_chunk=3), opts=opts))

    encoded, decoded = run(off)
    assert_same_result(encoded, z)
    assert_same_result(decoded, video)

    def run_small(opts):  # the same code paths on a small clip in two chunks: the traces are slow
        vae.encode(other, clip[:, :, :5, :32, :32], vae.Settings(temporal_chunk=1), opts=opts)
        vae.decode(other, z[:, :, :2, :2, :2], vae.Settings(temporal_chunk=1), opts=opts)

    run_small(on)  # warm-up: the traces below then see code paths, not first-call work
    run_small(off)
    inert = switch in INERT_HERE[family]
    assert (calls_made(lambda: run_small(on)) == calls_made(lambda: run_small(off))) == inert, (
        f"{switch} {'now acts' if inert else 'changes nothing'} on the tiny {family} model")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("above", [False, True], ids=["vector-norm", "plane-sums"])
def test_cpu_rms_norm_equals_the_reference_formula(dtype, above):
    """The fused RMS norm (+SiLU) on both sides of norm_act.PLANE_SUM_MIN_POSITIONS (positions per
    channel, T*H*W; below: torch's reduction over channels; from it on: channel planes summed one by
    one) against upstream's formula, F.normalize(x, dim=1) * sqrt(C) * gamma, computed in float64."""
    from vae.kernels import norm_act

    positions = norm_act.PLANE_SUM_MIN_POSITIONS * 2 if above else norm_act.PLANE_SUM_MIN_POSITIONS // 2
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 48, 2, positions // 128, 64, generator=g) * 4 + 1).to(dtype)
    gamma = torch.rand(48, 1, 1, 1, generator=g) + 0.5
    expected = torch.nn.functional.silu(torch.nn.functional.normalize(x.double(), dim=1) * 48 ** 0.5 * gamma.double())
    out = norm_act.rms_norm_act(x, gamma)
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    assert_exact(out.double(), expected, atol=tolerance, rtol=tolerance)
