"""3-D neighbourhood attention as a Triton kernel (CUDA, ROCm; the CPU under TRITON_INTERPRET=1): forward only,
exactly `neighborhood.na3d`'s semantics for a `Part` (its module docstring defines the window); the torch
implementations there are the fallback and the reference.

The kernel. One program computes BLOCK_Q consecutive queries along w of one (t, h) row of the query box, for
one head of one batch element. Along t and h those queries share their window (a scalar start per axis),
so the program walks the K't x K'h key rows of that window; along w each query has its own window, and the
block's windows together cover at most BLOCK_Q + K'w - 1 keys of a row, read in chunks of BLOCK_K keys
(usually one), the keys outside each query's own window masked. Flash-attention style: scores and the
softmax's running max and sum in float32, the output accumulated in float32, nothing materialized
beyond one [BLOCK_Q, BLOCK_K] tile of scores; written once, in v's dtype.

Grid: (rows x w-blocks of the query box, heads, batch). The many programs go on axis 0 (CUDA allows up
to 2^31 - 1 there, 65535 on the others); consecutive programs are neighbouring blocks of one head, which
read mostly the same keys (they stay in L2).

Layout: q B,tq,hq,wq,heads,D (the query box), k and v B,tk,hk,wk,heads,D (the key box), the output
B,tq,hq,wq,heads,D; any strides (a tile's views of a qkv projection are not contiguous). Every offset is
64-bit: a stage-5 grid at 1080p holds more than 2^31 elements, where int32 index times stride wraps.
"""
import contextlib

import torch

from . import kernel_check
from .na_window import Part

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton is optional: neighborhood.na3d then uses its torch implementation
    triton = None

# Queries per program along w: 16, the smallest tile tl.dot takes. A query sees only K'w of the
# BLOCK_Q + K'w - 1 keys its block reads per row, so wider blocks compute mostly masked scores.
BLOCK_Q = 16
# The most keys of one row a program scores at once (its [BLOCK_Q, BLOCK_K] tile of scores in registers).
MAX_BLOCK_K = 64
HEAD_DIMS = (16, 32, 64, 128)
LOG2_E = 1.4426950408889634


