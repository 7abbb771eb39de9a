"""Winograd conv3d: equal to F.conv3d, cached filter transforms, and the dispatch's choice of kernel."""
import gc
import itertools

import pytest
import torch
import torch.nn.functional as F

import vae.kernels.conv as conv
import vae.kernels.filter_cache as caches
import vae.kernels.winograd as winograd
import vae.kernels.winograd_job as winograd_job
from vae.kernels import Optimizations
from vae.kernels.winograd import filter_transform, winograd_conv3d, winograd_matrices

import vae
from reference import assert_exact

CACHE = caches.FilterCache(1 << 30)  # this file's filter transforms, apart from the process's caches


def make(b, cin, cout, kt, t, h, w, bias=True, seed=0):
    """x ~ N(0,1), weight N(0,1)/sqrt(fan_in) (outputs O(1), like the models'), optional bias."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, cin, t, h, w, generator=g)
    weight = torch.randn(cout, cin, kt, 3, 3, generator=g) / (cin * kt * 9) ** 0.5
    return x, weight, torch.randn(cout, generator=g) if bias else None


def reference(x, weight, bias):
    """F.conv3d in float64: the exact answer both float32 kernels approximate."""
    return F.conv3d(x.double(), weight.double(), None if bias is None else bias.double(), 1, (0, 1, 1))


@pytest.mark.parametrize("m", [2, 4, 6])
def test_transform_matrices_compute_a_1d_correlation(m):
    at, g, bt = winograd_matrices(m)
    d, k = torch.randn(m + 2, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    expected = torch.stack([(d[i:i + 3] * k).sum() for i in range(m)])
    assert_exact(at @ ((g @ k) * (bt @ d)), expected, atol=1e-12, rtol=0)


# (B, Cin, Cout, kt, T, H, W): odd and tile-unaligned sizes, 1x1 frames, both kernel depths, T = kt..5.
SHAPES = [(2, c, co, kt, t, h, w) for (c, co), kt, (h, w) in itertools.product(
    [(3, 5), (16, 24), (64, 48)], [1, 3], [(1, 1), (7, 9), (13, 6), (16, 17)]) for t in sorted({kt, 5})]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_equals_conv3d_float32(shape):
    x, weight, bias = make(*shape, bias=shape[2] != 24)
    out = winograd_conv3d(x, weight, bias, CACHE)
    expected = F.conv3d(x, weight, bias, 1, (0, 1, 1))
    assert out.shape == expected.shape and out.dtype == torch.float32 and out.is_contiguous()
    assert_exact(out, expected, atol=3e-5, rtol=0)
    # Against float64: relative to the output's magnitude, 1-4e-6 at most (oneDNN: 0.1-2e-6 here, where
    # few channels make its sums short; 1-5e-6 at 128-512 channels, see bench/bench_winograd.py).
    exact = reference(x, weight, bias)
    assert (out.double() - exact).abs().max() <= 5e-6 * exact.abs().max()


@pytest.mark.parametrize("m", [2, 4, 6])
@pytest.mark.parametrize("hw", [(3, 3), (9, 14), (18, 11)], ids=str)
def test_valid_mode_equals_unpadded_conv3d(m, hw):
    """padding=0: the output of a tile with its one-pixel halo, (H-2) x (W-2), tile-unaligned sizes."""
    x, weight, bias = make(2, 16, 8, 3, 4, *hw)
    out = winograd_conv3d(x, weight, bias, CACHE, m, padding=0)
    expected = F.conv3d(x, weight, bias, 1, 0)
    assert out.shape == expected.shape and out.is_contiguous()
    assert_exact(out, expected, atol=5e-5, rtol=0)


@pytest.mark.parametrize("m", [2, 6])
def test_other_tile_sizes(m):
    x, weight, bias = make(2, 16, 8, 3, 4, 11, 14)
    assert_exact(winograd_conv3d(x, weight, bias, CACHE, m), F.conv3d(x, weight, bias, 1, (0, 1, 1)),
                               atol=5e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_input_is_computed_in_float32(dtype):
    x, weight, bias = make(2, 32, 16, 3, 4, 9, 10)
    x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype)
    out = winograd_conv3d(x, weight, bias, CACHE)
    assert out.dtype == dtype
    expected = F.conv3d(x.float(), weight.float(), bias.float(), 1, (0, 1, 1))
    assert_exact(out.float(), expected, atol=1e-4, rtol=8e-3)  # one rounding to `dtype`


def test_slabs_channel_parts_and_worker_threads(monkeypatch):
    """A one-tile-row working set forces many slabs (run on worker threads when there are several
    threads); a single slab with many channels is split by channels. Thread settings are restored."""
    threads = torch.get_num_threads()
    monkeypatch.setattr(winograd, "MIN_WORKSPACE_BYTES", 0)
    monkeypatch.setattr(winograd, "MIN_PART_CHANNELS", 4)
    for shape in [(2, 24, 16, 3, 5, 19, 10), (1, 16, 32, 3, 3, 4, 4)]:
        x, weight, bias = make(*shape)
        assert_exact(winograd_conv3d(x, weight, bias, CACHE), F.conv3d(x, weight, bias, 1, (0, 1, 1)),
                                   atol=2e-5, rtol=0)
    assert torch.get_num_threads() == threads


def test_filter_transform_is_cached_per_weight_and_follows_changes():
    _, weight, _ = make(1, 8, 4, 3, 3, 4, 4)
    u = filter_transform(weight, CACHE)
    assert u.shape == (36, 4, 3 * 8) and filter_transform(weight, CACHE) is u  # (P, Cout, kt*Cin)
    # Views made per call (FrameConv2d's weight.unsqueeze(2), tap slices) hit the cache of their base.
    assert filter_transform(weight[:, :, 1:], CACHE) is filter_transform(weight[:, :, 1:], CACHE)
    assert_exact(filter_transform(weight[:, :, 1:], CACHE), u.view(36, 4, 3, 8)[:, :, 1:].flatten(2), rtol=1.3e-6)
    with torch.no_grad():
        weight.mul_(2)  # in place: the version counter moves, the transform is recomputed
    assert_exact(filter_transform(weight, CACHE), 2 * u, rtol=1.3e-6)
    key = id(weight)
    del weight, u
    gc.collect()
    assert key not in CACHE.anchors()  # freed with its weight


def test_inference_mode_weights_and_a_workspace_kept_across_modes():
    """A conv in inference mode, then one outside it on the same worker's kept workspace (which must not be
    an inference tensor then)."""
    with torch.inference_mode():
        x, weight, bias = make(1, 8, 4, 3, 3, 5, 5)
        inside = winograd_conv3d(x, weight, bias, CACHE)
        assert_exact(inside, F.conv3d(x, weight, bias, 1, (0, 1, 1)), atol=2e-5, rtol=0)
    x, weight, bias = make(1, 8, 4, 3, 3, 5, 5)
    assert torch.equal(winograd_conv3d(x, weight, bias, CACHE), inside)


def test_a_worker_keeps_a_small_workspace_between_convs():
    """Reused pages instead of fresh ones for the next conv, up to KEPT_WORKSPACE_BYTES."""
    pool = winograd_job.Workers(1)
    first = pool.workspace(1000)
    assert pool.workspace(500).data_ptr() == first.data_ptr()
    large = pool.workspace(winograd_job.KEPT_WORKSPACE_BYTES // 4 + 1)  # used for one conv, not kept
    assert large.data_ptr() != first.data_ptr() and pool.workspace(500).data_ptr() == first.data_ptr()


@pytest.mark.parametrize("n_h, rows, per_slab, threads", [(44, 4, 1, 2), (22, 7, 1, 2), (6, 2, 2, 4), (5, 5, 1, 4),
                                                          (3, 1, 1, 2), (1, 1, 1, 2), (7, 3, 1, 3)])
def test_slabs_cover_the_rows_evenly_and_fill_the_threads(n_h, rows, per_slab, threads):
    """Contiguous slabs of at most `rows` rows that differ by one row at most, as many jobs as make whole
    rounds of the threads where there are rows enough (11 slabs of 4 rows on 2 threads become 12)."""
    cut = winograd_job.slabs(n_h, rows, per_slab, threads)
    assert cut[0][0] == 0 and cut[-1][1] == n_h and all(a[1] == b[0] for a, b in zip(cut, cut[1:]))
    heights = [r1 - r0 for r0, r1 in cut]
    assert max(heights) <= rows and max(heights) - min(heights) <= 1
    assert len(cut) * per_slab % threads == 0 or len(cut) == n_h


@pytest.fixture
def spy(monkeypatch):
    """Records the convs the dispatch sends to the Winograd kernel."""
    calls = []

    def recording(x, weight, bias, cache, padding=1, gemm="mkl"):
        calls.append(tuple(weight.shape))
        return winograd_conv3d(x, weight, bias, cache, padding=padding, gemm=gemm)

    monkeypatch.setattr(conv, "winograd_conv3d", recording)
    return calls


def test_dispatch_uses_winograd_only_when_enabled_and_eligible(spy):
    x, weight, bias = make(1, 128, 128, 3, 4, 8, 8)
    expected = F.conv3d(x, weight, bias, 1, (0, 1, 1))
    out = conv.conv3d(x, weight, bias, (1, 1, 1), (0, 1, 1), winograd=CACHE)
    assert_exact(out, expected, atol=5e-5, rtol=0)
    assert spy == [(128, 128, 3, 3, 3)]
    # Switch off: the oneDNN path, bit for bit.
    off = conv.conv3d(x, weight, bias, (1, 1, 1), (0, 1, 1), winograd=None)
    assert torch.equal(off, conv._cpu_conv3d(x, weight, bias, (1, 1, 1), (0, 1, 1)))
    # Not eligible: stride 2, 1x1x1 kernel, other padding, few channels, small frames, autograd.
    conv.conv3d(x, weight, bias, (1, 2, 2), (0, 1, 1), winograd=CACHE)
    conv.conv3d(x, weight[:, :, :, 1:2, 1:2], bias, (1, 1, 1), (0, 0, 0), winograd=CACHE)
    conv.conv3d(x, weight, bias, (1, 1, 1), (1, 1, 1), winograd=CACHE)
    conv.conv3d(x[:, :32], weight[:, :32], bias, (1, 1, 1), (0, 1, 1), winograd=CACHE)
    conv.conv3d(x[:, :64], weight[:64, :64], bias[:64], (1, 1, 1), (0, 1, 1), winograd=CACHE)
    conv.conv3d(x[:, :96], weight[:96, :96, 1:2], bias[:96], (1, 1, 1), (0, 1, 1), winograd=CACHE)  # kt=1: 128
    conv.conv3d(x[..., :7, :8], weight, bias, (1, 1, 1), (0, 1, 1), winograd=CACHE)  # 56 pixels
    conv.conv3d(x, weight.requires_grad_(), bias, (1, 1, 1), (0, 1, 1), winograd=CACHE)
    assert len(spy) == 1


def test_causal_conv_passes_the_switch(spy):
    from vae.model.blocks import CausalConv3d
    from vae.run.run_context import RunContext

    layer = CausalConv3d(128, 128, 3, head="replicate")
    x = torch.randn(1, 128, 3, 8, 8)
    with torch.inference_mode():
        defaults = Optimizations(kernel_choice="defaults")  # the fixed rule, not this machine's measurement
        off = layer(x, RunContext(defaults.with_(winograd_conv=False)))
        assert not spy
        on = layer(x, RunContext(defaults))
    assert spy == [(128, 128, 3, 3, 3)]
    assert_exact(on, off, atol=3e-5, rtol=0)


def test_tiny_model_decode_keeps_the_fixture(monkeypatch, spy):
    """With the channel floors lowered so every 3x3 conv of the tiny SeedVR2 model takes Winograd,
    its decode still matches the upstream fixture (the models' tolerance)."""
    from tests.reference import load_tiny, tensors

    monkeypatch.setattr(conv, "WINOGRAD_MIN_CHANNELS", 1)
    monkeypatch.setattr(conv, "WINOGRAD_MIN_CHANNEL_TAPS", 1)
    fixtures = tensors("seedvr2", "tiny_outputs.safetensors")
    # Winograd by the fixed rule, not by measurement
    out = vae.decode(load_tiny("seedvr2"), fixtures["dec.input"], opts=Optimizations(kernel_choice="defaults"))
    assert_exact(out, fixtures["dec.video"], atol=1e-4, rtol=1e-4)
    assert len(spy) > 30 and all(shape[3:] == (3, 3) for shape in spy)


class CountingCache:
    """A FilterCache of real filter transforms that counts how many it had to compute."""

    def __init__(self, limit_bytes):
        self.cache, self.computed = caches.FilterCache(limit_bytes), 0

    def get(self, weight):
        def compute():
            self.computed += 1
            return filter_transform(weight, CACHE).clone()

        return self.cache.get(weight, ("u",), compute)


def test_filter_cache_is_capped_and_scan_resistant():
    weights = [make(1, 8, 4, 3, 3, 4, 4, seed=i)[1] for i in range(5)]
    one = filter_transform(weights[0], CACHE).nbytes  # 36 x 4 x 3 x 8 float32
    counting = CountingCache(2 * one)
    cache = counting.cache
    first = [counting.get(w) for w in weights[:3]]  # one cycle of three convs, room for two
    assert counting.computed == 3 and len(cache) == 2 and cache.bytes == 2 * one
    assert all(torch.equal(u, filter_transform(w, CACHE)) for u, w in zip(first, weights))
    # Later cycles: plain LRU would evict each entry just before its use (3 computes per cycle); the
    # cache keeps what fits and recomputes only the rest.
    for _ in range(3):
        before = counting.computed
        for w in weights[:3]:
            counting.get(w)
        assert counting.computed - before == 1 and cache.bytes <= 2 * one
    # Another model takes over: the old entries age out and the new ones are kept.
    for _ in range(3):
        for w in weights[3:]:
            counting.get(w)
    before = counting.computed
    kept = [counting.get(w) for w in weights[3:]]
    assert counting.computed == before and all(counting.get(w) is u for w, u in zip(weights[3:], kept))
    small = CountingCache(one - 1)  # a transform larger than the whole cap is returned but not kept
    assert torch.equal(small.get(weights[0]), filter_transform(weights[0], CACHE))
    assert len(small.cache) == 0 and small.cache.bytes == 0


def test_filter_cache_keeps_the_highest_priority_transforms():
    """When a cycle does not fit, the transforms of the largest frames (most saved per byte) stay."""
    weights = [make(1, 8, 4, 3, 3, 4, 4, seed=i)[1] for i in range(3)]
    one = filter_transform(weights[0], CACHE).nbytes
    cache = caches.FilterCache(2 * one)
    get = lambda w, priority: cache.get(w, ("u",), lambda: filter_transform(w, CACHE).clone(), priority)
    for _ in range(3):  # a cycle of three convs, frames of 16, 64 and 256 pixels; room for two
        for w, priority in zip(weights, (16, 64, 256)):
            get(w, priority)
    assert len(cache) == 2
    assert not cache.holds_or_admits(weights[0], ("u",), one, priority=16)
    assert all(cache.holds_or_admits(w, ("u",), one, priority=16) for w in weights[1:])
    assert cache.holds_or_admits(weights[0], ("u",), one, priority=1024)  # would displace the 64-pixel one


def test_uncached_transform_used_only_where_it_pays(spy):
    """With no room in the cache, a small call (Wan2.2's latent-resolution convs) runs on oneDNN; one
    with enough output pixels to amortise the transform, or a cached one, runs by Winograd."""
    full = caches.FilterCache(0)
    small, weight, bias = make(1, 128, 128, 3, 4, 16, 16)  # 2 output frames x 256 pixels
    out = conv.conv3d(small, weight, bias, (1, 1, 1), (0, 1, 1), winograd=full)
    assert not spy and torch.equal(out, conv._cpu_conv3d(small, weight, bias, (1, 1, 1), (0, 1, 1)))
    large = torch.randn(1, 128, 6, 32, 32)  # 4 output frames x 1024 pixels
    conv.conv3d(large, weight, bias, (1, 1, 1), (0, 1, 1), winograd=full)
    assert spy == [(128, 128, 3, 3, 3)]
    roomy = caches.FilterCache(1 << 30)  # room: computed once, kept, used from then on
    conv.conv3d(small, weight, bias, (1, 1, 1), (0, 1, 1), winograd=roomy)
    assert len(spy) == 2 and len(roomy) == 1


def test_default_cap_follows_memory_and_the_environment(monkeypatch):
    assert caches.filter_cache().limit_bytes == caches.default_cache_bytes()
    monkeypatch.setenv("STREAMVAE_WINOGRAD_CACHE_GB", "0.5")
    assert caches.default_cache_bytes() == 1 << 29
    for ram, expected in ((4 << 30, 1 << 30), (24 << 30, 3 << 30), (256 << 30, 4 << 30), (None, 1 << 30)):
        assert caches.cache_bytes_for(ram) == expected


def test_capped_cache_still_gives_exact_convs():
    """Thrashing (cap smaller than one layer's transform) recomputes; results do not change."""
    x, weight, bias = make(1, 96, 96, 3, 4, 9, 9)
    expected = winograd_conv3d(x, weight, bias, CACHE)
    none_kept = caches.FilterCache(0)
    assert torch.equal(winograd_conv3d(x, weight, bias, none_kept), expected)
    assert none_kept.bytes == 0


def test_a_large_transform_not_in_the_cache_runs_a_group_of_output_channels_at_a_time(monkeypatch):
    """Above winograd.GROUP_TRANSFORM_BYTES (here lowered to 16 output channels' transform) a transform
    the cache does not hold is computed and used a group at a time (the transient is a group's): 3
    groups of 40 channels, each computed once, equal to F.conv3d; a cached one runs whole."""
    x, weight, bias = make(1, 96, 40, 3, 4, 9, 9)
    monkeypatch.setattr(winograd, "GROUP_TRANSFORM_BYTES", winograd.transform_nbytes((16, 96, 3)))
    computed = []
    real = winograd.filter_transform
    monkeypatch.setattr(winograd, "filter_transform", lambda w, *a, **k: computed.append(w.shape[0]) or real(w, *a, **k))
    none_kept = caches.FilterCache(0)
    assert_exact(winograd_conv3d(x, weight, bias, none_kept).double(), reference(x, weight, bias), atol=5e-5)
    assert computed == [16, 16, 8]
    roomy = caches.FilterCache(1 << 30)
    roomy.get(weight, winograd._transform_key(weight, winograd.DEFAULT_TILE), lambda: real(weight, CACHE))
    computed.clear()
    assert_exact(winograd_conv3d(x, weight, bias, roomy).double(), reference(x, weight, bias), atol=5e-5)
    assert computed == [40]  # the whole transform, from the cache


def test_a_full_cache_drops_what_a_new_transform_displaces_before_computing_it():
    """cache.get with the value's size: the cache and the value being computed never exceed the cap."""
    weights = [make(1, 8, 4, 3, 3, 4, 4, seed=i)[1] for i in range(3)]
    one = filter_transform(weights[0], CACHE).nbytes
    cache = caches.FilterCache(2 * one)
    held_while_computing = []

    def compute(w):
        held_while_computing.append(cache.bytes)
        return filter_transform(w, CACHE).clone()

    for w, priority in zip(weights, (16, 64, 256)):  # the third displaces the first
        cache.get(w, ("u",), lambda w=w: compute(w), priority, nbytes=one)
    assert held_while_computing == [0, one, one] and cache.bytes == 2 * one


def test_the_cache_admits_what_it_said_it_would():
    """holds_or_admits (what transform_pays and the grouping ask before computing) agrees with what get
    then keeps, over cycles of convs that do not all fit, at mixed priorities."""
    weights = [make(1, 8, 4, 3, 3, 4, 4, seed=i)[1] for i in range(4)]
    one = filter_transform(weights[0], CACHE).nbytes
    cache = caches.FilterCache(2 * one)
    disagreements = []
    for cycle in range(4):
        for i, (w, priority) in enumerate(zip(weights, (16, 64, 16, 256))):
            said = cache.holds_or_admits(w, ("u",), one, priority)
            cache.get(w, ("u",), lambda w=w: filter_transform(w, CACHE).clone(), priority, nbytes=one)
            if said != cache.has(w, ("u",)):
                disagreements.append((cycle, i, said))
    assert disagreements == []
