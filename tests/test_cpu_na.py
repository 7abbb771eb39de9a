"""The compiled CPU neighbourhood-attention kernel (vae/kernels/cpu_na.c, cpu_na.py) against the reference.

- The C kernel equals `neighborhood.reference` (float32, within 1e-5 of max(1, |ref|)) on grids narrower than
  its 16 lanes (padded) and wider, windows 3 to 11 wide and larger than the grid, the group sizes it compiles
  and the generic one, batch and heads, queries strided as the blocks' q, k, v views of one projection, and
  bf16 in (bf16 out, within bf16 rounding).
- A tile with its halo gives the whole grid's rows: the windows shift at the grid's borders, never at a tile's.
- "auto" takes it for CPU tensors it computes, the blocked torch implementation for those it does not
  (head_dim 8, a window 17 wide, float64), and where it cannot be built (no compiler) or fails its first-use check
  (values off, a kernel that raises): one warning, and the torch implementation runs.
Skipped where the machine has no C compiler (CI's machines have one).
"""
import warnings

import pytest
import torch

from tests.test_neighborhood import _box, qkv, rel
from vae.kernels import cpu_na, na_window
from vae.kernels import neighborhood as na

pytestmark = pytest.mark.skipif(cpu_na.compiler() is None or cpu_na.library() is None, reason="no C compiler here")

CASES = [  # (B, T, H, W, heads, D), kernel: W below and above the 16 lanes, every group size the kernel compiles
    ((2, 5, 6, 7, 2, 16), (3, 5, 3)),
    ((1, 4, 9, 21, 3, 32), (5, 3, 7)),
    ((1, 3, 4, 5, 1, 16), (7, 7, 7)),  # every window larger than the grid: all of it
    ((1, 12, 13, 30, 2, 64), (11, 11, 11)),
    ((1, 3, 5, 40, 1, 16), (3, 3, 3)),
    ((1, 2, 3, 19, 2, 16), (1, 1, 16)),  # the widest window it takes: groups of one query
    ((1, 3, 4, 23, 1, 16), (3, 3, 9)),  # a group size compiled only generically
]


def _part(q, k, v, kernel):
    return na_window.part_of(q, k, v, kernel, (0, 0, 0), (0, 0, 0), None)


@pytest.mark.parametrize("shape, kernel", CASES)
def test_c_equals_reference(shape, kernel):
    q, k, v = qkv(shape, seed=1)
    part = _part(q, k, v, kernel)
    assert rel(cpu_na.na3d(q, k, v, part, 0.3), na.reference(q, k, v, part, 0.3)) < 1e-5


def test_strided_views_of_one_projection():
    """q, k, v as LTX-2.5's attention takes them: views of one B,t,h,w,3,heads,D tensor (not contiguous)."""
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(1, 6, 7, 20, 3, 4, 64, generator=g).unbind(4)
    part = _part(q, k, v, (11, 11, 11))
    assert not q.is_contiguous()
    assert rel(cpu_na.na3d(q, k, v, part, 1.0), na.reference(q, k, v, part, 1.0)) < 1e-5


def test_bf16_inputs():
    q, k, v = qkv((1, 6, 7, 18, 2, 32), seed=2, dtype=torch.bfloat16)
    got = na.na3d(q, k, v, (3, 5, 5), impl="c")
    assert got.dtype == torch.bfloat16
    assert rel(got, na.na3d(q.float(), k.float(), v.float(), (3, 5, 5), impl="reference")) < 1e-2


TILED_SHAPE, TILED_KERNEL = (1, 12, 13, 24, 2, 16), (5, 11, 7)
TILES = [((0, 0, 0), (2, 3, 4)), ((3, 5, 2), (4, 4, 17)), ((8, 9, 7), (4, 4, 5)), ((0, 6, 8), (12, 3, 16))]


@pytest.fixture(scope="module")
def whole_grid():
    q, k, v = qkv(TILED_SHAPE, seed=3)
    return q, k, v, na.na3d(q, k, v, TILED_KERNEL, impl="c")


@pytest.mark.parametrize("origin, size", TILES)
def test_a_tile_with_its_halo_gives_the_whole_grids_rows(whole_grid, origin, size):
    q, k, v, whole = whole_grid
    grid = TILED_SHAPE[1:4]
    kv_origin, kv_size = na_window.key_box(origin, size, TILED_KERNEL, grid)
    assert kv_size != grid
    tile = na.na3d(_box(q, origin, size), _box(k, kv_origin, kv_size), _box(v, kv_origin, kv_size), TILED_KERNEL,
                   origin, kv_origin, grid, impl="c")
    assert rel(tile, _box(whole, origin, size)) < 1e-5


def test_auto_takes_it_where_it_computes_the_call():
    q = torch.zeros(1, 2, 3, 20, 1, 16)
    assert na.resolved_impl("auto", q, q, q, _part(q, q, q, (3, 3, 3))) == "c"
    assert na.resolved_impl("auto", q, q, q, _part(q, q, q, (1, 1, 17))) == "blocked"  # wider than its lanes
    q8 = q[..., :8]
    assert na.resolved_impl("auto", q8, q8, q8, _part(q8, q8, q8, (3, 3, 3))) == "blocked"  # head_dim 8
    q64 = q.double()
    assert na.resolved_impl("auto", q64, q64, q64, _part(q64, q64, q64, (3, 3, 3))) == "blocked"  # float64 kept


@pytest.fixture
def fresh_check():
    """passes_check and the built library forgotten before and after (verdicts are per process)."""
    na.passes_check.cache_clear()
    cpu_na.library.cache_clear()
    yield
    na.passes_check.cache_clear()
    cpu_na.library.cache_clear()


@pytest.mark.parametrize("fault", ["wrong values", "raise"])
def test_a_kernel_that_fails_its_first_use_check_is_not_used(fault, fresh_check, monkeypatch):
    compute = cpu_na.na3d

    def faulty(q, k, v, part, scale):
        if fault == "raise":
            raise OSError("undefined symbol: na3d_f32")
        return compute(q, k, v, part, scale * 2)  # a stand-in for a compiler's wrong code

    monkeypatch.setattr(cpu_na, "na3d", faulty)
    q = torch.randn(1, 3, 4, 20, 1, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = na.resolved_impl("auto", q, q, q, _part(q, q, q, (3, 3, 3)))
        again = na.resolved_impl("auto", q, q, q, _part(q, q, q, (3, 3, 3)))
    assert (first, again, len(caught)) == ("blocked", "blocked", 1)
    message = str(caught[0].message)
    assert "C neighbourhood-attention kernel failed its first-use check on cpu" in message, message
    assert "torch implementation runs instead" in message
    monkeypatch.setattr(cpu_na, "na3d", compute)
    na.passes_check.cache_clear()
    assert na.resolved_impl("auto", q, q, q, _part(q, q, q, (3, 3, 3))) == "c"  # the kernel itself passes


def test_without_a_compiler_the_torch_implementation_runs(fresh_check, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("STREAMVAE_KERNEL_CACHE", str(tmp_path))  # nothing built there yet
    q = torch.randn(1, 3, 4, 20, 1, 16)
    with caplog.at_level("WARNING", logger="streamvae"):
        assert na.resolved_impl("auto", q, q, q, _part(q, q, q, (3, 3, 3))) == "blocked"
    assert "could not build the CPU neighbourhood-attention kernel" in caplog.text
    assert rel(na.na3d(q, q, q, (3, 3, 3)), na.na3d(q, q, q, (3, 3, 3), impl="reference")) < 1e-5
