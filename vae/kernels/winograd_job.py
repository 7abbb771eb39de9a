"""The work of one Winograd conv (winograd.py), cut into jobs and run on one thread per core.

A job is one batch element x one slab of tile rows (x a part of the output channels when there are
fewer slabs than threads). It walks its frames; with P = (m+2)^2 Winograd positions, N tiles in the
slab, K = kt * Cin and everything float32 (buffers carved from the worker's workspace):
1. the frame's slab rows with their zero padding, channels last: S (Hs, Ws, Cin), one copy (a plain
   row copy from NDHWC activations, a transposing one from NCDHW);
2. its overlapping (m+2) x (m+2) tiles gathered position-major: D (P, N, Cin);
3. input transform, one GEMM: V = (B^T kron B^T) @ D (P, N, Cin), into a ring of the last kt frames;
4. per output frame t, per position p, one GEMM that sums the kt taps in K at once:
   M[p] = W[p] (N, K) @ U[p]^T, where U (P, Cout, K) is the cached filter transform and W[p] holds
   frames t..t+kt-1 of V[., p] side by side, copied out of the ring a row of m+2 positions at a time
   (a small buffer that stays in the core's cache). One GEMM with K = kt * Cin instead of kt with Cin:
   oneDNN ran 150 -> 210 GFLOP/s on a Zen 5 core at 128 channels. The GEMMs run on one of GEMM_ROUTES
   (winograd_gemm.py), which is measured per machine;
5. output transform and bias, one GEMM: Y = (A^T kron A^T) @ M + bias, copied into the frame's m x m
   tiles (cropped at the image edge).
Every output frame is computed by GEMMs of the same shapes whatever T is (the slab height does not
depend on T), so a clip run in any temporal chunking gives bit-identical frames, as with oneDNN.
"""
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import torch

# A worker keeps its workspace between convs up to this size, so the next conv reuses its pages instead
# of mapping fresh ones (each fresh page costs a fault and a zeroing); a larger workspace is dropped after
# the conv.
KEPT_WORKSPACE_BYTES = 32 << 20


def job_bytes(m: int, kt: int, cin: int, cout: int, n_r: int, n_w: int) -> int:
    """The float32 workspace of a job of n_r x n_w tiles (`run_job`'s buffers)."""
    return 4 * sum(math.prod(shape) for shape in _buffer_shapes(m, kt, cin, cout, n_r, n_w))


def _buffer_shapes(m: int, kt: int, cin: int, cout: int, n_r: int, n_w: int) -> list[tuple]:
    """S, D, the ring of V, the window of a row of positions, M, Y (module docstring)."""
    a, p, n = m + 2, (m + 2) ** 2, n_r * n_w
    window = (a, n, kt, cin) if kt > 1 else (0,)  # kt = 1: a position's window is its V
    return [(n_r * m + 2, n_w * m + 2, cin), (a, a, n_r, n_w, cin), (kt, p, n, cin), window, (p, n, cout),
            (m, m, n_r, n_w, cout)]


