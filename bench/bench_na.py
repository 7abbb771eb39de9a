"""Neighbourhood attention on the CPU, side by side in one process: StreamVAE's compiled C kernel
(vae/kernels/cpu_na.c, what `auto` takes on a CPU where it builds) and its blocked NA (vae/kernels/neighborhood.py)
in several query-block shapes, comfy-kitchen's `na3d` (what ComfyUI core 0.33.0's LTX-2.5 decoder calls; on a
CPU its eager backend) and the torch reference.

    python -m bench.bench_na                                   # every shape, fp32, 3 rounds
    python -m bench.bench_na --shapes stage5 --blocks 1x8x8 4x8x8 --rounds 5 --threads 1 --json out.json

Shapes (q = k = v: B,T,H,W,heads,head_dim; window), LTX-2.5's released widths (heads of 64):
- "stage5": 1x32x48x40, 4 heads (256 channels), 11x11x11: a part of the stage-5 grid on which kitchen
  takes the query tiles it takes on a 720x1280 clip's 121x180x320 grid (16x12x10);
- "stage5-small": 1x12x32x32, the same window on a grid little larger than it;
- "stage4": 1x8x44x80, 8 heads (512 channels), 3x5x5: 8 of the 69 frames of a 704x1280 clip's stage-4
  grid, half its rows and columns (kitchen's tiles 8x22x20 there, 9x22x20 on the whole grid);
- "stage1": 1x18x22x40, 32 heads (2048 channels), 3x7x7: that clip's whole stage-1 grid (16 latent
  frames + 2 trailing copies).
Rounds interleave the variants (every variant once per round; the slow reference in the first round
only); the table has the minimum and the median of the rounds, the speed-up of the minimum over
kitchen's, and the error against the reference (max abs over max(1, max |ref|); with --no-reference
against the first variant's). Times are the process's CPU seconds (`time.process_time`): on a machine
shared with other jobs they are what the computation took, not how long it waited (with --threads 1 the
same as its wall time on an idle core). Kitchen comes from STREAMVAE_CORE_SITE or the 0.33.0 venv
(bench/core_vae.py); without it its rows are left out.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.common import machine_summary, print_table
from bench.core_vae import TREES
from vae.kernels import cpu_na, na_window
from vae.kernels import neighborhood as na

SHAPES = {"stage5-small": ((1, 12, 32, 32, 4, 64), (11, 11, 11)), "stage5": ((1, 32, 48, 40, 4, 64), (11, 11, 11)),
          "stage4": ((1, 8, 44, 80, 8, 64), (3, 5, 5)), "stage1": ((1, 18, 22, 40, 32, 64), (3, 7, 7))}
DEFAULT_BLOCKS = ("1x4x8", "1x8x8", "4x4x4", "2x4x8")
COLUMNS = [("shape", "shape", "s"), ("dtype", "dtype", "s"), ("variant", "variant", "s"), ("min", "min CPU s", ".3f"),
           ("median", "median CPU s", ".3f"), ("speedup", "vs kitchen", ".2f"), ("error", "rel err", ".1e")]


def kitchen_na3d():
    """comfy-kitchen's public `na3d` (its dispatcher picks the eager backend on a CPU), or None."""
    for site in TREES["0.33.0"].sites():
        if str(site) not in sys.path:
            sys.path.append(str(site))
    try:
        import comfy_kitchen
    except ImportError:
        return None
    return lambda q, k, v, kernel: comfy_kitchen.na3d(q, k, v, list(kernel), None, 1.0)


def variants(blocks, with_reference: bool) -> dict:
    out = {}
    kitchen = kitchen_na3d()
    if kitchen is not None:
        out["kitchen eager"] = kitchen
    if cpu_na.library() is not None:
        out["c"] = lambda q, k, v, kernel: na.na3d(q, k, v, kernel, scale=1.0, impl="c")
    for block in blocks:
        shape = tuple(int(n) for n in block.split("x"))
        out[f"blocked {block}"] = lambda q, k, v, kernel, shape=shape: na.blocked(
            q, k, v, na_window.part_of(q, k, v, kernel, (0, 0, 0), (0, 0, 0), None), 1.0, shape)
    if with_reference:
        out["reference"] = lambda q, k, v, kernel: na.na3d(q, k, v, kernel, scale=1.0, impl="reference")
    return out


def bench_shape(name: str, dtype: torch.dtype, blocks, rounds: int, with_reference: bool) -> list[dict]:
    shape, kernel = SHAPES[name]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g).to(dtype) for _ in range(3))
    runs = variants(blocks, with_reference)
    times = {key: [] for key in runs}
    outputs = {}
    for round_ in range(rounds):
        for key, fn in runs.items():
            if key == "reference" and round_:
                continue
            start = time.process_time()
            with torch.no_grad():
                outputs[key] = fn(q, k, v, kernel)
            times[key].append(time.process_time() - start)
    truth = outputs.get("reference", outputs[next(iter(outputs))]).float()
    kitchen = min(times["kitchen eager"]) if "kitchen eager" in times else None
    return [{"shape": f"{name} {'x'.join(map(str, shape))} k{'x'.join(map(str, kernel))}", "dtype": str(dtype)[6:],
             "variant": key, "min": min(t), "median": statistics.median(t),
             "speedup": kitchen / min(t) if kitchen else None,
             "error": ((outputs[key].float() - truth).abs().max() / max(1.0, truth.abs().max().item())).item(),
             "times": t} for key, t in times.items()]


def start(tool: str, threads: int | None) -> dict:
    """Print the command and the machine (returned); `threads` torch threads if given."""
    if threads:
        torch.set_num_threads(threads)
    print(f"python -m bench.{tool} " + " ".join(sys.argv[1:]))
    machine = machine_summary()
    print(json.dumps(machine))
    return machine


def finish(rows: list[dict], columns, machine: dict, path: Path | None) -> None:
    """Print the table; with `path`, write the command, the machine and the rows there as JSON."""
    print_table(rows, columns)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"command": sys.argv, "machine": machine, "rows": rows}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--blocks", nargs="+", default=list(DEFAULT_BLOCKS), help="query blocks t x h x w")
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-reference", action="store_true", help="leave the (slow) reference out")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    machine = start("bench_na", args.threads)
    rows = [row for name in args.shapes for dtype in args.dtypes
            for row in bench_shape(name, getattr(torch, dtype), args.blocks, args.rounds, not args.no_reference)]
    finish(rows, COLUMNS, machine, args.json)


if __name__ == "__main__":
    main()