if triton is not None:

    @triton.jit
    def _window_start(p, KERNEL: tl.constexpr, length):
        """First position of the window of position(s) p on an axis of `length` (neighborhood.window_start;
        KERNEL already clamped to the length)."""
        return tl.minimum(tl.maximum(p - KERNEL // 2, 0), length - KERNEL)

    @triton.jit
    def _dot(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
        """a @ b accumulated in float32. IEEE: float32 operands multiplied in full float32 (TF32 would round
        them to 1e-3). UPCAST: the operands converted to float32 first, for the interpreter, whose bf16
        tl.dot multiplies the bit patterns (triton-lang/triton#11584): bf16 products are exact in float32
        and a GPU's bf16 MMA accumulates them in float32, so the sums are the GPU's but for their order."""
        if UPCAST:
            product = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        elif IEEE:
            product = tl.dot(a, b, input_precision="ieee")
        else:
            product = tl.dot(a, b)
        return product

    @triton.jit
    def _na3d_kernel(q_ptr, k_ptr, v_ptr, out_ptr, scale_log2,
                     hq_size, wq_size, w_blocks,
                     q_t0, q_h0, q_w0, kv_t0, kv_h0, kv_w0, grid_t, grid_h, grid_w,
                     sqb, sqt, sqh, sqw, sqn, sqd, skb, skt, skh, skw, skn, skd,
                     svb, svt, svh, svw, svn, svd, sob, sot, soh, sow, son, sod,
                     KT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, D: tl.constexpr,
                     BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
        # program (row * w_blocks + w-block, head, batch): queries [w0, w0 + BLOCK_Q) of the query box's
        # row (t, h); positions below are the whole grid's unless named local
        blk = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1).to(tl.int64)
        batch = tl.program_id(2).to(tl.int64)
        row = blk // w_blocks
        t_local = row // hq_size
        h_local = row % hq_size
        w0_local = (blk % w_blocks) * BLOCK_Q
        lane = tl.arange(0, BLOCK_Q).to(tl.int64)
        valid = w0_local + lane < wq_size
        # lanes past the box's end copy its last query (a real window), and are not written
        w_query = q_w0 + tl.minimum(w0_local + lane, wq_size - 1)
        w_lo = _window_start(w_query, KW, grid_w)  # [BLOCK_Q]: each query's window along w
        t_first = _window_start(q_t0 + t_local, KT, grid_t)  # scalars: the row's window along t and h
        h_first = _window_start(q_h0 + h_local, KH, grid_h)
        # the keys of a row the block reads: from its first query's window start to its last one's end
        # (window starts do not decrease along w)
        k_first = _window_start(q_w0 + w0_local, KW, grid_w)
        k_end = _window_start(q_w0 + tl.minimum(w0_local + BLOCK_Q, wq_size) - 1, KW, grid_w) + KW

        d = tl.arange(0, D).to(tl.int64)
        q_tile = tl.load(q_ptr + batch * sqb + t_local * sqt + h_local * sqh + (w0_local + lane)[:, None] * sqw
                         + head * sqn + d[None, :] * sqd, mask=valid[:, None], other=0.0)  # [BLOCK_Q, D]
        k_base = k_ptr + batch * skb + head * skn
        v_base = v_ptr + batch * svb + head * svn
        running_max = tl.full([BLOCK_Q], float("-inf"), tl.float32)  # in log2 units (scores * scale * log2 e)
        running_sum = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, D], tl.float32)
        for t in range(t_first, t_first + KT):
            for h in range(h_first, h_first + KH):
                # offsets of the key row (t, h) in the key box (local: part_of checked the box holds it)
                k_row = k_base + (t - kv_t0) * skt + (h - kv_h0) * skh
                v_row = v_base + (t - kv_t0) * svt + (h - kv_h0) * svh
                for w_start in range(k_first, k_end, BLOCK_K):
                    w_key = w_start + tl.arange(0, BLOCK_K).to(tl.int64)
                    in_span = w_key < k_end
                    keys = tl.load(k_row + (w_key - kv_w0)[:, None] * skw + d[None, :] * skd, mask=in_span[:, None],
                                   other=0.0)  # [BLOCK_K, D]
                    values = tl.load(v_row + (w_key - kv_w0)[:, None] * svw + d[None, :] * svd, mask=in_span[:, None],
                                     other=0.0)
                    scores = _dot(q_tile, tl.trans(keys), IEEE, UPCAST)
                    seen = (w_key[None, :] >= w_lo[:, None]) & (w_key[None, :] < w_lo[:, None] + KW)
                    scores = tl.where(seen, scores * scale_log2, float("-inf"))  # [BLOCK_Q, BLOCK_K]
                    # NaN-dropping maxes (tl.max runs natively in the interpreter; a NaN-keeping combine function is
                    # interpreted element by element): a NaN score still makes its query's output NaN, as
                    # torch's softmax does, through its weight exp2(NaN - max)
                    new_max = tl.maximum(running_max, tl.max(scores, 1))
                    # finite from the first chunk on: every window starts among its row's first BLOCK_Q keys
                    # (BLOCK_K >= BLOCK_Q), so no query subtracts -inf from -inf (NaN)
                    weights = tl.exp2(scores - new_max[:, None])
                    rescale = tl.exp2(running_max - new_max)
                    running_sum = running_sum * rescale + tl.sum(weights, axis=1)
                    # the weights in v's dtype: a half dtype's product runs on the tensor cores
                    acc = acc * rescale[:, None] + _dot(weights.to(values.dtype), values, IEEE, UPCAST)
                    running_max = new_max
        out = acc / running_sum[:, None]
        tl.store(out_ptr + batch * sob + t_local * sot + h_local * soh + (w0_local + lane)[:, None] * sow + head * son
                 + d[None, :] * sod, out.to(out_ptr.dtype.element_ty), mask=valid[:, None])


def launch_config(part: Part, batch: int, heads: int) -> tuple[tuple[int, int, int], int]:
    """(grid, BLOCK_K) of the kernel for a part: one program per BLOCK_Q queries along w of each (t, h) row of
    the query box, per head and batch element; BLOCK_K: the keys a block's windows span in one row
    (BLOCK_Q + K'w - 1, to a power of two, at least BLOCK_Q: the kernel's first chunk of a row must hold a key
    of every query's window), at most MAX_BLOCK_K."""
    tq, hq, wq = part.q_size
    w_blocks = triton.cdiv(wq, BLOCK_Q)
    block_k = min(MAX_BLOCK_K, max(BLOCK_Q, triton.next_power_of_2(BLOCK_Q + part.kernel[2] - 1)))
    return (tq * hq * w_blocks, heads, batch), block_k


def computed_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.dtype:
    """The dtype the kernel computes q, k, v in: the widest of theirs."""
    return torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)


def takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernel computes these tensors: a head_dim of HEAD_DIMS, float32, bfloat16 or float16."""
    return q.shape[-1] in HEAD_DIMS and computed_dtype(q, k, v) in (torch.float32, torch.bfloat16, torch.float16)


def na3d(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, part: Part, scale: float) -> torch.Tensor:
    """Neighbourhood attention of the part's queries over its keys (neighborhood.na3d's semantics), B,t,h,w,
    heads,D in (any strides), B,t,h,w,heads,D out in v's dtype; q, k, v computed in the widest of their dtypes."""
    if triton is None:
        raise RuntimeError("the Triton na3d needs Triton (requirements-dev.txt installs it); impl='blocked' does not")
    if not takes(q, k, v):
        raise ValueError(f"the Triton na3d takes head_dim in {HEAD_DIMS} and float32, bfloat16 or float16; got "
                         f"head_dim {q.shape[-1]}, {q.dtype}, {k.dtype}, {v.dtype}")
    b, tq, hq, wq, heads, d = q.shape
    dtype = computed_dtype(q, k, v)
    q, k, v_in = q.to(dtype), k.to(dtype), v.to(dtype)
    out = torch.empty(q.shape, dtype=v.dtype, device=q.device)
    grid, block_k = launch_config(part, b, heads)
    # Triton launches on the current GPU, which need not be q's (cuda:1)
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        _na3d_kernel[grid](q, k, v_in, out, scale * LOG2_E, hq, wq, triton.cdiv(wq, BLOCK_Q),
                           *part.q_origin, *part.kv_origin, *part.grid,
                           *q.stride(), *k.stride(), *v_in.stride(), *out.stride(),
                           KT=part.kernel[0], KH=part.kernel[1], KW=part.kernel[2], D=d, BLOCK_Q=BLOCK_Q,
                           BLOCK_K=block_k, IEEE=dtype == torch.float32,
                           UPCAST=kernel_check.INTERPRETED and dtype == torch.bfloat16)
    return out

