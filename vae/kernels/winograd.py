"""Winograd F(m x m, 3 x 3) convolution: the 3x3 spatial part of stride-1 causal conv3d on the CPU.

Computes what `F.conv3d(x, w, b, stride=1, padding=(0, 1, 1))` does for x (B,Cin,T,H,W) and
w (Cout,Cin,kt,3,3), i.e. out[:, :, t] = sum_k conv2d(x[:, :, t + k], w[:, :, k], padding=1) + b,
output (B,Cout,T-kt+1,H,W); or the same with padding 0 ("valid": what an exact tile with its halo
needs). A direct 3x3 conv spends 9 multiply-adds per output pixel and channel pair; F(m, 3) gets an
m x m output tile from an (m+2) x (m+2) input tile with (m+2)^2 of them: 2.25 instead of 9 for
m = 4 (4x less arithmetic), 4 for m = 2. The price is two cheap (memory-bound) transforms and more
rounding as m grows.

This module holds the transforms and the dispatch: the filter transform U (P, Cout, kt*Cin), kept in
the filter cache (filter_cache.py), and the cut of a conv into jobs of slabs of tile rows, run on one
thread per core (winograd_job.py, which says what a job computes). The jobs in flight hold at most
one output frame's size (or 24 MiB per thread) of working memory.
"""
import math
from fractions import Fraction
from functools import lru_cache

import torch

from .filter_cache import FilterCache
from .activation_layout import by_output_channels, empty_video
from .winograd_gemm import GEMM_ROUTES
from .winograd_job import job_bytes, run_job, slabs, workers

# Interpolation points (plus the point at infinity) of each tile size. For m = 4 the asymmetric set
# {0, 1, -1, 2, -1/2} has smaller, better balanced transform entries than the textbook {0, +-1, +-2}:
# on a 256-channel conv its float32 error was 2.7x smaller (max) and 1.5x (rms), and it beat
# {0, +-1, +-1/2} and {0, 1, -1, 1/2, -2} too.
POINTS = {
    2: (0, 1, -1),
    4: (0, 1, -1, 2, Fraction(-1, 2)),
    6: (0, 1, -1, 2, -2, Fraction(1, 2), Fraction(-1, 2)),
}
DEFAULT_TILE = 4
# Working-set budget of the jobs in flight: one output frame's size, but at least this per thread, so
# small layers still run as a few large GEMMs (their memory is negligible) instead of many small ones
# (at 128 channels a job needs 10 MB per row of 80 tiles).
MIN_WORKSPACE_BYTES = 24 << 20
# GEMM columns (tiles per frame) a slab aims for: MKL needs about this many to run near its peak; more
# only grow the working set past the caches.
SLAB_COLUMNS = 256
# Output channels per part when a conv is split by channels to give every thread work.
MIN_PART_CHANNELS = 64
# Jobs run on worker threads only with OpenMP, whose thread counts are per thread (`Workers.run`).
_OPENMP = "ATen parallel backend: OpenMP" in torch.__config__.parallel_info()

# Output pixels (H x W x output frames) of one call above which an uncached filter transform pays for
# itself: measured on a 2-core AVX2 CPU in fp32, transform + Winograd beat oneDNN at 32x32 x 4 output
# frames (512 and 1024 channels) and lost at 16x16 x 2 frames.
UNCACHED_MIN_OUTPUT_PIXELS = 4096
# A conv whose filter transform the cache will not keep computes it for the call: 4x the weight in
# fresh float32 memory (0.45 GB for a 1024-channel 3x3x3 conv), on top of a full cache. Such a transform
# above this size is computed and used a group of output channels at a time, so the transient is a
# group's (each group repeats the input transform: transforms the cache keeps run whole).
GROUP_TRANSFORM_BYTES = 64 * 2**20



