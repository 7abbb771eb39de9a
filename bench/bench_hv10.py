"""HunyuanVideo 1.0 / Kandinsky (`hv10`) on the CPU against ComfyUI 0.33.0's own VAE (core's `AutoencoderKL`,
`conv3d=True`), the same seeded weights at the released widths (issue 52).

    python -m bench.bench_hv10 --frames 17 --size 64x96 --rounds 1 --dtypes fp32 --json out.json

Rows per op and precision (fp32, and `auto`'s where that is not fp32: bf16 on a CPU with native bf16):
- "untiled": StreamVAE's default (`frames` model: the whole-clip network), the clip in one chunk;
- "quarter": the same under a memory budget of what stays resident (weights, filter transforms) plus a
  quarter of the untiled plan's predicted activations; the planner picks chunks and/or tiles, and chunks
  first run the statistics passes (vae/run/clip_statistics.py): its time over "untiled" is the price of
  exactness below one chunk;
- "core frames": StreamVAE with `frames` core (core's chunked norms and unmasked attention), one chunk;
- "core 0.33.0": core's VAE called directly (untiled), in the same precision.
Errors: max |row - untiled| and max |row - core| of the same input, the precision's own rows; "core frames"
against core is the check that the two compute the same network.

Two phases. Peak memory: each row in its own process (bench.worker, one warm-up then `--memory-repeats`
runs; "peak act" is the most the timed runs allocate above the RSS they start from; "core frames" runs
the untiled plan and is not measured again). Time: one process,
every row once per round, one untimed warm-up round (kernel tuning, filter transforms), then `--rounds`
timed rounds; medians, so load changes hit every row alike. The kernel choices go to one fresh cache.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import models
from bench.common import machine_summary, print_table, run_worker
from vae import Optimizations, Settings, families, plan
from vae.kernels import backend, kernel_choice
from vae.run import memory

FAMILY = families.HV10.name
CORE = "0.33.0"
ROWS = ("untiled", "quarter", "core frames", f"core {CORE}")
COLUMNS = [("op", "op", "s"), ("dtype", "dtype", "s"), ("row", "row", "s"), ("plan", "plan", "s"),
           ("time", "median s", ".2f"), ("vs_core", "vs core", ".2f"), ("vs_untiled", "vs untiled", ".2f"),
           ("peak_gib", "peak act GiB", ".2f"), ("budget_gib", "budget GiB", ".2f"),
           ("err_untiled", "max err vs untiled", ".1e"), ("err_core", "max err vs core", ".1e")]


def plans(op: str, shape: tuple, dtype: torch.dtype) -> tuple[int, dict]:
    """(the quarter budget in bytes, row -> its plan in words): the budget is what stays resident plus a quarter
    of the untiled plan's predicted activations, for the full model (both halves, as bench.worker builds it)."""
    spec, opts = families.spec(FAMILY), Optimizations()
    with torch.device("meta"):
        model, core_frames = (spec.vae_class(spec.config_class(frames=f)).to(dtype) for f in ("model", "core"))
    untiled = plan(model, op, shape, Settings(), device="cpu", opts=opts)
    resident = untiled.peak_bytes - untiled.work_bytes + memory.resident_cache_bytes(model, op, "cpu", opts)
    budget = int(resident + 0.25 * (untiled.peak_bytes - resident))
    return budget, {"untiled": untiled.describe(), f"core {CORE}": "core's own",
                    "quarter": plan(model, op, shape, Settings(memory_budget=budget), device="cpu", opts=opts).describe(),
                    "core frames": plan(core_frames, op, shape, Settings(), device="cpu", opts=opts).describe()}


def worker_spec(row: str, op: str, dtype: str, clip: dict, budget: int, repeats: int) -> dict:
    """bench.worker's spec of a row: its variant (bench/variants.py) and engine settings."""
    variant = {"core frames": "core_frames", f"core {CORE}": f"core_{CORE}"}.get(row, "optimized")
    engine = {"memory_budget": budget} if row == "quarter" else {}
    return dict(family=FAMILY, op=op, dtype=dtype, variant=variant, engine=engine, repeats=repeats, warmup=1, **clip)


def runners(op: str, dtype: torch.dtype, x: torch.Tensor, budget: int) -> dict:
    """row -> a zero-argument run of `op` on `x` (models in `dtype`, built once here)."""
    ours = models.build(FAMILY, dtype)
    core_frames = models.build(FAMILY, dtype, config={"frames": "core"})
    core = models.build(FAMILY, dtype, core=CORE)
    x_core = x.to(dtype)  # core's modules take their own dtype; StreamVAE casts a latent itself
    x = x_core if op == "encode" else x
    call = core.encode if op == "encode" else core.decode
    return {"untiled": lambda: models.run(ours, op, x),
            "quarter": lambda: models.run(ours, op, x, {"memory_budget": budget}),
            "core frames": lambda: models.run(core_frames, op, x),
            f"core {CORE}": lambda: call(x_core)}


