"""fp8 weight storage: a quarter of float32's bytes at rest, the model's dtype while it runs."""
import pytest
import torch

from optimizations.fp8_weights import FP8, Fp8WeightStore, dequantize, quantize
from reference import load_tiny

pytestmark = pytest.mark.skipif(FP8 is None, reason="torch without float8")


def test_quantize_round_trip_is_within_fp8_precision():
    w = torch.randn(32, 16, 3, 3, 3) * torch.logspace(-3, 1, 32).view(-1, 1, 1, 1, 1)  # channels of any scale
    q, scale = quantize(w)
    assert q.dtype == FP8 and scale.shape == (32, 1, 1, 1, 1)
    back = dequantize(q, scale, torch.float32)
    # e4m3: 3 mantissa bits, relative step 2^-3 near the top of each channel's range; rounding halves it.
    rel = ((back - w).abs() / w.abs().amax(dim=(1, 2, 3, 4), keepdim=True)).max()
    assert 0 < rel <= 2 ** -4


def test_store_quarters_weight_bytes_and_decodes_close_to_float32():
    model = load_tiny("seedvr2")
    z = torch.randn(1, model.latent_channels, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    expected = model.decode(z)
    store = Fp8WeightStore(model)
    assert store.stored_bytes < 0.3 * store.original_bytes()
    convs = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv3d)]
    assert convs and all(w.numel() == 0 for w in convs)  # nothing resident between runs
    with store.materialized():
        assert all(w.numel() > 0 and w.dtype == torch.float32 for w in convs)
        got = model.decode(z)
    assert all(w.numel() == 0 for w in convs)
    err = (got - expected).abs().max().item()
    assert 0 < err < 0.1 * expected.abs().max().item()  # weight rounding shows, but the decode is intact
    with store.materialized():
        again = model.decode(z)
    assert torch.equal(again, got)  # the same dequantized weights every run (caches follow the change)


def test_materialized_is_not_reentrant():
    store = Fp8WeightStore(torch.nn.Conv3d(2, 2, 3))
    with store.materialized():
        with pytest.raises(RuntimeError, match="already active"):
            with store.materialized():
                pass
