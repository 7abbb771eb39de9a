"""Neighbourhood attention (vae/kernels/neighborhood.py) against its definition.

- The reference equals dense attention under the NATTEN window mask (each query sees the K' = min(K, L)
  positions from clamp(p - K'//2, 0, L - K') per axis), written here from the rule.
- The blocked implementation equals the reference (several grids, windows larger than the grid, block
  shapes that do not divide it, batch and heads, bf16 in).
- A tile with its halo (`key_box`) gives the whole grid's rows: the windows shift at the grid's borders,
  never at a tile's. Bitwise for the reference; within float32 rounding for blocked (its blocks are the
  tile's). A halo too small is refused.
"""
import itertools

import pytest
import torch

from vae.kernels import na_window
from vae.kernels import neighborhood as na

CASES = [  # (B, T, H, W, heads, D), kernel
    ((2, 5, 6, 7, 2, 8), (3, 5, 3)),
    ((1, 4, 9, 10, 3, 16), (5, 3, 7)),
    ((1, 3, 4, 5, 1, 8), (7, 7, 7)),  # every window larger than the grid: all of it
    ((1, 12, 13, 12, 1, 8), (11, 11, 11)),
]


def qkv(shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [(2 * torch.randn(shape, generator=g)).to(dtype) for _ in range(3)]


def dense(q, k, v, kernel, scale):
    """Attention over every key, the keys outside the query's window masked out."""
    b, t, h, w, heads, d = q.shape
    pos = torch.tensor(list(itertools.product(range(t), range(h), range(w))))  # N,3
    visible = torch.ones(len(pos), len(pos), dtype=torch.bool)
    for axis, (length, size) in enumerate(zip((t, h, w), kernel)):
        size = min(size, length)
        start = (pos[:, axis] - size // 2).clamp(0, length - size)
        visible &= (pos[None, :, axis] >= start[:, None]) & (pos[None, :, axis] < start[:, None] + size)
    flat = [x.reshape(b, -1, heads, d).transpose(1, 2).double() for x in (q, k, v)]  # B,heads,N,D
    scores = (flat[0] @ flat[1].transpose(-1, -2) * scale).masked_fill(~visible, float("-inf"))
    return (scores.softmax(-1) @ flat[2]).transpose(1, 2).reshape(q.shape)


def rel(got, want) -> float:
    return ((got.double() - want.double()).abs().max() / max(1.0, want.abs().max().item())).item()


@pytest.mark.parametrize("shape, kernel", CASES)
def test_reference_is_the_masked_attention(shape, kernel):
    q, k, v = qkv(shape)
    assert rel(na.na3d(q, k, v, kernel, scale=0.3, impl="reference"), dense(q, k, v, kernel, 0.3)) < 1e-5


@pytest.mark.parametrize("shape, kernel, block", [(*case, block) for case, block in zip(CASES, [(1, 4, 8), (2, 3, 5)] * 2)])
def test_blocked_equals_reference(shape, kernel, block):
    q, k, v = qkv(shape, seed=1)
    part = na_window.part_of(q, k, v, kernel, (0, 0, 0), (0, 0, 0), None)
    assert rel(na.blocked(q, k, v, part, 0.3, block), na.reference(q, k, v, part, 0.3)) < 1e-5


def test_blocked_bf16_inputs():
    """bf16 in, bf16 out (computed in float32 where the CPU has no bf16 units): within bf16 rounding."""
    q, k, v = qkv((1, 6, 7, 9, 2, 16), seed=2, dtype=torch.bfloat16)
    got = na.na3d(q, k, v, (3, 5, 5), impl="blocked")
    assert got.dtype == torch.bfloat16
    assert rel(got, na.na3d(q.float(), k.float(), v.float(), (3, 5, 5), impl="reference")) < 1e-2


def _box(x, origin, size):
    return x[(slice(None), *(slice(o, o + n) for o, n in zip(origin, size)))]


TILES = [((0, 0, 0), (2, 3, 4)), ((3, 5, 2), (4, 4, 5)), ((8, 9, 7), (4, 4, 5)), ((0, 6, 8), (12, 3, 4))]
TILED_SHAPE, TILED_KERNEL = (1, 12, 13, 12, 2, 8), (5, 11, 7)


@pytest.fixture(scope="module", params=["reference", "blocked"])
def whole_grid(request):
    """(impl, q, k, v, the whole grid's attention by `impl`), computed once for the tiles below."""
    q, k, v = qkv(TILED_SHAPE, seed=3)
    return request.param, q, k, v, na.na3d(q, k, v, TILED_KERNEL, impl=request.param)


@pytest.mark.parametrize("origin, size", TILES)
def test_a_tile_with_its_halo_gives_the_whole_grids_rows(whole_grid, origin, size):
    impl, q, k, v, whole = whole_grid
    grid, kernel = TILED_SHAPE[1:4], TILED_KERNEL
    kv_origin, kv_size = na_window.key_box(origin, size, kernel, grid)
    assert kv_size != grid  # a real halo: the tile does not read the whole grid
    tile = na.na3d(_box(q, origin, size), _box(k, kv_origin, kv_size), _box(v, kv_origin, kv_size), kernel,
                   origin, kv_origin, grid, impl=impl)
    whole = _box(whole, origin, size)
    if impl == "reference":
        assert torch.equal(tile, whole)
    else:
        assert rel(tile, whole) < 1e-5


def test_a_halo_too_small_is_refused():
    q, k, v = qkv((1, 8, 8, 8, 1, 8))
    kv_origin, kv_size = na_window.key_box((2, 2, 2), (2, 2, 2), (3, 5, 5), (8, 8, 8))
    short = (kv_size[0], kv_size[1] - 1, kv_size[2])
    with pytest.raises(ValueError, match="axis h"):
        na.na3d(_box(q, (2, 2, 2), (2, 2, 2)), _box(k, kv_origin, short), _box(v, kv_origin, short), (3, 5, 5),
                (2, 2, 2), kv_origin, (8, 8, 8))

