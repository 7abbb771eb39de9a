"""SeedVR2: checkpoint-exact against the upstream fixtures, full layout, every optimization switch."""
import pytest
import torch

import vae
from vae.optimizations import Optimizations
from tests.reference import assert_exact, load_tiny, magnitude, manifest, tensors, tiny_checkpoint

ATOL = RTOL = 1e-4  # the fixture README's tolerance for float32 (observed noise < 1e-5)


@pytest.fixture(scope="module")
def model():
    return load_tiny("seedvr2")


@pytest.fixture(scope="module")
def ref():
    return {**tensors("seedvr2", "tiny_inputs.safetensors"), **tensors("seedvr2", "tiny_outputs.safetensors")}


def assert_close(actual, expected):
    assert_exact(actual, expected, atol=ATOL, rtol=RTOL)


def test_encode_matches_reference(model, ref):
    mean, logvar = vae.encode(model, ref["video"], return_logvar=True)
    assert_close(mean, ref["enc.mean"])
    assert_close(logvar, ref["enc.logvar"])
    assert_close(torch.cat([mean, logvar], 1), ref["enc.moments"].clamp(-30, 20))
    assert_close(model.to_model_space(mean), ref["enc.latent"])


def test_decode_matches_reference(model, ref):
    assert_close(vae.decode(model, ref["dec.input"]), ref["dec.video"])
    assert_close(model.from_model_space(ref["enc.latent"]), ref["dec.input"])


def test_image_path_matches_reference(model, ref):
    latent = vae.encode(model, ref["image"])
    assert latent.shape == (1, 16, 8, 8)
    assert_close(model.to_model_space(latent), ref["img.latent"])
    assert_close(vae.decode(model, model.from_model_space(ref["img.latent"])), ref["img.decoded"])


def test_full_config_reproduces_release_manifest():
    released = manifest("seedvr2")
    cfg = vae.SeedVR2Config(**{k: tuple(v) if isinstance(v, list) else v
                               for k, v in released["model_config"].items() if k in vae.SeedVR2Config.__dataclass_fields__})
    with torch.device("meta"):
        full = vae.SeedVR2VAE(cfg)
    layout = {k: list(v.shape) for k, v in full.state_dict().items()}
    expected = {k: shape for k, (shape, _dtype) in released["tensors"].items()}
    assert len(layout) == 250
    assert layout == expected
    assert sum(v.numel() for v in full.state_dict().values()) == released["num_parameters"]


@pytest.mark.parametrize("name", ["fused_norm_act", "buffered_causal_pad", "sdpa_attention", "native_pixel_shuffle", "inplace_residual"])
def test_each_optimization_switch_keeps_the_output(model, ref, name):
    expected_dec = vae.decode(model, ref["dec.input"], vae.Settings(temporal_chunk=2))
    expected_enc = vae.encode(model, ref["video"], vae.Settings(temporal_chunk=2))
    off = Optimizations().with_(**{name: False})
    assert_exact(vae.decode(model, ref["dec.input"], vae.Settings(temporal_chunk=2), opts=off),
                               expected_dec, atol=2e-5, rtol=0)
    assert_exact(vae.encode(model, ref["video"], vae.Settings(temporal_chunk=2), opts=off), expected_enc,
                               atol=2e-5, rtol=0)


def test_straightforward_path_matches_reference(model, ref):
    plain = Optimizations.straightforward()
    assert_close(vae.decode(model, ref["dec.input"], opts=plain), ref["dec.video"])
    assert_close(vae.encode(model, ref["video"], opts=plain), ref["enc.mean"])


@pytest.mark.parametrize("storage", [torch.float32, torch.bfloat16, torch.float16])
def test_checkpoint_storage_dtypes_load(tmp_path, ref, storage):
    """fp32, bf16 and fp16 files load into float32 compute; the dtype is a separate choice."""
    sd, _ = vae.read_checkpoint(tiny_checkpoint("seedvr2"))  # stored fp16, like ema_vae_fp16
    path = tmp_path / f"seedvr2_{storage}.safetensors"
    vae.save_checkpoint({k: v.to(storage) for k, v in sd.items()}, path, config={"norm_num_groups": 8})
    model = vae.load(path, dtype=torch.float32)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    tol = 1e-4 if storage != torch.bfloat16 else 0.15  # bf16 storage rounds the fp16 weights
    assert_exact(vae.decode(model, ref["dec.input"]), ref["dec.video"], atol=tol, rtol=tol)


def test_bf16_decode_stays_close(ref):
    model = load_tiny("seedvr2", decode_dtype=torch.bfloat16)
    assert model.decode_dtype == torch.bfloat16 and model.encode_dtype == torch.float32
    out = vae.decode(model, ref["dec.input"].float())
    assert out.dtype == torch.float32
    assert (out - ref["dec.video"]).abs().max() < 0.25 * magnitude(ref["dec.video"])
    mse = ((out - ref["dec.video"]) ** 2).mean()
    psnr = 10 * torch.log10(4.0 / mse)  # peak-to-peak 2 for [-1, 1] pixels
    assert psnr > 30


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("view", [False, True], ids=["whole", "tile-view"])
@pytest.mark.parametrize("side, frames", [(256, 2), (16, 100)], ids=["channel-blocks", "frame-blocks"])
def test_cpu_group_norm_equals_torch_in_float64(dtype, view, side, frames):
    """The fused per-frame GroupNorm (+SiLU) on the CPU, whose statistics (and, in half precision, the
    apply step) run in blocks of channel planes (norm_act.CPU_BLOCK_BYTES): large frames in blocks of
    channels of one frame (three full ones and a partial one here), small frames in blocks of several
    whole frames (one full and a partial one); on a whole tensor and on a strided tile view written
    into a buffer view, against F.group_norm per frame in float64. The mean (30) is far above the
    spread, where a one-pass E[x^2] - E[x]^2 in float32 would be wrong in the third digit."""
    from vae.optimizations import norm_act

    planes = norm_act.CPU_BLOCK_BYTES // (4 * side * side)
    channels = 52 if planes < 52 else 48  # 256 px: 16 planes a block; 16 px: 4096 planes, 85 frames of 48
    assert (planes < channels) == (side == 256) and (side == 256 or frames > planes // channels)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(1, channels, frames, side, side + 3, generator=g) * 2 + 30).to(dtype)
    weight, bias = torch.rand(channels, generator=g) + 0.5, torch.randn(channels, generator=g)
    if view:
        x = x[..., 1:-2]  # columns 1..side: not contiguous, as exact tiles are
    out = torch.zeros((1, channels, frames + 1) + x.shape[3:], dtype=dtype)
    got = norm_act.group_norm_act(x, 4, weight, bias, 1e-6, out=out[:, :, 1:] if view else None)
    b, c, t, h, w = x.shape
    folded = x.double().transpose(1, 2).reshape(b * t, c, h, w)
    expected = torch.nn.functional.group_norm(folded, 4, weight.double(), bias.double(), 1e-6)
    expected = torch.nn.functional.silu(expected.reshape(b, t, c, h, w).transpose(1, 2))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert_exact(got.double(), expected, atol=tolerance, rtol=tolerance)
    if view:
        assert out[:, :, 0].abs().max() == 0, "wrote outside the view"
