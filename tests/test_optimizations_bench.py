"""The benchmark's comparison points: ComfyUI core's Wan VAE with StreamVAE's weights decodes what
StreamVAE decodes, and each benchmark variant sets the model up as it says and undoes it."""
import pytest
import torch
import vae

from bench.core_vae import TREES, core_model
from bench.variants import prepared
from vae.kernels import filter_cache
from reference import assert_exact, load_tiny


@pytest.mark.parametrize("family", ["wan21", "wan22"])
def test_core_wan_vae_with_our_weights_decodes_like_streamvae(family):
    tree = TREES["0.3.75"].path
    if not (tree / "comfy").is_dir():
        pytest.skip(f"no ComfyUI checkout at {tree} (run .ci/setup)")
    ours = load_tiny(family)
    core = core_model("0.3.75", family, ours.config, ours.state_dict(), torch.float32)
    z = torch.randn(1, ours.latent_channels, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected, got = vae.decode(ours, z), core.decode(z)
    assert got.shape == expected.shape == (1, 3, 9, 4 * ours.spatial_factor, 4 * ours.spatial_factor)
    assert_exact(got, expected, rtol=0, atol=1e-4)


def test_prepared_extras_are_applied_and_undone():
    model = load_tiny("seedvr2")
    with prepared(model, "winograd_uncapped") as setup:
        assert setup.opts.winograd_cache_bytes > 1 << 60
        assert filter_cache.filter_cache(setup.opts.winograd_cache_bytes) is not filter_cache.filter_cache()
    with prepared(model, "ndhwc") as setup:
        assert setup.opts.activation_layout == "ndhwc"