def race(runs: dict, rounds: int, label: str) -> dict:
    """row -> (median s, times, last output): one untimed warm-up round, then `rounds` interleaved ones."""
    times, outputs = {row: [] for row in runs}, {}
    with torch.inference_mode():
        for round_ in range(rounds + 1):
            for row, run in runs.items():
                start = time.perf_counter()
                outputs[row] = run().float()
                seconds = time.perf_counter() - start
                if round_:
                    times[row].append(seconds)
                print(f"  {label} {row} round {round_}: {seconds:.1f} s (load {os.getloadavg()[0]:.1f})",
                      file=sys.stderr, flush=True)
    return {row: (statistics.median(times[row]), times[row], outputs[row]) for row in runs}


def bench_op(op: str, dtype_name: str, args) -> list[dict]:
    dtype, clip = backend.DTYPES[dtype_name], dict(frames=args.frames, height=args.height, width=args.width)
    x = models.make_input(FAMILY, dict(clip, op=op))
    budget, plan_of = plans(op, tuple(x.shape), dtype)
    peaks = {}
    for row in ROWS[:2] + ROWS[3:]:  # "core frames" runs the untiled plan: its peak is "untiled"'s
        result = run_worker("bench.worker", worker_spec(row, op, dtype_name, clip, budget, args.memory_repeats))
        peaks[row] = result["peak_activation"]
        print(f"  {op} {dtype_name} {row}: peak activation {peaks[row] / 2**30:.2f} GiB, times "
              f"{[round(t, 1) for t in result['times_s']]} (own process)", file=sys.stderr, flush=True)
    results = race(runners(op, dtype, x, budget), args.rounds, f"{op} {dtype_name}")
    untiled, core = results["untiled"], results[f"core {CORE}"]
    return [dict(op=op, dtype=dtype_name, row=row, plan=plan_of[row].split(", kernels")[0], plan_full=plan_of[row], time=t,
                 times=times, vs_core=core[0] / t, vs_untiled=untiled[0] / t, peak_gib=peaks[row if row != "core frames" else "untiled"] / 2**30,
                 budget_gib=budget / 2**30 if row == "quarter" else None,
                 err_untiled=(out - untiled[2]).abs().max().item(), err_core=(out - core[2]).abs().max().item(),
                 max_abs=out.abs().max().item())
            for row, (t, times, out) in results.items()]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", nargs="+", default=["decode"], choices=["decode", "encode"])
    parser.add_argument("--frames", type=int, default=17, help="pixel frames (1 + 4k)")
    parser.add_argument("--size", default="64x96", help="HxW in pixels")
    parser.add_argument("--dtypes", nargs="+", choices=["fp32", "auto"], default=["fp32", "auto"],
                        help="auto: `decode_dtype: auto`'s precision on this CPU (skipped where that is fp32)")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (after one warm-up round)")
    parser.add_argument("--memory-repeats", type=int, default=1, help="runs per peak-memory process after its warm-up")
    parser.add_argument("--json", help="also write the rows and the machine to this file")
    args = parser.parse_args()
    args.height, args.width = (int(v) for v in args.size.lower().split("x"))
    os.environ[kernel_choice.CACHE_ENV] = tempfile.mkdtemp(prefix="streamvae-kernels-")
    machine, load_before = machine_summary(), os.getloadavg()
    auto = backend.dtype_name(backend.auto_dtype("cpu", "decode"))
    dtypes = list(dict.fromkeys(auto if d == "auto" else d for d in args.dtypes))
    rows = [row for op in args.ops for dtype in dtypes for row in bench_op(op, dtype, args)]
    load_after = os.getloadavg()
    print(f"\nmachine: {machine}\n{FAMILY} {' and '.join(args.ops)} {args.frames}x{args.height}x{args.width}, "
          f"median of {args.rounds} interleaved rounds; `auto` is {auto} here; load average before {load_before}, "
          f"after {load_after}\n")
    print_table(rows, COLUMNS)
    for row in rows:
        print(f"plan {row['op']} {row['dtype']} {row['row']}: {row['plan_full']}; times {[round(t, 2) for t in row['times']]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "argv": sys.argv[1:], "load_before": load_before,
                                               "load_after": load_after, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
