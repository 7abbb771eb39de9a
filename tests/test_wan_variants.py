"""Wan-architecture VAEs at other sizes, against diffusers' own classes: another width
(`AutoencoderKLWan`), Qwen-Image RGB and RGBA (`AutoencoderKLQwenImage`), a 2x upscale decoder
(`AutoencoderKLWan(out_channels=12)`, pixel-shuffled as its users do) and Qwen-Image 2.1
(`AutoencoderKLQwenImage21`). Tiny widths, seeded random weights saved in diffusers key names; every
size is read from the shapes. Encode/decode match diffusers within 1e-4, exact tiles equal untiled
and temporal chunks equal the whole clip within 1e-5; both key layouts load; shapes that fit no
rule are refused by name."""
import pytest
import torch
import torch.nn.functional as F

import vae
from vae.loading import CheckpointError, save_checkpoint
from reference import assert_exact, random_weights

diffusers = pytest.importorskip("diffusers")

# id -> (diffusers class, constructor kwargs, our family, image channels, upscale)
VARIANTS = {
    "wan21-width12": ("AutoencoderKLWan", dict(base_dim=12), "wan21", 3, 1),
    "qwenimage-rgb": ("AutoencoderKLQwenImage", dict(base_dim=8, input_channels=3), "wan21", 3, 1),
    "qwenimage-rgba": ("AutoencoderKLQwenImage", dict(base_dim=8, input_channels=4), "wan21", 4, 1),
    "wan21-upscale2x": ("AutoencoderKLWan", dict(base_dim=8, out_channels=12), "wan21", 3, 2),
    "qwenimage21": ("AutoencoderKLQwenImage21", dict(base_dim=8, decoder_base_dim=12), "qwen21", 4, 1),
}
# Variants whose code paths differ from the released families' (RGBA, pixel shuffle, image network):
# these are tiled and chunked here; the others run the released Wan2.1 code at another width.
STREAMED = ("qwenimage-rgba", "wan21-upscale2x", "qwenimage21")


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory):
    """(id, diffusers model, our model loaded from a safetensors file in diffusers key names)."""
    cls_name, kwargs, *_ = VARIANTS[request.param]
    reference = random_weights(getattr(diffusers, cls_name)(**kwargs), seed=len(request.param))
    path = tmp_path_factory.mktemp("variants") / f"{request.param}.safetensors"
    save_checkpoint(reference.state_dict(), path)
    return request.param, reference, vae.load(path)


def _video(model, frames: int, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, model.in_channels, frames, 48, 32, generator=g) * 2 - 1


def _latent(model, frames: int, seed: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, model.latent_channels, frames, 3 * 16 // model.spatial_factor, 2 * 16 // model.spatial_factor,
                       generator=g)


def _frames(model) -> int:
    """A clip the diffusers class takes whole: 1 + 4k frames for video, one image for an image VAE."""
    return 5 if model.temporal_factor > 1 else 1


def test_sizes_are_read_from_the_shapes(variant):
    name, reference, model = variant
    _, kwargs, family, channels, upscale = VARIANTS[name]
    assert (model.family, model.in_channels, model.out_channels, model.decode_upscale) == (family, channels, channels, upscale)
    assert model.config.dim == kwargs["base_dim"] and model.latent_channels == reference.config.z_dim
    assert model.config.dim_mult == tuple(reference.config.dim_mult)
    assert model.spatial_factor == 2 ** (len(reference.config.dim_mult) - 1)
    assert model.temporal_factor == (1 if family == "qwen21" else 4)
    if family == "qwen21":
        assert model.config.dec_dim == kwargs["decoder_base_dim"]


def test_upstream_key_names_load_the_same_model(variant):
    """Our (upstream / ComfyUI) key names: the same family, config and weights."""
    _, _, model = variant
    again = vae.load(dict(model.state_dict()))
    assert type(again) is type(model) and again.config == model.config


def test_encode_matches_diffusers(variant):
    _, reference, model = variant
    video = _video(model, _frames(model))
    with torch.no_grad():
        expected = reference.encode(video).latent_dist.mode()
    assert_exact(vae.encode(model, video), expected, rtol=0, atol=1e-4)


def test_decode_matches_diffusers(variant):
    name, reference, model = variant
    z = _latent(model, 2 if model.temporal_factor > 1 else 1)
    with torch.no_grad():
        expected = reference.decode(z).sample  # clamped to [-1, 1]
    if VARIANTS[name][4] > 1:  # the upscale decoder's 12 channels, as its users pixel-shuffle them
        expected = F.pixel_shuffle(expected.transpose(1, 2).flatten(0, 1), VARIANTS[name][4])
        expected = expected.unflatten(0, (1, -1)).transpose(1, 2)
    assert_exact(vae.decode(model, z).clamp(-1, 1), expected, rtol=0, atol=1e-4)


