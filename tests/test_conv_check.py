"""The first-use check of channels-last convs (vae/kernels/conv_check.py), on the CPU: the real check
passes and is kept in the kernel record; a route that returns wrong values or raises is refused with one
warning, and the plan keeps NCDHW activations for that device and dtype (whose decode is then the
NCDHW one)."""
import warnings

import pytest
import torch

import vae
from tests.reference import assert_exact, load_tiny
from vae.kernels import conv, conv_check, kernel_choice
from vae.run import kernel_plan

real_conv3d = conv.conv3d


@pytest.fixture(scope="module", autouse=True)
def decided_again_afterwards():
    """These tests decide the verdicts anew (some with faulty routes); the rest of the suite finds them
    decided, as conftest leaves them, so no test counts the check's convs as its own."""
    yield
    conv_check.verdict.cache_clear()
    for dtype in (torch.float32, torch.bfloat16):
        conv_check.failure("cpu", dtype)


@pytest.fixture
def fresh_record(monkeypatch, tmp_path):
    """A new machine as far as verdicts go: an empty kernel record, nothing decided in this process."""
    monkeypatch.setenv(kernel_choice.CACHE_ENV, str(tmp_path))
    conv_check.verdict.cache_clear()
    yield
    conv_check.verdict.cache_clear()


def small_cases(monkeypatch):
    monkeypatch.setattr(conv_check, "LARGE", ((1, 16, 3, 40, 40), 24, 3, 1, 1))


def channels_last(x: torch.Tensor) -> bool:
    return x.shape[1] > 1 and x.stride(1) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_real_routes_agree_and_the_verdict_is_kept(dtype, fresh_record, monkeypatch):
    calls = []
    monkeypatch.setattr(conv, "conv3d", lambda *a, **k: calls.append(a) or real_conv3d(*a, **k))
    assert conv_check.verdict("cpu", dtype) is None
    assert len(calls) == 2 * (len(conv_check.CASES) + 1)  # every case in both layouts, the large one included
    assert kernel_choice.choices_for("cpu").check(conv_check._record_key(dtype)) == {"error": None}
    conv_check.verdict.cache_clear()  # the next process reads the record: nothing runs
    calls.clear()
    assert conv_check.verdict("cpu", dtype) is None and not calls


@pytest.mark.parametrize("fault, words", [("wrong", "disagree with NCDHW"), ("raise", "RuntimeError: no kernel")])
def test_a_failing_route_keeps_ncdhw_with_one_warning(fault, words, fresh_record, monkeypatch):
    small_cases(monkeypatch)

    def faulty(x, weight, *args, **kwargs):
        out = real_conv3d(x, weight, *args, **kwargs)
        if channels_last(x) and fault == "raise":
            raise RuntimeError("no kernel for this shape")
        return out + 1 if channels_last(x) else out

    monkeypatch.setattr(conv, "conv3d", faulty)
    model = load_tiny("wan21")
    z = torch.randn(1, model.latent_channels, 2, 4, 6)
    opts = vae.Optimizations(activation_layout="ndhwc")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = vae.plan(model, "decode", z.shape, vae.Settings(), opts=opts)
        vae.plan(model, "decode", z.shape, vae.Settings(temporal_chunk=2), opts=opts)  # decided once
    said = [str(w.message) for w in caught if "first-use check" in str(w.message)]
    assert plan.activation_layout == "ncdhw"
    assert len(said) == 1 and words in said[0] and "on cpu in float32" in said[0], said
    monkeypatch.setattr(conv, "conv3d", real_conv3d)  # the faulty route is not taken: the decode is NCDHW's
    want = vae.decode(model, z, opts=opts.with_(activation_layout="ncdhw"))
    assert_exact(vae.decode(model, z, plan, opts=opts), want, rtol=0, atol=0)
    assert kernel_plan.explain("ndhwc", "cpu", torch.float32, "measure").startswith("NCDHW (NDHWC convs failed")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_ndhwc_convs_pass_their_check_on_this_gpu(dtype, fresh_record):
    """The real check on a real GPU (cuDNN's channels-last kernels, production-sized LARGE case)."""
    assert conv_check.failure("cuda", dtype) is None
