"""The batched multiplications of Winograd's step 4 (winograd.py), one function per route.

Each computes, for output frame t, mt[p] = sum_k v[(t + k) % kt, p] @ u[k, p]^T over the P Winograd
positions p: u (kt, P, Cout, Cin) the filter transform, v (kt, P, N, Cin) the ring of the last kt
transformed input frames, mt (P, N, Cout), all float32, N tiles. Which route is fastest depends on
the machine: MKL runs AVX2 code on AMD CPUs (85-100 GFLOP/s per Zen 5 core in this layout), oneDNN's
linear kernel AVX-512 (150-215); kernel_choice.py measures them.
"""
import torch


def gemm_mkl(u, v, t: int, mt) -> None:
    """mt[p] = sum_k v[(t + k) % kt, p] @ u[k, p]^T by torch.bmm (MKL on x86), accumulated in place."""
    kt = u.shape[0]
    torch.bmm(v[t % kt], u[0].transpose(1, 2), out=mt)
    for k in range(1, kt):
        mt.baddbmm_(v[(t + k) % kt], u[k].transpose(1, 2))


def gemm_onednn(u, v, t: int, mt) -> None:
    """As gemm_mkl, by oneDNN's linear kernel per position (x @ W^T with W (Cout, Cin), as stored in
    u), the later taps added by its fused sum post-op."""
    kt = u.shape[0]
    linear = torch.ops.mkldnn._linear_pointwise
    for pos in range(u.shape[1]):
        acc = linear(v[t % kt, pos], u[0, pos], None, "none", [], "")
        for k in range(1, kt):
            acc = linear.binary(v[(t + k) % kt, pos], acc, u[k, pos], None, "add")
        mt[pos].copy_(acc)


# The routes by name (winograd_conv3d's `gemm`).
GEMM_ROUTES = {"mkl": gemm_mkl, "onednn": gemm_onednn}
