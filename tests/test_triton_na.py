"""The Triton neighbourhood-attention kernel (vae/kernels/triton_na.py) equals `neighborhood.reference`.

CI has no GPU: the kernel runs in Triton's interpreter (TRITON_INTERPRET=1) in a subprocess, as
tests/test_triton_kernels.py runs the norm kernels, on tiny shapes (the interpreter takes ~10 ms per key
row a block of queries visits). The cases cover LTX-2.5's windows (3,5,5), (3,7,7) and (11,11,11) on grids
smaller than the window along some axes (the window shrinks to the grid) and larger along others (it
shifts inward at the borders), a tile of queries with its halo of keys (non-zero origins), query rows
longer than one block (a partial block), a window wider than the keys a program scores at once, batch 2
and 2 heads, head_dim 16 and 64, strided k and v (views of one qkv projection, as the model's), float32 and
bfloat16. On CUDA the same comparisons run natively.
"""
import pytest
import torch

from vae.kernels import na_window
from vae.kernels import neighborhood as na

triton = pytest.importorskip("triton", reason="Triton is not installed (requirements-dev.txt installs it)")
from tests.test_triton_kernels import interpreted  # noqa: E402 (needs Triton)


def err(got: torch.Tensor, want: torch.Tensor) -> float:
    """The difference relative to max(1, max |want|), as every exactness bound."""
    return ((got.float() - want.float()).abs().max() / max(1.0, want.abs().max().item())).item()


def box(x: torch.Tensor, origin, size) -> torch.Tensor:
    """x's box [origin, origin + size) of t, h, w (B,t,h,w,heads,D)."""
    return x[(slice(None), *(slice(o, o + n) for o, n in zip(origin, size)))]


def compare(shape, kernel, q_origin, q_size, dtype: torch.dtype, device: str, seed: int) -> float:
    """`err` of the Triton kernel against the reference for the queries of the box (q_origin, q_size) of a grid
    of `shape` (B,T,H,W,heads,D) over their keys' box (`key_box`), inputs in `dtype` on `device`."""
    b, t, h, w, heads, d = shape
    g = torch.Generator().manual_seed(seed)
    # B,T,H,W,3,heads,D -> 3 x B,T,H,W,heads,D: strided, as the model's views of its qkv projection
    q, k, v = (2 * torch.randn(b, t, h, w, 3, heads, d, generator=g)).to(dtype).to(device).unbind(4)
    kv_origin, kv_size = na_window.key_box(q_origin, q_size, kernel, (t, h, w))
    args = (box(q, q_origin, q_size), box(k, kv_origin, kv_size), box(v, kv_origin, kv_size), kernel, q_origin,
            kv_origin, (t, h, w))
    got = na.na3d(*args, scale=0.3, impl="triton")
    want = na.na3d(*args, scale=0.3, impl="reference")  # float32 from the same (bf16) inputs
    assert got.dtype == dtype and got.shape == want.shape
    return err(got, want)


# shape (B,T,H,W,heads,D), kernel, query box (origin, size): a whole grid, or a tile with its halo
CASES = [((2, 2, 6, 19, 2, 16), (3, 5, 5), (0, 0, 0), (2, 6, 19)),  # t < 3; two blocks along w, one partial
         ((1, 5, 12, 24, 2, 64), (3, 7, 7), (3, 9, 3), (2, 3, 17)),  # a tile at the grid's t, h, w borders
         ((1, 4, 12, 13, 1, 16), (11, 11, 11), (1, 5, 0), (2, 2, 13)),  # t < 11; h, w > 11
         # a window wider than the keys a program scores at once (MAX_BLOCK_K): a row in two chunks, the
         # second seen by some of the block's queries only
         ((1, 1, 2, 70, 1, 16), (1, 1, 55), (0, 0, 0), (1, 2, 70))]

PARITY = """
    import torch
    from tests.test_triton_na import CASES, compare

    fp32 = max(compare(*case, torch.float32, "cpu", seed) for seed, case in enumerate(CASES))
    bf16 = max(compare(*CASES[i], torch.bfloat16, "cpu", 10 + i) for i in (1, 2))
    print(fp32, bf16)
"""

# bf16: the kernel rounds the softmax weights to bf16 for the tensor cores' weights x values product and its
# output to bf16; the reference (float32 from the same bf16 inputs) rounds only its output. Each rounding is
# 2^-9 relative on GPUs and 2^-8 in the interpreter (which truncates): a few bf16 ulps of the output apart.
BF16_BOUND = 1.5e-2


def test_kernel_matches_the_reference_in_the_interpreter():
    fp32, bf16 = (float(x) for x in interpreted(PARITY).split())
    assert fp32 < 1e-5, f"float32: {fp32:.2e} relative"
    assert bf16 < BF16_BOUND, f"bfloat16: {bf16:.2e} relative"


