"""Shared benchmark machinery: isolated timed runs, peak memory, ceilings, machine records, tables.

Benchmarks print ratio tables; they are never tests. Each measured variant runs in its own
subprocess so that its peak memory is its own (Linux VmHWM, reset after the model is built), and
timings are medians of several runs after a warm-up, so side-by-side ratios survive a noisy machine.
"""
import faulthandler
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from vae.kernels.backend import DTYPES
from vae.kernels import conv3d, cpu_has_native, kernel_choice

REPO = Path(__file__).resolve().parent.parent


def reset_peak_rss() -> None:
    """Reset this process's peak-RSS mark (Linux: VmHWM) so a later read covers only what follows."""
    try:
        Path(f"/proc/{os.getpid()}/clear_refs").write_text("5")
    except OSError:
        pass


def peak_rss_bytes() -> int:
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def rss_bytes() -> int:
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def timed_runs(fn, repeats: int, warmup: int = 1) -> tuple[list[float], object]:
    """Wall times of `repeats` calls of fn() after `warmup` untimed ones, and the last call's result."""
    for _ in range(warmup):
        fn()
    times, result = [], None
    for _ in range(repeats):
        result = None  # free the previous output before the next run allocates its own
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def median_time(fn, repeats: int, warmup: int = 1) -> tuple[float, list[float]]:
    times, _ = timed_runs(fn, repeats, warmup)
    return statistics.median(times), times


def count_flops(fn) -> int:
    """FLOPs (2 x multiply-adds) of `fn()` as counted by torch's FlopCounterMode, including the oneDNN
    convolutions the CPU conv dispatch calls directly (which the counter does not know). Ops run on
    other threads (the Winograd kernel's workers) are not seen."""
    from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

    def mkldnn_conv_flop(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
        return conv_flop_count(x_shape, w_shape, out_shape, transposed=False)

    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.mkldnn_convolution: mkldnn_conv_flop})
    with counter:
        fn()
    return counter.get_total_flops()


def ceilings(dtypes=("fp32", "bf16"), seconds: float = 2.0) -> dict[str, float]:
    """This machine's GEMM and conv3d throughput (FLOP/s) right now, the yardstick for model TFLOP/s."""
    result = {}
    for name in dtypes:
        dtype = DTYPES[name]
        a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
        result[f"gemm_{name}"] = rate(lambda: a @ b, 2 * 2048 ** 3, seconds)
        x = torch.randn(1, 256, 6, 64, 64, dtype=dtype)
        w = torch.randn(256, 256, 3, 3, 3, dtype=dtype)
        flops = 2 * 256 * 256 * 27 * 4 * 64 * 64
        result[f"conv3d_{name}"] = rate(lambda: conv3d(x, w, None, (1, 1, 1), (0, 1, 1)), flops, seconds)
    return result


def rate(fn, flops: int, seconds: float, sync=lambda: None) -> float:
    """FLOP/s of fn() (`flops` each) run for about `seconds` (at most 50 runs) after one warm-up; `sync`
    waits for the device after each run (a GPU's launches return before the work is done)."""
    fn()
    sync()
    n, start = 0, time.perf_counter()
    while True:
        fn()
        sync()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed > seconds or n >= 50:
            return flops * n / elapsed


STACKS_EVERY = "STREAMVAE_STACKS_EVERY"  # seconds; a worker started with it set prints its Python stacks that often


def dump_stacks_when_asked() -> None:
    """A worker's Python stacks on stderr every $STREAMVAE_STACKS_EVERY seconds, when set: where a run that
    is stopped at its time limit spent that time shows in the log (a GPU window has no debugger)."""
    every = float(os.environ.get(STACKS_EVERY, 0) or 0)
    if every > 0:
        faulthandler.dump_traceback_later(every, repeat=True, file=sys.stderr)


def run_worker(module: str, spec: dict, timeout: float | None = None, show_stderr: bool = False) -> dict:
    """Run `python -m <module> <json spec>` in a fresh process; it prints one JSON line last.
    `show_stderr`: the worker's warnings and progress go to this process's stderr as they come (a log
    that shows where a slow or stopped run was), instead of only into the error of a failed one."""
    cmd = [sys.executable, "-m", module, json.dumps(spec)]
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=None if show_stderr else subprocess.PIPE,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {spec} failed (exit {proc.returncode})" + (f":\n{proc.stderr[-3000:]}" if proc.stderr else ""))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def scratch_dir() -> Path:
    path = Path(tempfile.gettempdir()) / "streamvae-bench"
    path.mkdir(exist_ok=True)
    return path


def git_commit() -> str | None:
    """The checked-out commit (short), with "+dirty" when tracked files differ from it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=30).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}+dirty" if commit and dirty else commit


def machine_summary() -> dict:
    """What a result was measured on and with: CPU (model and flags), torch, GPU, and the commit."""
    return {
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": dict(kernel_choice.cpu_identity(), cores=os.cpu_count()),  # model ("cpu"), vector flags
        "commit": git_commit(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "native_bf16_conv": cpu_has_native(torch.bfloat16),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cuda_runtime": torch.version.cuda if torch.cuda.is_available() else None,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
    }


def psnr(a: torch.Tensor, b: torch.Tensor, peak_to_peak: float = 2.0) -> float:
    mse = torch.mean((a.double() - b.double()) ** 2).item()
    return float("inf") if mse == 0 else 10 * torch.log10(torch.tensor(peak_to_peak ** 2 / mse)).item()


def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """columns: (key, header, format spec); missing values print as '-'."""
    cells = [[h for _, h, _ in columns]]
    for row in rows:
        cells.append([format(row[k], f) if row.get(k) is not None else "-" for k, _, f in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    for i, r in enumerate(cells):
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
