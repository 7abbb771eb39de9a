"""Memory sweep: resolution x budget -> the plan the planner picks, its predicted and measured peak, time,
and error against the untiled decode (or encode) of the same clip.

    python -m bench.memory_sweep                                   # CPU: SeedVR2 decode, 5 frames, 192/256 px
    python -m bench.memory_sweep --sizes 256x256 384x384 --fractions 0.5 0.25 0.15
    python -m bench.memory_sweep --device cuda --dtype bf16 --frames 21 --sizes 1080x1920 2160x3840 \\
        --budgets-gib 6 8 12 16                                    # GPU: budgets as cards of that size

Every row is a fresh process (`bench.memory_worker`, full released config, seeded weights): first the
untiled run of each size (its peak is the reference the fractions are taken of), then one run per budget,
planned within it (on CUDA the process is limited to it with torch.cuda.set_per_process_memory_fraction,
a card of that size). Peaks are the process's resident set on the CPU (live tensors, glibc's mmap
threshold fixed) and the caching allocator's reserved peak on CUDA, both including the weights.
Prints a markdown table and writes one JSON line per row to --out.
"""
import argparse
import json
import subprocess
from pathlib import Path

import torch

from bench import models
from bench.common import git_commit, machine_summary, run_worker
from vae import families

GIB = 2**30


def worker(spec: dict, timeout: float | None) -> dict:
    """One row in its own process, its progress and warnings passed through to this log; a row that
    fails or runs out of time is {"error": ...} and the sweep goes on."""
    try:
        return run_worker("bench.memory_worker", spec, timeout=timeout, show_stderr=True)
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after {timeout:.0f} s"}
    except RuntimeError as error:
        return {"error": str(error).splitlines()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default=families.SEEDVR2.name, choices=models.FAMILIES)
    parser.add_argument("--op", default="decode", choices=["decode", "encode"])
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--sizes", nargs="+", default=["192x192", "256x256"], help="HxW in pixels")
    parser.add_argument("--fractions", nargs="+", type=float, default=[0.5, 0.25],
                        help="budgets as fractions of the untiled run's measured peak")
    parser.add_argument("--budgets-gib", nargs="+", type=float, default=[], help="budgets in GiB (instead)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--no-untiled", action="store_true",
                        help="no untiled runs (too large for the device): no reference row, no error column")
    parser.add_argument("--out", default=None, help="JSON lines file (default: bench/results/memory_sweep_<device>.json)")
    parser.add_argument("--row-timeout", type=float, default=None,
                        help="seconds a row may take; a row stopped is recorded with its error, the sweep goes on")
    args = parser.parse_args()
    out = Path(args.out or Path(__file__).parent / "results" / f"memory_sweep_{args.device}_{args.family}.json")
    machine = machine_summary()
    header = (f"# {args.family} {args.op} {args.dtype}, {args.frames} frames on {args.device} "
              f"({machine['cuda'] or machine['cpu_model']['cpu']}, {machine['cpu_capability']}, "
              f"{machine['threads']} threads), torch {torch.__version__}, commit {git_commit() or 'unknown'}")
    print(header)
    print("| size | budget GiB | plan | predicted GiB | measured GiB | s | max err vs untiled |")
    print("|---|---|---|---|---|---|---|")
    # Each row is written as it finishes: a run stopped at its time limit keeps the rows it measured.
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"header": header}) + "\n")
    failed = 0
    for size in args.sizes:
        height, width = (int(v) for v in size.lower().split("x"))
        base = dict(family=args.family, op=args.op, frames=args.frames, height=height, width=width,
                    device=args.device, dtype=args.dtype, temporal_chunk=1)
        untiled = None if args.no_untiled else worker(base, args.row_timeout)
        if untiled is not None and "error" in untiled:
            failed += 1
            print(f"| {size} | none | {untiled['error']} | | | | |", flush=True)
            untiled = None  # no reference: the budgets must be given in GiB, and no error column
        budgets = [g * GIB for g in args.budgets_gib] or [f * untiled["peak_bytes"] for f in args.fractions]
        runs = ([(None, lambda: untiled)] if untiled else []) + [
            (int(budget), lambda budget=budget: worker(dict(base, memory_budget=int(budget),
                                                           compare_untiled=untiled is not None), args.row_timeout))
            for budget in budgets]
        for budget, measure in runs:
            result = measure()
            row = dict(size=size, budget_gib=None if budget is None else round(budget / GIB, 3), **result)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if "error" in result:
                failed += 1
                print(f"| {size} | {budget / GIB:.3f} | {result['error']} | | | | |", flush=True)
                continue
            predicted = "-" if result["predicted_bytes"] is None else f"{result['predicted_bytes'] / GIB:.3f}"
            error = f"{result['max_err']:.1e}" if "max_err" in result else "(reference)" if budget is None else "-"
            print(f"| {size} | {'none' if budget is None else f'{budget / GIB:.3f}'} | {result['plan']} | {predicted} | "
                  f"{result['peak_bytes'] / GIB:.3f} | {result['seconds']:.1f} | {error} |", flush=True)
    print(f"wrote {out}")
    if failed:  # a sweep with a row missing has not measured what it was run for (gpu_session does not record it)
        raise SystemExit(f"{failed} row(s) failed or were stopped")


if __name__ == "__main__":
    main()