# A NaN in a query makes its output NaN; a NaN in a key makes NaN the outputs of exactly the queries whose
# windows hold it (their scores' NaN reaches the output through the softmax weights, whatever the running
# max does with it), as the reference; nothing else changes. (A NaN in v is not compared: a block's weights x
# values product multiplies it by the zero weights of the queries that do not see it, giving NaN there, as
# the blocked implementation's masked SDPA does; the reference gathers each window alone.)
NAN = """
    import torch
    from vae.kernels import neighborhood as na

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 3, 3, 20, 1, 16, generator=g) for _ in range(3))
    q[0, 1, 1, 2, 0, 5] = float("nan")
    k[0, 2, 0, 17, 0, 3] = float("nan")
    got, want = (na.na3d(q, k, v, (3, 3, 5), scale=0.3, impl=impl) for impl in ("triton", "reference"))
    nan = want.isnan()
    assert 0 < nan.sum() < nan.numel()
    print(int((got.isnan() != nan).sum()), ((got - want)[~nan].abs().max()).item())
"""


def test_nan_reaches_the_outputs_the_reference_gives_nan_in_the_interpreter():
    mismatched, worst = interpreted(NAN).split()
    assert int(mismatched) == 0, f"{mismatched} outputs NaN in one and not the other"
    assert float(worst) < 1e-5


# The first-use check in the interpreter: the kernel passes it; the same kernel launched with its scores
# doubled (a stand-in for a compiler's wrong code) and a launch that raises (one the GPU refuses) fail it, each
# with one warning that names the device and why, and the verdict is kept for the process.
FIRST_USE = """
    import warnings
    import torch
    from vae.kernels import neighborhood, triton_na

    passed = neighborhood.passes_check("triton", "cpu", torch.float32, 16)
    neighborhood.passes_check.cache_clear()
    launch = triton_na._na3d_kernel

    class Fault:
        def __getitem__(self, grid):
            if "{fault}" == "raise":
                raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
            # argument 4 is the scores' scale (times log2 e)
            return lambda *args, **kw: launch[grid](*args[:4], args[4] * 2, *args[5:], **kw)

    triton_na._na3d_kernel = Fault()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        verdict = neighborhood.passes_check("triton", "cpu", torch.float32, 16)
        again = neighborhood.passes_check("triton", "cpu", torch.float32, 16)
    print(passed, verdict, again, len(caught), str(caught[0].message).replace(" ", "_") if caught else "-")
"""


@pytest.mark.parametrize("fault", ["wrong values", "raise"])
def test_a_kernel_that_fails_its_first_use_check_is_not_used(fault):
    passed, verdict, again, warned, message = interpreted(FIRST_USE.replace("{fault}", fault)).split()
    assert passed == "True", "the kernel itself fails the check"
    assert (verdict, again, warned) == ("False", "False", "1"), (verdict, again, warned)
    assert "first-use_check_on_cpu" in message and "torch_implementation_runs_instead" in message, message


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_matches_the_reference_on_cuda():
    """Natively, with the same cases as the interpreter and LTX-2.5's head_dim 64 at larger grids, in float32
    (no TF32), bfloat16 and float16; "auto" picks the kernel there."""
    from vae.kernels import BackendFlags, backend

    cases = CASES + [((1, 13, 40, 72, 4, 64), (11, 11, 11), (0, 0, 0), (13, 40, 72)),
                     ((2, 6, 30, 50, 4, 64), (3, 7, 7), (2, 8, 10), (3, 16, 33)),
                     ((1, 5, 20, 36, 2, 128), (3, 5, 5), (0, 0, 0), (5, 20, 36))]
    with backend.applied(BackendFlags(tf32=False)):  # TF32 would round the float32 reference to 1e-3
        for seed, case in enumerate(cases):
            assert compare(*case, torch.float32, "cuda", seed) < 1e-5, case
            for dtype in (torch.bfloat16, torch.float16):
                assert compare(*case, dtype, "cuda", seed) < BF16_BOUND, (case, dtype)
    q = torch.zeros(1, 2, 3, 4, 1, 64, device="cuda", dtype=torch.bfloat16)
    part = na_window.part_of(q, q, q, (3, 3, 3), (0, 0, 0), (0, 0, 0), None)
    assert na.resolved_impl("auto", q, q, q, part) == "triton"
    q8 = q[..., :8]  # head_dim 8: not the kernel's
    assert na.resolved_impl("auto", q8, q8, q8, na_window.part_of(q8, q8, q8, (3, 3, 3), (0, 0, 0), (0, 0, 0), None)) == "blocked"