@lru_cache(maxsize=None)
def winograd_matrices(m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A^T (m, a), G (a, 3), B^T (a, a)) float64 for F(m, 3), a = m + 2, such that for an input row
    d (a) and filter g (3): A^T ((G g) * (B^T d)) == [sum_k d[i + k] g[k] for i < m] (correlation).

    Toom-Cook with the points of POINTS[m] and infinity, built exactly with fractions: evaluation
    at the points (A^T, G), interpolation through the Lagrange basis (B^T, its denominators in G).
    """
    pts = [Fraction(p) for p in POINTS[m]]
    a = m + 2

    def poly(roots):  # coefficients (lowest power first, length a) of prod (x - root)
        coeffs = [Fraction(1)]
        for root in roots:
            coeffs = [(coeffs[i - 1] if i else 0) - root * (coeffs[i] if i < len(coeffs) else 0)
                      for i in range(len(coeffs) + 1)]
        return coeffs + [Fraction(0)] * (a - len(coeffs))

    def denom(j):
        out = Fraction(1)
        for i, p in enumerate(pts):
            out *= pts[j] - p if i != j else 1
        return out

    at = [[p ** i for p in pts] + [Fraction(int(i == m - 1))] for i in range(m)]
    g = [[p ** k / denom(j) for k in range(3)] for j, p in enumerate(pts)] + [[0, 0, 1]]
    bt = [poly(pts[:j] + pts[j + 1:]) for j in range(a - 1)] + [poly(pts)]
    as_tensor = lambda rows: torch.tensor([[float(v) for v in row] for row in rows], dtype=torch.float64)
    return as_tensor(at), as_tensor(g), as_tensor(bt)


@lru_cache(maxsize=None)
def _filter_matrix(m: int) -> torch.Tensor:
    """G kron G (P, 9) float32: the 2-D filter transform of flattened 3x3 kernels."""
    _, g, _ = winograd_matrices(m)
    return torch.kron(g, g).float()


@lru_cache(maxsize=None)
def _data_transforms(m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B^T kron B^T (P, P), A^T kron A^T (m^2, P)) float32: the 2-D transforms of flattened tiles."""
    at, _, bt = winograd_matrices(m)
    return torch.kron(bt, bt).float(), torch.kron(at, at).float()


def _transform_key(weight: torch.Tensor, m: int) -> tuple:
    return (m, weight.data_ptr(), weight.shape, weight.stride(), weight.dtype)


def transform_nbytes(weight_shape, m: int = DEFAULT_TILE) -> int:
    """Bytes of the float32 filter transform of a (Cout, Cin, kt, 3, 3) weight: (m + 2)^2 positions
    per output/input channel pair and tap, 4x the weight's float32 size for m = 4."""
    return 4 * (m + 2) ** 2 * math.prod(weight_shape[:3])


def transform_pays(x: torch.Tensor, weight: torch.Tensor, cache: FilterCache, m: int = DEFAULT_TILE) -> bool:
    """Whether Winograd beats oneDNN on this call once its filter transform is counted.

    A cached transform always pays (above the dispatch's frame-size floor). Otherwise computing one
    costs about as much as the conv saves on UNCACHED_MIN_OUTPUT_PIXELS output pixels (4x the weight
    in fresh float32 memory, whatever the channels), so a call that is smaller, and whose transform
    the cache would not keep for the next chunk, runs faster on oneDNN: Wan2.2's 1024-channel convs at
    16x16 latent pixels, whose transforms alone are 7.7 GiB, 2.6x the cache.
    """
    h, w = x.shape[-2:]
    if h * w * (x.shape[2] - weight.shape[2] + 1) >= UNCACHED_MIN_OUTPUT_PIXELS:
        return True
    return cache.holds_or_admits(weight, _transform_key(weight, m), transform_nbytes(weight.shape, m), priority=h * w)


