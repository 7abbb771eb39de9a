"""Winograd F(m x m, 3 x 3) convolution: the 3x3 spatial part of stride-1 causal conv3d on the CPU.

Computes what `F.conv3d(x, w, b, stride=1, padding=(0, 1, 1))` does for x (B,Cin,T,H,W) and
w (Cout,Cin,kt,3,3), i.e. out[:, :, t] = sum_k conv2d(x[:, :, t + k], w[:, :, k], padding=1) + b,
output (B,Cout,T-kt+1,H,W); or the same with padding 0 ("valid": what an exact tile with its halo
needs). A direct 3x3 conv spends 9 multiply-adds per output pixel and channel pair; F(m, 3) gets an
m x m output tile from an (m+2) x (m+2) input tile with (m+2)^2 of them: 2.25 instead of 9 for
m = 4 (4x less arithmetic), 4 for m = 2. The price is two cheap (memory-bound) transforms and more
rounding as m grows.

The work is cut into jobs (batch element x slab of tile rows, x output channels when there are
fewer slabs than threads), run on one thread per core. A job walks its frames; with P = (m+2)^2
Winograd positions and N tiles per frame in the slab, everything float32:
1. the frame's slab rows plus their one-pixel zero halo: S (Cin, Hs, Ws);
2. the overlapping (m+2) x (m+2) tiles gathered position-major: D (P, N, Cin);
3. input transform, one GEMM: V = (B^T kron B^T) @ D, kept in a ring of the last kt frames;
4. per output frame t, per temporal tap k, one batched GEMM over the P positions, accumulated:
   M[p] = sum_k V[t + k, p] @ U[k, p]^T (U (kt, P, Cout, Cin) is the cached filter transform; V[., p]
   is (N, Cin), M[p] (N, Cout): tiles-major, the layout of a linear layer's input and output).
   Summing the taps in K = kt*Cin at once would need the kt frames adjacent in memory; per tap, the
   ring keeps the working set per frame constant, and the shorter sums round a little less. The
   GEMMs run on one of GEMM_ROUTES (winograd_gemm.py: MKL's torch.bmm or oneDNN's linear kernel);
   which is faster is measured per machine (kernel_choice.py);
5. output transform, Y = (A^T kron A^T) @ M, scattered into the frame's m x m tiles + bias.
Every output frame is computed by GEMMs of the same shapes whatever T is (the slab height does not
depend on T), so a clip run in any temporal chunking gives bit-identical frames, as with oneDNN.
The jobs in flight hold at most one output frame's size (or 32 MiB) of working memory.
"""
import math
import os
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from functools import lru_cache

import torch
import torch.nn.functional as F

from .layout import by_output_channels, empty_video
from .winograd_gemm import GEMM_ROUTES

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
# Working-set budget of the jobs in flight: one output frame's size, but at least this, so small layers
# still run as a few large GEMMs (their memory is negligible) instead of many small ones.
MIN_WORKSPACE_BYTES = 32 << 20
# GEMM columns (tiles per frame) a slab aims for: MKL needs about this many to run near its peak; more
# only grow the working set past the caches.
SLAB_COLUMNS = 256
# Output channels per part when a conv is split by channels to give every thread work.
MIN_PART_CHANNELS = 64
# Jobs run on worker threads only with OpenMP, whose thread counts are per thread (see _run_parallel).
_OPENMP = "ATen parallel backend: OpenMP" in torch.__config__.parallel_info()

# Byte cap of the filter-transform cache: an eighth of physical memory, clamped to 1..4 GiB
# (STREAMVAE_WINOGRAD_CACHE_GB overrides it). A transform is 4x its weight in float32, so an uncapped
# cache grows to 16x a bf16 model's 3x3 conv weights: 2.2 GiB for the SeedVR2 decoder, 1.0 GiB for
# Wan2.1's, 7.7 GiB for Wan2.2's. What does not fit is recomputed every temporal chunk, which is why the
# cap grows with the machine's memory (a 1 GiB cap cost SeedVR2 much of its speed: bench/RESULTS.md
# section 1).
MIN_CACHE_BYTES, MAX_CACHE_BYTES = 1 << 30, 4 << 30
# Output pixels (H x W x output frames) of one call above which an uncached filter transform pays for
# itself: measured on a 2-core AVX2 CPU in fp32, transform + Winograd beat oneDNN at 32x32 x 4 output
# frames (512 and 1024 channels) and lost at 16x16 x 2 frames.
UNCACHED_MIN_OUTPUT_PIXELS = 4096
# A conv whose filter transform the cache will not keep computes it for the call: 4x the weight in
# fresh float32 memory (0.45 GB for a 1024-channel 3x3x3 conv), on top of a full cache. Such a transform
# above this size is computed and used a group of output channels at a time, so the transient is a
# group's (each group repeats the input transform: transforms the cache keeps run whole).
GROUP_TRANSFORM_BYTES = 64 * 2**20


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX (Windows): unknown
        return None