def test_image_vae_encodes_every_frame_as_its_own_image(variant):
    """An image VAE (temporal factor 1): frame t of a clip encodes and decodes as diffusers does image t."""
    _, reference, model = variant
    if model.temporal_factor > 1:
        pytest.skip("a video VAE")
    video, z = _video(model, 3), _latent(model, 3)
    with torch.no_grad():
        encoded = torch.cat([reference.encode(video[:, :, t:t + 1]).latent_dist.mode() for t in range(3)], dim=2)
        decoded = torch.cat([reference.decode(z[:, :, t:t + 1]).sample for t in range(3)], dim=2)
    assert_exact(vae.encode(model, video, vae.Settings(temporal_chunk=2)), encoded, rtol=0, atol=1e-4)
    assert_exact(vae.decode(model, z, vae.Settings(temporal_chunk=2)).clamp(-1, 1), decoded, rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def whole(variant):
    """Untiled encode and decode of a 9-frame clip (3 latent frames; 9 images for an image VAE), whole."""
    name, _, model = variant
    if name not in STREAMED:
        pytest.skip("the released family's code paths, tiled and chunked in test_wan.py")
    video = _video(model, 9)
    z = vae.encode(model, video, vae.Settings(temporal_chunk=1000))
    return video, z, vae.decode(model, z, vae.Settings(temporal_chunk=1000))


def test_exact_tiles_equal_untiled(variant, whole):
    _, _, model = variant
    video, z, decoded = whole
    tile = 2 * model.spatial_factor  # the smallest tile: a 2x1 or 3x2 grid on these frames
    assert_exact(vae.encode(model, video, vae.Settings(temporal_chunk=1000, tile_size=tile)), z, rtol=0, atol=1e-5)
    assert_exact(vae.decode(model, z, vae.Settings(temporal_chunk=1000, tile_size=tile)), decoded, rtol=0, atol=1e-5)


def test_temporal_chunks_equal_the_whole_clip(variant, whole):
    _, _, model = variant
    video, z, decoded = whole
    assert_exact(vae.encode(model, video, vae.Settings(temporal_chunk=1)), z, rtol=0, atol=1e-5)
    assert_exact(vae.decode(model, z, vae.Settings(temporal_chunk=2)), decoded, rtol=0, atol=1e-5)


def test_plan_predicts_memory_for_the_variant(variant):
    """The planner works for every variant (scaled or own calibration) and a larger frame needs more."""
    _, _, model = variant
    small, large = (vae.plan(model, "decode", (1, model.latent_channels, 2, n, n)).peak_bytes for n in (4, 8))
    assert 0 < small < large


# --- refusals ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rgba_state():
    return dict(random_weights(diffusers.AutoencoderKLQwenImage(base_dim=8, input_channels=4), 0).state_dict())


@pytest.mark.parametrize("key, shape, named", [
    ("decoder.conv_out.weight", (5, 8, 3, 3, 3), r"decoder\.head\.2\.weight \(5, 8, 3, 3, 3\): 5 output channels"),
    ("encoder.conv_in.weight", (8, 5, 3, 3, 3), r"encoder\.conv1\.weight \(8, 5, 3, 3, 3\): 5 input channels"),
    ("encoder.conv_in.weight", (8, 4, 2, 3, 3), r"encoder\.conv1\.weight \(8, 4, 2, 3, 3\): temporal kernel 2"),
])
def test_shapes_that_fit_no_rule_are_refused_by_name(rgba_state, key, shape, named):
    state = dict(rgba_state, **{key: torch.zeros(shape)})
    with pytest.raises(CheckpointError, match=r"wan21 VAE's key layout, but sizes no variant.*" + named):
        vae.load(state)


def test_channels_last_activations_give_the_same_numbers(variant):
    """Every variant (4-channel RGBA, the 2x upscale decoder, the image VAE) in NDHWC equals NCDHW."""
    _, _, model = variant
    video, z = _video(model, _frames(model)), _latent(model, 2 if model.temporal_factor > 1 else 1)
    ncdhw, ndhwc = (vae.Optimizations(kernel_choice="defaults", activation_layout=name) for name in ("ncdhw", "ndhwc"))
    assert_exact(vae.encode(model, video, opts=ndhwc), vae.encode(model, video, opts=ncdhw), atol=1e-5, rtol=0)
    assert_exact(vae.decode(model, z, opts=ndhwc), vae.decode(model, z, opts=ncdhw), atol=1e-5, rtol=0)