def run_job(x: torch.Tensor, out: torch.Tensor, u: torch.Tensor, bias: torch.Tensor | None, transforms, m: int,
            r0: int, r1: int, workspace, padding: int, gemm) -> None:
    """Output tile rows [r0, r1) of x (Cin,T,H,W) -> out (Cout,T-kt+1,H+2p-2,W+2p-2), all frames, either
    layout. u (P, Cout, kt*Cin): the filter transform of those output channels; bias (Cout,) float32 or
    None; transforms: (B^T kron B^T (P, P), A^T kron A^T (m^2, P)); gemm(window, u[p], out) a GEMM_ROUTES
    route; the buffers are carved from workspace(numel)."""
    cin, t_in, h, w = x.shape
    cout, t_out, h_out, w_out = out.shape
    a, n_r, n_w, p = m + 2, r1 - r0, -(-w_out // m), (m + 2) ** 2
    kt = u.shape[2] // cin
    kb, ka = transforms
    shapes = _buffer_shapes(m, kt, cin, cout, n_r, n_w)
    sizes = [math.prod(shape) for shape in shapes]
    s, d, ring, window, mt, y = (b.view(shape) for b, shape in zip(workspace(sum(sizes)).split(sizes), shapes))
    n = n_r * n_w
    # Slab rows top .. top + n_r*m + 1 and columns -padding .. n_w*m + 1 - padding of x, zeros outside it:
    # the zeros are written once, each frame overwrites the same inside.
    top = r0 * m - padding
    lo, hi = max(top, 0), min(top + n_r * m + 2, h)
    cols = min(w, n_w * m + 2 - padding)
    s.zero_()
    inside = s[lo - top:hi - top, padding:padding + cols]  # (rows, cols, Cin)
    gathered = s.unfold(0, a, m).unfold(1, a, m).permute(3, 4, 0, 1, 2)  # (a, a, n_r, n_w, Cin): the tiles
    bias_row = None if bias is None else bias.repeat(n).view(1, n * cout)  # (1, N*Cout): Y's bias, tile-major
    tiles = y.permute(4, 2, 0, 3, 1)  # (Cout, n_r, m, n_w, m)
    for f in range(t_in):
        # 1.-3. Padded slab, tiles, input transform into the ring.
        inside.copy_(x[:, f, lo:hi, :cols].permute(1, 2, 0))  # (Cin, rows, cols) -> (rows, cols, Cin)
        d.copy_(gathered)
        torch.mm(kb, d.view(p, -1), out=ring[f % kt].view(p, -1))
        t = f - kt + 1
        if t < 0:
            continue
        # 4. Output frame t: frames t..t+kt-1 are ring slots r..kt-1, 0..r-1.
        r = t % kt
        for row in range(0, p, a):
            if kt > 1:
                window[:, :, :kt - r].copy_(ring[r:, row:row + a].permute(1, 2, 0, 3))  # (a, N, kt - r, Cin)
                window[:, :, kt - r:].copy_(ring[:r, row:row + a].permute(1, 2, 0, 3))
            for i in range(a):
                gemm(ring[0, row + i] if kt == 1 else window[i].view(n, kt * cin), u[row + i], mt[row + i])
        # 5. Output transform + bias, scattered into the m x m tiles (cropped at the image edge).
        if bias_row is None:
            torch.mm(ka, mt.view(p, -1), out=y.view(m * m, -1))
        else:
            torch.addmm(bias_row, ka, mt.view(p, -1), out=y.view(m * m, -1))
        for rows, hr in _tile_runs(min(r1 * m, h_out) - r0 * m, m):
            for tcols, wr in _tile_runs(w_out, m):
                src = tiles[:, rows, :hr, tcols, :wr]
                y0, x0 = (r0 + rows.start) * m, tcols.start * m
                dst = out[:, t, y0:y0 + src.shape[1] * hr, x0:x0 + src.shape[3] * wr]
                dst.unflatten(2, (src.shape[3], wr)).unflatten(1, (src.shape[1], hr)).copy_(src)


def _tile_runs(size: int, m: int):
    """Runs of tiles covering `size` pixels: (full tiles, m) and, when size % m, (last tile, size % m)."""
    full = size // m
    runs = [(slice(0, full), m)] if full else []
    if size % m:
        runs.append((slice(full, full + 1), size % m))
    return runs


class Workers:
    """`threads` persistent worker threads, each with its own float32 workspace kept between convs (up
    to KEPT_WORKSPACE_BYTES).

    A job is a chain of mid-sized ops; run one after another with every op split over all cores, each op
    pays a fork/join, and on a busy machine a join waits for a descheduled thread (measured: several ms
    per op, slower than one thread). Whole jobs per core have no joins and keep each job in its core's
    cache; single-threaded MKL also computes a GEMM of given shapes the same way every time.
    """

    def __init__(self, threads: int):
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="streamvae-winograd")
        self._local = threading.local()

    def workspace(self, numel: int) -> torch.Tensor:
        """The calling worker's float32 buffer of at least `numel` elements (its first `numel`)."""
        buffer = getattr(self._local, "buffer", None)
        if buffer is None or buffer.numel() < numel:
            with torch.inference_mode(False):  # a normal tensor: a later call may run outside inference mode
                buffer = torch.empty(numel, dtype=torch.float32)
            if 4 * numel <= KEPT_WORKSPACE_BYTES:  # a larger one is used for this conv only; the kept one stays
                self._local.buffer = buffer
        return buffer[:numel]

    def run(self, work, jobs: list) -> None:
        """work(job) for every job, on the workers, each running its torch ops single-threaded.
        torch.set_num_threads sets the calling thread's OpenMP/MKL team (thread-local) and the process
        default (global), which is restored afterwards."""
        threads, inference = torch.get_num_threads(), torch.is_inference_mode_enabled()

        def one(job):
            torch.set_num_threads(1)
            # Grad and inference mode are thread-local: take the caller's (its tensors may be inference
            # tensors, which only inference mode may write).
            with torch.inference_mode(inference), torch.no_grad():
                work(job)

        try:
            list(self._pool.map(one, jobs))
        finally:
            torch.set_num_threads(threads)


@lru_cache(maxsize=None)
def workers(threads: int) -> Workers:
    """The process's workers for `threads` threads (created on first use)."""
    return Workers(threads)


def slabs(n_h: int, rows: int, jobs_per_slab: int, threads: int) -> list[tuple[int, int]]:
    """[(r0, r1)]: n_h tile rows cut into slabs of at most `rows` rows, of heights that differ by one at
    most, as many as make the jobs (slabs x jobs_per_slab) fill the threads evenly where the rows allow
    (11 slabs on 2 threads leave one thread idle for a twelfth of the conv)."""
    count = -(-n_h // rows)
    per_round = threads // math.gcd(threads, jobs_per_slab)  # slabs that make a whole round of jobs
    even = -(-count // per_round) * per_round
    count = even if even <= n_h else count
    bounds = [i * n_h // count for i in range(count + 1)]
    return list(zip(bounds, bounds[1:]))