def filter_transform(weight: torch.Tensor, cache: FilterCache, m: int = DEFAULT_TILE, priority: float = 0) -> torch.Tensor:
    """U (P, Cout, kt*Cin) float32 of weight (Cout, Cin, kt, 3, 3): U[p, o, k*Cin + i] is position p of
    G w[o, i, k] G^T, the taps side by side in K as a job's windows hold their frames. Cached per weight
    tensor (or view of one) in `cache` (capped; `priority`, the conv's frame pixels, decides which
    transforms stay when not all fit) and recomputed when it changes in place (version counter). 4x the
    weight's float32 size (P = 36 positions per 9 taps).

    One GEMM (G kron G) @ w in float32: a float64 transform is 4-5x slower (the first decode computes
    every layer's) and only moves the conv's rms error by 2-3%."""
    key = _transform_key(weight, m)

    def compute():
        cout, cin, kt = weight.shape[:3]
        with torch.no_grad():
            taps = weight.detach().to("cpu", torch.float32).permute(3, 4, 0, 2, 1)  # (3, 3, Cout, kt, Cin)
            return torch.mm(_filter_matrix(m), taps.reshape(9, -1)).view(-1, cout, kt * cin)  # (P, Cout, kt*Cin)

    return cache.get(weight, key, compute, priority, transform_nbytes(weight.shape, m))


def winograd_conv3d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cache: FilterCache,
                    m: int = DEFAULT_TILE, padding: int = 1, gemm: str = "mkl") -> torch.Tensor:
    """F.conv3d(x, weight, bias, stride=1, padding=(0, padding, padding)) by Winograd F(m x m, 3 x 3),
    the filter transforms kept in `cache` (`filter_cache()`).

    x (B,Cin,T,H,W) on the CPU, either layout, any float dtype (computed in float32, returned in
    x.dtype); weight (Cout,Cin,kt,3,3) with T >= kt; padding 1 ("same": any H, W >= 1) or 0 ("valid", as
    exact tiling uses on a tile with its halo: H, W >= 3); `gemm` one of GEMM_ROUTES (winograd_gemm.py).
    Returns (B,Cout,T-kt+1,H+2p-2,W+2p-2), in the layout of x.
    """
    if gemm not in GEMM_ROUTES:
        raise ValueError(f"gemm must be one of {GEMM_ROUTES}, got {gemm!r}")
    b, cin, t_in, h, w = x.shape
    cout, _, kt = weight.shape[:3]
    h_out, w_out = h + 2 * padding - 2, w + 2 * padding - 2
    key, nbytes = _transform_key(weight, m), transform_nbytes(weight.shape, m)
    group = cout if nbytes <= GROUP_TRANSFORM_BYTES or cache.holds_or_admits(weight, key, nbytes, priority=h * w) else \
        max(1, cout * GROUP_TRANSFORM_BYTES // nbytes)
    if group < cout:  # a large transform the cache will not keep: output channels a group at a time
        return by_output_channels(lambda w, b: winograd_conv3d(x, w, b, cache, m, padding, gemm), weight, bias, group)
    n_h, n_w = -(-h_out // m), -(-w_out // m)
    u = filter_transform(weight, cache, m, priority=h * w)
    bias32 = None if bias is None else bias.detach().float()
    out = empty_video(x, (b, cout, t_in - kt + 1, h_out, w_out))
    threads = torch.get_num_threads() if _OPENMP else 1

    # Slab height in tile rows: about SLAB_COLUMNS tiles, with the workspaces of the jobs in flight
    # within one output frame's size or the floor. It never depends on T, nor then do the GEMM shapes.
    budget = max(out[0, :, 0].nbytes // threads, MIN_WORKSPACE_BYTES)
    rows = max(1, min(n_h, -(-SLAB_COLUMNS // n_w), budget // job_bytes(m, kt, cin, cout, 1, n_w)))
    # Fewer slabs than threads (small frames, many channels): split the output channels as well; each
    # part repeats the slab's input transform, which is small next to its GEMMs there.
    parts = threads if b * -(-n_h // rows) < threads and cout >= threads * MIN_PART_CHANNELS else 1
    step = -(-cout // parts)
    jobs = [(i, r0, r1, slice(c, c + step)) for i in range(b) for r0, r1 in slabs(n_h, rows, b * parts, threads)
            for c in range(0, cout, step)]
    pool, transforms, route = workers(threads), _data_transforms(m), GEMM_ROUTES[gemm]

    def work(job):
        i, r0, r1, chans = job
        run_job(x[i], out[i, chans], u[:, chans], None if bias32 is None else bias32[chans], transforms, m, r0, r1,
                pool.workspace, padding, route)

    if threads > 1:
        pool.run(work, jobs)
    else:
        for job in jobs:
            work(job)
    return out
