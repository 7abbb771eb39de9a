"""The neighbourhood-attention window and the parts of a grid one call computes (neighborhood.py's semantics,
shared by its torch implementations and triton_na.py's kernel).

The window. Along an axis of the whole grid of length L, with kernel K (K' = min(K, L)), the query at
position p attends the K' positions from s = clamp(p - K' // 2, 0, L - K'). A part: the queries of one box of
the grid, the keys and values of a box holding every window of theirs (`key_box`), the whole grid's size.
"""
from dataclasses import dataclass

import torch

Axes = tuple[int, int, int]


def window_start(p, kernel: int, length: int):
    """First position of the window of query position(s) `p` (an int or a tensor) on an axis of `length`."""
    kernel = min(kernel, length)
    if isinstance(p, torch.Tensor):
        return (p - kernel // 2).clamp(0, length - kernel)
    return min(max(p - kernel // 2, 0), length - kernel)


def key_span(start: int, stop: int, kernel: int, length: int) -> tuple[int, int]:
    """[first, last + 1) of the positions the queries [start, stop) of one axis read."""
    return window_start(start, kernel, length), window_start(stop - 1, kernel, length) + min(kernel, length)


def key_box(q_origin: Axes, q_size: Axes, kernel: Axes, grid: Axes) -> tuple[Axes, Axes]:
    """(origin, size) of the box of keys the queries of the box (q_origin, q_size) read: the halo a tile needs."""
    spans = [key_span(o, o + n, k, g) for o, n, k, g in zip(q_origin, q_size, kernel, grid)]
    return tuple(lo for lo, _ in spans), tuple(hi - lo for lo, hi in spans)


@dataclass(frozen=True)
class Part:
    """Where the queries and keys of one call lie: boxes of the grid `grid` (T, H, W)."""

    q_origin: Axes
    q_size: Axes
    kv_origin: Axes
    kv_size: Axes
    grid: Axes
    kernel: Axes  # clamped to the grid

    def axes(self):
        return zip(self.q_origin, self.q_size, self.kv_origin, self.kv_size, self.grid, self.kernel)


def part_of(q, k, v, kernel, q_origin, kv_origin, grid) -> Part:
    """The call's `Part`, every precondition checked (a ValueError says which)."""
    if q.dim() != 6 or k.shape != v.shape or k.dim() != 6:
        raise ValueError(f"na3d takes q, k, v as B,t,h,w,heads,head_dim; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[4:] != k.shape[4:]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch, heads or head_dim")
    q_size, kv_size = tuple(q.shape[1:4]), tuple(k.shape[1:4])
    grid = tuple(grid) if grid is not None else kv_size
    kernel = (kernel,) * 3 if isinstance(kernel, int) else tuple(kernel)
    if len(kernel) != 3 or min(kernel) < 1:
        raise ValueError(f"kernel {kernel}: three positive sizes (t, h, w)")
    for name, origin, size in (("queries", q_origin, q_size), ("keys", kv_origin, kv_size)):
        if any(o < 0 or o + n > g for o, n, g in zip(origin, size, grid)):
            raise ValueError(f"the {name}' box {tuple(origin)} + {size} is not inside the grid {grid}")
    needed_origin, needed_size = key_box(q_origin, q_size, kernel, grid)
    for axis, (lo, n, o, size) in enumerate(zip(needed_origin, needed_size, kv_origin, kv_size)):
        if lo < o or lo + n > o + size:
            raise ValueError(f"axis {'thw'[axis]}: the queries read keys [{lo}, {lo + n}), the keys given are "
                             f"[{o}, {o + size}): give a halo of the window (key_box)")
    return Part(tuple(q_origin), q_size, tuple(kv_origin), kv_size, grid,
                tuple(min(k_, g) for k_, g in zip(kernel, grid)))
