"""3-D neighbourhood attention (NATTEN's and comfy-kitchen's `na3d` semantics, dilation 1), for a part of
the grid: the queries of one box, the keys and values of a box around it.

The window. Along an axis of the whole grid of length L, with kernel K (K' = min(K, L): a kernel larger
than the grid shrinks to it), the query at position p attends the K' positions from
s = clamp(p - K' // 2, 0, L - K'): centred where it fits, shifted inward at the grid's borders. The
window is the product of the three axes' windows; every query attends exactly K't * K'h * K'w keys.

A part (the window and the part are na_window.py's). Queries `q` are the box of the grid starting at
`q_origin`; keys and values `k`, `v` the box starting at `kv_origin`, which must hold every window of those
queries (`na_window.key_box` says which box that is); `grid` is the whole grid's (T, H, W). The shift
happens at the grid's borders only, never at a box's, so a tile with its halo gives exactly the whole
grid's rows. Layout of q, k, v and the result: B, t, h, w, heads, head_dim (channels last, heads before
the head's channels, as core's `na3d`).

Implementations (`na3d(impl=)`):
- "reference": the definition, query by query: each query's window gathered and a float32 softmax.
- "blocked": blocks of queries against the box their windows cover, many blocks per batched
  scaled-dot-product-attention call, the keys outside each query's window masked out; computed in
  bf16/fp16 where the device computes them natively, else in float32. Any device.
- "c": a compiled C kernel for the CPU (cpu_na.py, cpu_na.c): each group of queries along w reads its windows'
  key rows in place, float32 softmax and accumulation; built at first use by the machine's C compiler (none: it
  is not available). CPU tensors; head_dim a multiple of 16; windows at most 16 wide along w.
- "triton": a flash-attention style Triton kernel (triton_na.py): each block of queries along w walks
  its window's key rows, float32 softmax and accumulation, nothing gathered. CUDA and ROCm GPUs (and the
  CPU under TRITON_INTERPRET=1, how CI proves it against the reference; tests/test_triton_targets.py
  compiles it for the GPU targets); head_dim 16, 32, 64 or 128.
- "auto": triton for tensors on a GPU where Triton imports, the kernel takes their head_dim and dtype and
  passed its first-use check there (`passes_check`); c for CPU tensors where it was built, takes the call and
  passed its first-use check (1.8-3.1x the blocked implementation's speed, bench/RESULTS.md section 29); else
  blocked (the torch fallback).
"""
import logging
import math
import warnings
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from . import kernel_check
from .backend import cpu_has_native
from .na_window import Axes, Part, part_of, window_start

IMPLS = ("auto", "reference", "blocked", "c", "triton")
# Elements of one blocked call's gathered queries, keys, values and mask (bounds its transient memory).
BLOCKED_CALL_ELEMENTS = 1 << 25
# The first-use check (`passes_check`; B,T,H,W of its grid, 2 heads; windows): a grid smaller than the window
# along t and h, larger along w (the window shifts at its borders), a partial block of queries; small, as the
# interpreter runs it in CI. Allowed error relative to max(1, |reference|) by dtype (float32 in full float32;
# half precision rounds the softmax weights and the output: a few ulps).
CHECK_SHAPE, CHECK_KERNEL = (1, 3, 5, 18), (11, 11, 11)
CHECK_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.5e-2, torch.float16: 1.5e-2}
log = logging.getLogger("streamvae")


def block_for(kernel: Axes) -> Axes:
    """Queries per block (t, h, w) of the blocked implementation, chosen by measurement on an AVX2 CPU
    (bench/bench_na.py): one frame for windows 3 frames deep (LTX-2.5's stages 1-4), two for deeper ones
    (its stage 5's 11), 4 x 8 tokens a frame: the fewer keys a block reads beyond its windows against
    larger matrix products and fewer copies of its keys."""
    return (1 if kernel[0] <= 3 else 2, 4, 8)


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
    impl = resolved_impl(impl, q, k, v, part)
    if impl in COMPILED:
        return _compiled(impl).na3d(q, k, v, part, scale)
    return (reference if impl == "reference" else blocked)(q, k, v, part, scale)


COMPILED = ("c", "triton")  # the implementations with a first-use check (`passes_check`)


def _compiled(impl: str):
    """The module of a compiled implementation, imported where it runs (triton_na imports Triton)."""
    if impl == "c":
        from . import cpu_na

        return cpu_na
    from . import triton_na

    return triton_na


def resolved_impl(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, part: Part) -> str:
    """The implementation `impl` names for these tensors: "auto" is "triton" for GPU tensors (CUDA or ROCm,
    both torch's "cuda") where Triton imports, the kernel takes their head_dim and dtypes and passed its first-use
    check on that device (`passes_check`); "c" for CPU tensors where the C kernel is built, takes the call and
    passed its check; else "blocked"."""
    if impl != "auto":
        return impl
    if q.is_cuda:
        from . import triton_na

        if (triton_na.triton is not None and triton_na.takes(q, k, v)
                and passes_check("triton", str(q.device), triton_na.computed_dtype(q, k, v), q.shape[-1])):
            return "triton"
    elif q.device.type == "cpu":
        from . import cpu_na

        if cpu_na.takes(q, part) and cpu_na.library() is not None and passes_check("c", "cpu", torch.float32, q.shape[-1]):
            return "c"
    return "blocked"


@lru_cache(maxsize=None)
def passes_check(impl: str, device: str, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the compiled implementation `impl` ("c" or "triton", built by this machine's compiler for
    `device`) computes `dtype` at `head_dim` as the reference does: checked once per process before its first use
    there (a compile that fails, a launch the GPU refuses, a compiler's wrong code: no GPU of the pack's CI runs
    Triton's). One that fails is not used in this process ("auto" runs the blocked torch path) and one warning
    says why."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*CHECK_SHAPE, 2, head_dim, generator=g).to(device=device, dtype=dtype) for _ in range(3))
    part = part_of(q, k, v, CHECK_KERNEL, (0, 0, 0), (0, 0, 0), None)
    try:
        got = _compiled(impl).na3d(q, k, v, part, head_dim ** -0.5).float()
        want = reference(q, k, v, part, head_dim ** -0.5).float()
        error = ((got - want).abs().max() / max(1.0, want.abs().max().item())).item()
    except Exception as failure:  # noqa: BLE001 - any failure of the compile or launch means: not this kernel
        reason = kernel_check.error_line(failure)
    else:
        if error <= CHECK_TOLERANCE[dtype]:  # NaN compares False: a failure
            return True
        reason = f"it differs from the reference by {error:.2e} (allowed {CHECK_TOLERANCE[dtype]:.0e})"
    name = {"c": "C", "triton": "Triton"}[impl]
    message = (f"StreamVAE: the {name} neighbourhood-attention kernel failed its first-use check on {device} in "
               f"{dtype} ({reason}); the torch implementation runs instead (same results, slower)")
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=2)
    return False


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
