"""3-D neighbourhood attention (NATTEN's and comfy-kitchen's `na3d` semantics, dilation 1), for a part of
the grid: the queries of one box, the keys and values of a box around it.

The window. Along an axis of the whole grid of length L, with kernel K (K' = min(K, L): a kernel larger
than the grid shrinks to it), the query at position p attends the K' positions from
s = clamp(p - K' // 2, 0, L - K'): centred where it fits, shifted inward at the grid's borders. The
window is the product of the three axes' windows; every query attends exactly K't * K'h * K'w keys.

A part. Queries `q` are the box of the grid starting at `q_origin`; keys and values `k`, `v` the box
starting at `kv_origin`, which must hold every window of those queries (`key_box` says which box that
is); `grid` is the whole grid's (T, H, W). The shift happens at the grid's borders only, never at a
box's, so a tile with its halo gives exactly the whole grid's rows. Layout of q, k, v and the result:
B, t, h, w, heads, head_dim (channels last, heads before the head's channels, as core's `na3d`).

Implementations (`na3d(impl=)`):
- "reference": the definition, query by query: each query's window gathered and a float32 softmax.
- "blocked": blocks of queries against the box their windows cover, many blocks per batched
  scaled-dot-product-attention call, the keys outside each query's window masked out; computed in
  bf16/fp16 where the device computes them natively, else in float32. Any device.
- "auto": blocked (a Triton kernel for GPUs is future work: every Triton kernel of the pack is compiled
  for the GPU targets in CI, tests/test_triton_targets.py).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .backend import cpu_has_native

Axes = tuple[int, int, int]
IMPLS = ("auto", "reference", "blocked")
# Elements of one blocked call's gathered queries, keys, values and mask (bounds its transient memory).
BLOCKED_CALL_ELEMENTS = 1 << 25


def block_for(kernel: Axes) -> Axes:
    """Queries per block (t, h, w) of the blocked implementation, chosen by measurement on an AVX2 CPU
    (bench/bench_na.py): one frame for windows 3 frames deep (LTX-2.5's stages 1-4), two for deeper ones
    (its stage 5's 11), 4 x 8 tokens a frame: the fewer keys a block reads beyond its windows against
    larger matrix products and fewer copies of its keys."""
    return (1 if kernel[0] <= 3 else 2, 4, 8)


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


def na3d(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel, q_origin: Axes = (0, 0, 0),
         kv_origin: Axes = (0, 0, 0), grid: Axes | None = None, scale: float | None = None,
         impl: str = "auto") -> torch.Tensor:
    """Neighbourhood attention of the queries `q` (the box at `q_origin`) over the keys and values `k`, `v`
    (the box at `kv_origin`) of the grid `grid` (default: k's box is the whole grid). B,t,h,w,heads,D in,
    B,t,h,w,heads,D out (v's dtype). `scale` multiplies the scores (default head_dim ** -0.5; 1.0 for
    pre-scaled queries, as LTX-2.5's decoder passes)."""
    if impl not in IMPLS:
        raise ValueError(f"na3d impl must be one of {IMPLS}, got {impl!r}")
    part = part_of(q, k, v, kernel, q_origin, kv_origin, grid)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return (reference if impl == "reference" else blocked)(q, k, v, part, scale)


# --- the reference --------------------------------------------------------------------------------------

def _window_indices(part: Part) -> list[torch.Tensor]:
    """Per axis, (queries, K') indices into the key box of each query's window."""
    out = []
    for q0, n, k0, _, g, kernel in part.axes():
        starts = window_start(torch.arange(q0, q0 + n), kernel, g) - k0
        out.append(starts[:, None] + torch.arange(kernel))
    return out


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, part: Part, scale: float) -> torch.Tensor:
    """The definition: each query's window of keys gathered in (t, h, w) order, float32 softmax; a few
    query rows at a time (bounded memory)."""
    b, tq, hq, wq, heads, d = q.shape
    ti, hi, wi = (i.to(q.device) for i in _window_indices(part))
    window = math.prod(part.kernel)
    rows = max(1, BLOCKED_CALL_ELEMENTS // (b * wq * window * heads * d))
    out = torch.empty(q.shape, dtype=v.dtype, device=q.device)
    for t in range(tq):
        kf, vf = k[:, ti[t]].float(), v[:, ti[t]].float()  # B,Kt,hk,wk,heads,D
        for h0 in range(0, hq, rows):
            h = hi[h0:h0 + rows]
            index = (slice(None), slice(None), h[:, None, :, None], wi[None, :, None, :])
            # B,Kt,rows,wq,Kh,Kw,heads,D -> B,rows,wq,heads,Kt*Kh*Kw,D
            keys = kf[index].permute(0, 2, 3, 6, 1, 4, 5, 7).reshape(b, len(h), wq, heads, window, d)
            values = vf[index].permute(0, 2, 3, 6, 1, 4, 5, 7).reshape(b, len(h), wq, heads, window, d)
            query = q[:, t, h0:h0 + rows].float()  # B,rows,wq,heads,D
            scores = torch.einsum("bhwnd,bhwnkd->bhwnk", query, keys) * scale
            out[:, t, h0:h0 + rows] = torch.einsum("bhwnk,bhwnkd->bhwnd", scores.softmax(-1), values).to(v.dtype)
    return out


# --- blocked --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _AxisBlocks:
    """One axis of the blocked layout: block i computes the queries [query_start[i], + size) of the query box
    (the last block shifted back to end with the box) against the keys [key_start[i], + span) of the key
    box; `visible[i]` (size, span) says which of them each query sees, and blocks with the same `kind`
    see the same pattern (interior blocks all do), so they share one mask."""

    size: int
    span: int
    query_start: list[int]
    key_start: list[int]
    visible: torch.Tensor
    kind: list[int]


def _axis_blocks(q0: int, n: int, k0: int, kv: int, length: int, kernel: int, block: int) -> _AxisBlocks:
    size = min(block, n)
    query_start = [min(i * size, n - size) for i in range(-(-n // size))]
    queries = torch.tensor(query_start)[:, None] + torch.arange(size)  # blocks, size
    starts = window_start(q0 + queries, kernel, length)  # global, non-decreasing along each block
    span = min(size + kernel - 1, kv)
    first = torch.minimum(starts[:, 0], torch.tensor(k0 + kv - span))  # the block's keys, inside the given ones
    keys = first[:, None] + torch.arange(span)  # blocks, span (global)
    visible = (keys[:, None, :] >= starts[:, :, None]) & (keys[:, None, :] < starts[:, :, None] + kernel)
    patterns, kind = torch.unique(visible.flatten(1), dim=0, return_inverse=True)
    return _AxisBlocks(size, span, query_start, (first - k0).tolist(), patterns.view(-1, size, span), kind.tolist())


def compute_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype the blocked attention computes in: the input's where the device runs it natively
    (GPUs; CPUs with bf16/fp16 matrix units), else float32."""
    if dtype == torch.float32 or device.type != "cpu" or cpu_has_native(dtype):
        return dtype
    return torch.float32


def blocked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, part: Part, scale: float,
            block: Axes | None = None) -> torch.Tensor:
    """Blocks of `block` queries (default: `block_for` the window), each against the box of keys its
    windows cover (span = size + K' - 1 per axis), the rest of the box masked. The blocks of one frame
    block that share a mask go through one SDPA call (blocks * B, heads, queries, D), their boxes copied
    side by side."""
    b, _, _, _, heads, d = q.shape
    block = block or block_for(part.kernel)
    axes = [_axis_blocks(q0, n, k0, kv, g, kernel, blk) for (q0, n, k0, kv, g, kernel), blk in zip(part.axes(), block)]
    at, ah, aw = axes
    m, n_keys = math.prod(a.size for a in axes), math.prod(a.span for a in axes)
    dtype = compute_dtype(q.dtype, q.device)
    group = max(1, BLOCKED_CALL_ELEMENTS // (b * (heads * d * (m + 2 * n_keys))))
    out = torch.empty(q.shape, dtype=v.dtype, device=q.device)
    masks = {}
    for i, (qt, kt) in enumerate(zip(at.query_start, at.key_start)):
        by_kind = {}
        for j, kh_ in enumerate(ah.kind):
            for l, kw_ in enumerate(aw.kind):
                by_kind.setdefault((kh_, kw_), []).append((j, l))
        for (kind_h, kind_w), blocks in by_kind.items():
            key = (at.kind[i], kind_h, kind_w)
            if key not in masks:  # M,N: the product of the three axes' patterns, additive
                visible = (at.visible[key[0]][:, None, None, :, None, None] & ah.visible[kind_h][None, :, None, None, :, None]
                           & aw.visible[kind_w][None, None, :, None, None, :]).reshape(m, n_keys)
                masks[key] = torch.zeros(m, n_keys, dtype=dtype, device=q.device).masked_fill_(~visible, float("-inf"))
            for g0 in range(0, len(blocks), group):
                part_blocks = blocks[g0:g0 + group]
                boxes = [(slice(ah.query_start[j], ah.query_start[j] + ah.size), slice(aw.query_start[l], aw.query_start[l] + aw.size),
                          slice(ah.key_start[j], ah.key_start[j] + ah.span), slice(aw.key_start[l], aw.key_start[l] + aw.span))
                         for j, l in part_blocks]
                qs, ks = slice(qt, qt + at.size), slice(kt, kt + at.span)
                # G*B,(bt,bh,bw),heads,D -> G*B,heads,M,D (strided: SDPA reads it in place)
                qb = torch.stack([q[:, qs, hq, wq] for hq, wq, _, _ in boxes]).to(dtype).view(-1, m, heads, d).transpose(1, 2)
                kb = torch.stack([k[:, ks, hk, wk] for _, _, hk, wk in boxes]).to(dtype).view(-1, n_keys, heads, d).transpose(1, 2)
                vb = torch.stack([v[:, ks, hk, wk] for _, _, hk, wk in boxes]).to(dtype).view(-1, n_keys, heads, d).transpose(1, 2)
                o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=masks[key], scale=scale)
                # G*B,heads,M,D -> G,B,bt,bh,bw,heads,D
                o = o.transpose(1, 2).reshape(len(boxes), b, at.size, ah.size, aw.size, heads, d)
                for (hq, wq, _, _), block_out in zip(boxes, o):
                    out[:, qs, hq, wq] = block_out
    return out