def cache_bytes_for(ram: int | None, override: str | None = None) -> int:
    """The cache cap for `ram` bytes of physical memory (None: unknown), or `override` GiB when set."""
    if override:
        return int(float(override) * 2**30)
    return MIN_CACHE_BYTES if ram is None else min(max(ram // 8, MIN_CACHE_BYTES), MAX_CACHE_BYTES)


def default_cache_bytes() -> int:
    return cache_bytes_for(physical_memory_bytes(), os.environ.get("STREAMVAE_WINOGRAD_CACHE_GB"))


class FilterCache:
    """Filter transforms per weight, capped at `limit_bytes`, kept by priority, scan-resistant.

    Entries are keyed by the weight's anchor (the tensor, or the base of a view such as
    weight.unsqueeze(2) or a tap slice) and the view's layout. An anchor's entries are dropped when
    it is freed (weakref.finalize), so no model's transforms outlive it, and when it changes in place
    (version counter). Not a WeakKeyDictionary: that compares tensor keys elementwise. A transform
    larger than the whole cap is returned without being kept.

    A model's convs are visited in the same cycle every chunk. Plain LRU keeps nothing useful when
    one cycle needs more than the cap (each entry is evicted just before its next use), so an entry
    may be evicted only once it has gone unused for longer than the longest reuse interval seen (in
    calls), or for a new entry of higher priority (the caller's measure of what a cached transform
    saves per byte: the conv's frame size). Otherwise the new transform is computed but not kept. A
    cycle then hits on the most valuable part that fits, and the entries of a model no longer used
    age out for a new one.
    """

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self._entries: OrderedDict = OrderedDict()  # (id(anchor), view key) -> (U, priority), oldest use first
        # id(anchor) -> [weakref(anchor), version, {view key: last use}] (uncached keys too)
        self._anchors: dict[int, list] = {}
        self._tick = 0  # calls so far
        self._reuse = 0  # longest interval (in calls) between two uses of one key
        self._lock = threading.RLock()  # a finalizer may run inside get() (garbage collection)

    def __len__(self) -> int:
        return len(self._entries)

    def anchors(self) -> set[int]:
        return set(self._anchors)

    def holds_or_admits(self, weight: torch.Tensor, key: tuple, nbytes: int, priority: float = 0) -> bool:
        """Whether (weight, key) is cached, or a transform of `nbytes` at `priority` computed now would be
        kept: as `get` decides, which first counts this use of the key (a key seen a cycle ago makes the
        cycle that long, and the entries used within it stay)."""
        with self._lock:
            aid = self._live_anchor(weight)
            if aid is not None and (aid, key) in self._entries:
                return True
            last = None if aid is None else self._anchors[aid][2].get(key)
            reuse = self._reuse if last is None else max(self._reuse, self._tick + 1 - last)
            return self._victims(nbytes, priority, self._tick + 1, reuse) is not None

    def has(self, weight: torch.Tensor, key: tuple) -> bool:
        """Whether the value for (weight, key) is cached now."""
        with self._lock:
            aid = self._live_anchor(weight)
            return aid is not None and (aid, key) in self._entries

    def get(self, weight: torch.Tensor, key: tuple, compute, priority: float = 0, nbytes: int | None = None) -> torch.Tensor:
        """The cached value for (weight, key), else compute(), kept if the cap allows. `nbytes`: the size
        of compute()'s value, when known: what it displaces is dropped before it is computed, so the
        cache and the new value together stay within the cap (otherwise a full cache's peak is the cap
        plus a transform: 0.45 GB for a 1024-channel 3x3x3 conv)."""
        anchor = weight if weight._base is None else weight._base
        version = -1 if weight.is_inference() else weight._version  # inference tensors have no counter
        aid = id(anchor)
        with self._lock:
            record = self._anchors.get(aid)
            if record is None or record[0]() is not anchor:  # new anchor (or a reused id)
                if record is not None:
                    self._drop_anchor(aid)
                weakref.finalize(anchor, self.drop_anchor, aid)
                record = self._anchors[aid] = [weakref.ref(anchor), version, {}]
            elif record[1] != version:  # changed in place: every view's transform is stale
                self._drop_entries(aid)
                record[1] = version
            self._tick += 1
            last = record[2].get(key)
            if last is not None:
                self._reuse = max(self._reuse, self._tick - last)
            record[2][key] = self._tick
            entry = self._entries.get((aid, key))
            if entry is not None:
                self._entries.move_to_end((aid, key))
                return entry[0]
            for victim in (self._victims(nbytes, priority) or []) if nbytes is not None else []:
                self._evict(victim)
        value = compute()
        with self._lock:
            victims = self._victims(value.nbytes, priority)
            if self._anchors.get(aid) is record and record[1] == version and victims is not None:
                for victim in victims:
                    self._evict(victim)
                self._entries[(aid, key)] = (value, priority)
                self.bytes += value.nbytes
        return value

    def clear(self) -> None:
        with self._lock:
            for aid in list(self._anchors):
                self._drop_anchor(aid)

    def holds(self, weight: torch.Tensor) -> bool:
        """Whether a transform of `weight` (or of another view of its tensor) is kept."""
        with self._lock:
            aid = self._live_anchor(weight)
            return aid is not None and any((aid, key) in self._entries for key in self._anchors[aid][2])

    def discard(self, weight: torch.Tensor) -> None:
        """Drop the transforms of `weight` (and of the other views of its tensor)."""
        with self._lock:
            aid = self._live_anchor(weight)
            if aid is not None:
                self._drop_entries(aid)

    def _live_anchor(self, weight: torch.Tensor) -> int | None:
        """The id of the tensor under `weight` when this cache keeps an entry for it (lock held)."""
        anchor = weight if weight._base is None else weight._base
        record = self._anchors.get(id(anchor))
        return id(anchor) if record is not None and record[0]() is anchor else None

    def drop_anchor(self, aid: int) -> None:
        """Forget a freed anchor's entries (its finalizer: by then the anchor's weakref is dead, which
        tells it from a live tensor that reused the id)."""
        with self._lock:
            record = self._anchors.get(aid)
            if record is not None and record[0]() is None:
                self._drop_anchor(aid)

    def _victims(self, nbytes: int, priority: float, tick: int | None = None, reuse: int | None = None) -> list | None:
        """The entries to evict so that `nbytes` at `priority` fit (lowest priority, then least recently
        used, first), or None when it cannot be kept: larger than the cap, or only entries of the current
        cycle with at least its priority stand in the way (`tick` and `reuse`: the cache's, unless
        given)."""
        if nbytes > self.limit_bytes:
            return None
        need = self.bytes + nbytes - self.limit_bytes
        if need <= 0:
            return []
        tick = self._tick if tick is None else tick
        reuse = self._reuse if reuse is None else reuse
        evictable = [(entry[1], key) for key, entry in self._entries.items()
                     if entry[1] < priority or tick - self._anchors[key[0]][2][key[1]] > reuse]
        victims = []
        for _, key in sorted(evictable, key=lambda item: item[0]):  # stable: least recent first within a priority
            if need <= 0:
                break
            victims.append(key)
            need -= self._entries[key][0].nbytes
        return victims if need <= 0 else None

    def _evict(self, key) -> None:
        value, _ = self._entries.pop(key)
        self.bytes -= value.nbytes

    def _drop_entries(self, aid: int) -> None:
        for key in self._anchors[aid][2]:
            if (aid, key) in self._entries:
                self._evict((aid, key))

    def _drop_anchor(self, aid: int) -> None:
        self._drop_entries(aid)
        del self._anchors[aid]


@lru_cache(maxsize=None)
def filter_cache(limit_bytes: int | None = None) -> FilterCache:
    """The process's filter-transform cache with this cap (None: `default_cache_bytes()`): one per
    cap, shared by every model and run that asks for it, so transforms outlive a run but no setting
    of one run changes another's cache."""
    return FilterCache(default_cache_bytes() if limit_bytes is None else limit_bytes)


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
    """U (kt, P, Cout, Cin) float32 of weight (Cout, Cin, kt, 3, 3): U[k, p] is position p of
    G w[:, :, k] G^T. Cached per weight tensor (or view of one) in `cache` (capped; `priority`,
    the conv's frame pixels, decides which transforms stay when not all fit) and recomputed when it
    changes in place (version counter). 4x the weight's float32 size (P = 36 positions per 9 taps).

    One batched GEMM (G kron G) @ w in float32: a float64 transform is 4-5x slower (the first decode
    computes every layer's) and only moves the conv's rms error by 2-3%."""
    key = _transform_key(weight, m)

    def compute():
        cout, cin, kt = weight.shape[:3]
        with torch.no_grad():
            taps = weight.detach().to("cpu", torch.float32).permute(2, 3, 4, 0, 1).reshape(kt, 9, cout * cin)
            return torch.bmm(_filter_matrix(m).expand(kt, -1, -1), taps).view(kt, -1, cout, cin)

    return cache.get(weight, key, compute, priority, transform_nbytes(weight.shape, m))


def winograd_conv3d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cache: FilterCache,
                    m: int = DEFAULT_TILE, padding: int = 1, gemm: str = "mkl") -> torch.Tensor:
    """F.conv3d(x, weight, bias, stride=1, padding=(0, padding, padding)) by Winograd F(m x m, 3 x 3),
    the filter transforms kept in `cache` (`filter_cache()`).

    x (B,Cin,T,H,W) on the CPU, any float dtype (computed in float32, returned in x.dtype);
    weight (Cout,Cin,kt,3,3) with T >= kt; padding 1 ("same": any H, W >= 1) or 0 ("valid", as exact
    tiling uses on a tile with its halo: H, W >= 3); `gemm` one of GEMM_ROUTES (step 4 of the module
    docstring). Returns (B,Cout,T-kt+1,H+2p-2,W+2p-2), in the layout of x.
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
    bias32 = None if bias is None else bias.detach().float().view(cout, 1, 1, 1, 1)
    out = empty_video(x, (b, cout, t_in - kt + 1, h_out, w_out))
    threads = torch.get_num_threads() if _OPENMP else 1

    # Slab height in tile rows: about SLAB_COLUMNS tiles, with the buffers of the jobs in flight
    # (per tile row: d, kt frames of v, mt, y; and S) within one output frame's size or the floor.
    # It never depends on T, nor then do the GEMM shapes.
    p = (m + 2) ** 2
    row_bytes = 4 * n_w * ((kt + 1) * p * cin + (p + m * m) * cout) + x.element_size() * cin * m * (n_w * m + 2)
    budget = max(out[0, :, 0].nbytes, MIN_WORKSPACE_BYTES) // threads
    rows = max(1, min(n_h, -(-SLAB_COLUMNS // n_w), budget // row_bytes))
    rows = -(-n_h // -(-n_h // rows))  # equal slabs: no small last slab with a slow, narrow GEMM
    slabs = [(i, r0, min(r0 + rows, n_h)) for i in range(b) for r0 in range(0, n_h, rows)]
    # Fewer slabs than threads (small frames, many channels): split the output channels as well; each
    # part repeats the slab's input transform, which is small next to its GEMMs there.
    parts = threads if len(slabs) < threads and cout >= threads * MIN_PART_CHANNELS else 1
    step = -(-cout // parts)
    jobs = [(i, r0, r1, slice(c, c + step)) for i, r0, r1 in slabs for c in range(0, cout, step)]

    # One float32 workspace per thread, reused by its jobs: no allocator churn or fresh pages per job.
    local = threading.local()

    def workspace(numel: int) -> torch.Tensor:
        if getattr(local, "buffer", None) is None or local.buffer.numel() < numel:
            local.buffer = torch.empty(numel, dtype=torch.float32)
        return local.buffer[:numel]

    def run(job):
        i, r0, r1, chans = job
        _job(x[i], out[i, chans], u[:, :, chans], None if bias32 is None else bias32[chans], m, r0, r1, workspace, padding,
             GEMM_ROUTES[gemm])

    if threads > 1:
        _run_parallel(run, jobs, min(threads, len(jobs)))
    else:
        for job in jobs:
            run(job)
    return out


def _run_parallel(run, jobs, workers: int) -> None:
    """run(job) for every job on `workers` threads, each running its torch ops single-threaded.

    A job is a chain of mid-sized ops; run one after another with every op split over all cores,
    each op pays a fork/join, and on a busy machine a join waits for a descheduled thread
    (measured: several ms per op, slower than one thread). Whole jobs per core have no joins and
    keep each job in its core's cache; single-threaded MKL also computes a GEMM of given shapes the
    same way every time. torch.set_num_threads sets the calling thread's OpenMP/MKL team
    (thread-local) and the process default (global), which is restored afterwards.
    """
    threads, inference = torch.get_num_threads(), torch.is_inference_mode_enabled()

    def work(job):
        torch.set_num_threads(1)
        # Grad and inference mode are thread-local: take the caller's (its tensors may be inference
        # tensors, which only inference mode may write).
        with torch.inference_mode(inference), torch.no_grad():
            run(job)

    try:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(work, jobs))
    finally:
        torch.set_num_threads(threads)


def _job(x, out, u, bias, m: int, r0: int, r1: int, workspace, padding: int, gemm) -> None:
    """Output tile rows [r0, r1) of x (Cin,T,H,W) -> out (Cout,T-kt+1,H+2p-2,W+2p-2), all frames,
    with u (kt, P, Cout, Cin) and bias (Cout, 1, 1, 1, 1) or None for those output channels, the
    batched GEMMs by gemm(u, v, t, mt); the float32 buffers are carved from workspace(numel)."""
    cin, t_in, h, w = x.shape
    cout, t_out, h_out, w_out = out.shape[:4]
    a, n_r, n_w, kt = m + 2, r1 - r0, -(-w_out // m), u.shape[0]
    p, n = a * a, n_r * n_w
    kb, ka = _data_transforms(m)
    # Input rows top .. top + n_r*m + 1 and columns -padding .. n_w*m + 1 - padding; zeros outside x.
    top = r0 * m - padding
    lo, hi = max(top, 0), min(top + n_r * m + 2, h)
    pad = (padding, n_w * m + 2 - padding - w, lo - top, n_r * m + 2 + top - hi)
    # d: gathered tiles, v: ring of the last kt transformed frames, mt: GEMM output, y: output tiles;
    # all tiles-major (channels last).
    shapes = [(a, a, n_r, n_w, cin), (kt, p, n, cin), (p, n, cout), (m, m, n_r, n_w, cout)]
    sizes = [math.prod(shape) for shape in shapes]
    d, v, mt, y = (b.view(shape) for b, shape in zip(workspace(sum(sizes)).split(sizes), shapes))
    tiles = y.permute(4, 2, 0, 3, 1)  # (Cout, rows, m, cols, m)
    for f in range(t_in):
        # 1.-3. The frame's slab rows r0*m-1 .. r1*m, zero padded where they leave the image (and for
        #    the right columns of a partial last tile); its a x a tiles (stride m) gathered
        #    position-major in float32; the input transform into the ring.
        s = F.pad(x[:, f, lo:hi], pad)
        d.copy_(s.unfold(1, a, m).unfold(2, a, m).permute(3, 4, 1, 2, 0))
        torch.mm(kb, d.view(p, -1), out=v[f % kt].view(p, -1))
        t = f - kt + 1
        if t < 0:
            continue
        # 4. Output frame t: one GEMM per position and temporal tap (frames t..t+kt-1), accumulated.
        gemm(u, v, t, mt)
        # 5. Output transform, scattered into the m x m tiles (cropped at the image edge) + bias.
        torch.mm(ka, mt.view(p, -1), out=y.view(m * m, -1))
        for rows, hr in _tile_runs(min(r1 * m, h_out) - r0 * m, m):
            for cols, wr in _tile_runs(w_out, m):
                src = tiles[:, rows, :hr, cols, :wr]
                y0, x0 = (r0 + rows.start) * m, cols.start * m
                dst = out[:, t, y0:y0 + src.shape[1] * hr, x0:x0 + src.shape[3] * wr]
                dst = dst.unflatten(2, (src.shape[3], wr)).unflatten(1, (src.shape[1], hr))
                if bias is None:
                    dst.copy_(src)
                else:
                    torch.add(src, bias, out=dst)


def _tile_runs(size: int, m: int):
    """Runs of tiles covering `size` pixels: (full tiles, m) and, when size % m, (last tile, size % m)."""
    full = size // m
    runs = [(slice(0, full), m)] if full else []
    if size % m:
        runs.append((slice(full, full + 1), size % m))
    return runs
