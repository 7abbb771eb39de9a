"""The multiplications of Winograd's step 4 (winograd_job.py), one function per route.

Each computes out = window @ u^T for one Winograd position: window (N, K) the transformed input frames
an output frame reads (K = kt * Cin, taps side by side), u (Cout, K) the filter transform's, out
(N, Cout), all float32, N tiles. Which route is fastest depends on the machine: MKL runs AVX2 code on
AMD CPUs (about 105 GFLOP/s per Zen 5 core in these shapes), oneDNN's linear kernel AVX-512 (150-235);
kernel_choice.py measures them.
"""
import torch


def gemm_mkl(window, u, out) -> None:
    """out = window @ u^T by torch.mm (MKL on x86)."""
    torch.mm(window, u.t(), out=out)


def gemm_onednn(window, u, out) -> None:
    """As gemm_mkl, by oneDNN's linear kernel (x @ W^T with W (Cout, K), as stored in u)."""
    out.copy_(torch.ops.mkldnn._linear_pointwise(window, u, None, "none", [], ""))


# The routes by name (winograd_conv3d's `gemm`).
GEMM_ROUTES = {"mkl": gemm_mkl, "onednn": gemm_onednn}
