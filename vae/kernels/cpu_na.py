"""3-D neighbourhood attention on the CPU as a compiled C kernel (cpu_na.c), float32: each query's window
read in place, exactly `neighborhood.na3d`'s semantics for a `Part`.

Why a compiled kernel: torch's ops can only compute a block of queries against the whole box its windows
cover (neighborhood.blocked: at LTX-2.5's 11^3 windows 44 % of those scores are used, and the box is
copied first); the C kernel computes 16 keys per key row for a group of 17 - K'w queries along w (69 %
used at 11^3), straight from the key rows. bench/RESULTS.md section 29 has the measurements.

Built once per machine: cpu_na.c compiled by the machine's C compiler ($CC, else cc or gcc; -O3
-march=native) into the kernel cache folder (kernel_choice.cache_dir), the file named by a hash of the
source, the flags, the compiler and the CPU, so another CPU or a changed source builds afresh; loaded with
ctypes (no Python headers, no torch extension build). Where there is no compiler (Windows without one,
say) or the build fails, `library()` is None, one log line says why, and the torch implementation runs.
The threads: torch's thread count, each a share of the query rows in its own ctypes call (which releases
the GIL).

Layout: q B,t,h,w,heads,D (the query box, any strides with D contiguous), k and v B,t,h,w,heads,D (the key
box); the result B,t,h,w,heads,D in v's dtype. Computed in float32 (other dtypes are converted).
"""
import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import torch

from . import kernel_choice
from .na_window import Part

LANES = 16  # cpu_na.c's vector width in floats: a group's keys per row, the channels per step
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fPIC", "-shared", "-std=gnu11")
SOURCE = Path(__file__).with_name("cpu_na.c")
BUILD_TIMEOUT_S = 120
log = logging.getLogger("streamvae")


DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # float64 would lose its precision in float32


def takes(q: torch.Tensor, part: Part) -> bool:
    """Whether the kernel computes this call: CPU tensors of DTYPES, head_dim a multiple of 16, K'w at most 16."""
    return q.device.type == "cpu" and q.dtype in DTYPES and q.shape[-1] % LANES == 0 and part.kernel[2] <= LANES


def compiler() -> str | None:
    """The C compiler to build with: $CC, else cc or gcc on the PATH (None: none)."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _build_key(cc: str) -> str:
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    identity = kernel_choice.cpu_identity()
    digest = hashlib.sha1(SOURCE.read_bytes())
    for part in (*FLAGS, cc, version, identity["cpu"], *identity["flags"]):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """The built kernel, loaded (once per process), or None where it cannot be built here (logged once)."""
    cc = compiler()
    if cc is None:
        log.info("StreamVAE: no C compiler found (set CC): LTX-2.5's neighbourhood attention runs in torch ops "
                 "on the CPU (slower)")
        return None
    target = kernel_choice.cache_dir() / f"cpu_na-{_build_key(cc)}.so"
    try:
        if not target.is_file():
            _build(cc, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as error:  # no compiler, a failed build, a library that won't load
        log.warning("StreamVAE: could not build the CPU neighbourhood-attention kernel with %s (%s); torch "
                    "ops run instead (slower)", cc, str(error).strip().splitlines()[-1][:300] if str(error) else
                    type(error).__name__)
        return None
    lib.na3d_f32.restype = ctypes.c_int
    lib.na3d_f32.argtypes = [ctypes.c_void_p, ctypes.c_float] + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2
    return lib


def _build(cc: str, target: Path) -> None:
    """Compile cpu_na.c into `target`, atomically (processes building at once each write their own file)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        result = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(built)], capture_output=True, text=True,
                                timeout=BUILD_TIMEOUT_S)
        if result.returncode != 0:
            raise OSError(result.stderr or f"{cc} exited with {result.returncode}")
        os.replace(built, target)
    log.info("StreamVAE: built the CPU neighbourhood-attention kernel %s", target)


def _padded(x: torch.Tensor, shape: tuple, dims: tuple) -> torch.Tensor:
    """x (B,t,h,w,D: one head) permuted by `dims` into a float32 buffer of `shape`, zero beyond x's extent."""
    buffer = torch.zeros(shape, dtype=torch.float32)
    view = x.permute(dims)
    buffer[tuple(slice(0, n) for n in view.shape)].copy_(view)
    return buffer


def na3d(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, part: Part, scale: float) -> torch.Tensor:
    """Neighbourhood attention of the part's queries over its keys (neighborhood.na3d's semantics), B,t,h,w,
    heads,D in and out, computed in float32 by cpu_na.c, one head at a time (the keys' and values' copies in
    the kernel's layouts are one head's: a few times less than the blocked implementation's gathered boxes)."""
    lib = library()
    if lib is None or not takes(q, part):
        raise RuntimeError("the C na3d needs a C compiler, CPU tensors in float32, bf16 or fp16, head_dim a multiple "
                           "of 16 and a window at most 16 wide; impl='blocked' has no such needs")
    b, tq, hq, wq, heads, d = q.shape
    _, tk, hk, wk, _, _ = k.shape
    wpad = max(wk, LANES)
    q32 = q.float() if q.stride(-1) == 1 else q.float().contiguous()
    out = torch.empty((b, tq, hq, wq, heads, d), dtype=torch.float32)
    # the kernel's geometry for one head: heads = 1, q's and out's head picked by their pointers
    params = torch.tensor([b, 1, d, tq, hq, wq, tk, hk, wk, wpad, *part.q_origin, *part.kv_origin, *part.grid,
                           *part.kernel, *q32.stride()[:4], 0, *out.stride()[:4], 0], dtype=torch.int64)
    rows = b * tq * hq
    threads = max(1, min(torch.get_num_threads(), rows))
    bounds = [rows * i // threads for i in range(threads + 1)]
    with ThreadPoolExecutor(threads) as pool:
        for n in range(heads):
            # B,t,h,w,D -> B,t,h,D,w (keys channel-major along w) and B,t,h,w,D, both padded to wpad
            k_t = _padded(k[..., n, :], (b, tk, hk, d, wpad), (0, 1, 2, 4, 3))
            v_r = _padded(v[..., n, :], (b, tk, hk, wpad, d), (0, 1, 2, 3, 4))
            q_n, out_n = q32[..., n, :], out[..., n, :]

            def run(share: int) -> int:
                return lib.na3d_f32(params.data_ptr(), scale, q_n.data_ptr(), k_t.data_ptr(), v_r.data_ptr(),
                                    out_n.data_ptr(), bounds[share], bounds[share + 1])

            if any(pool.map(run, range(threads))):
                raise MemoryError("the C na3d could not allocate its scores buffer")
    return out.to(v.dtype)
