"""Small odd tiles a user asks for, under `memory_budget="auto"` (what the nodes do by default): the plan
the engine picks, and its time against the untiled decode, side by side (issue 40).

    python -m bench.bench_user_tiles                 # Wan2.1 decode 9x128x128 fp32: untiled, 17/3, 16/15, 24/0
    python -m bench.bench_user_tiles --before 17/3   # + that tile as planned before the fix (one frame at a
                                                     #   time, caches on disk): the slow case the issue timed

The tiles a user gives are an upper limit on the tile, never a reason to leave memory: with the untiled
plan fitting, every valid tile runs whole chunks with the caches in memory. One process: the family's
released config with seeded weights (bench/models.py), the same kernels for every row (`--kernels`:
fixed defaults, or measured per layer shape, the nodes' default; every row runs once first, which pays
for its new shapes); then rounds alternate the rows (every row once per round), and the median of the
rounds is reported, wall time and the process's CPU time, so that a load from elsewhere on the machine
weighs on every row alike. The plan column is `vae.plan` for the row's settings; errors are max |row -
untiled| of the same weights and latent.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import vae
from bench import models
from bench.common import machine_summary, print_table
from vae import families

COLUMNS = [("row", "tiles (size/overlap px)", "s"), ("plan", "plan", "s"), ("time", "median s", ".2f"),
           ("ratio", "time vs untiled", ".2f"), ("cpu", "median CPU s", ".2f"), ("cpu_ratio", "CPU vs untiled", ".2f"),
           ("max_err", "max err vs untiled", ".1e")]


def pair(text: str) -> tuple[int, int]:
    size, overlap = text.split("/")
    return int(size), int(overlap)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default=families.WAN21.name, choices=models.FAMILIES)
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--size", default="128x128", help="HxW in pixels")
    parser.add_argument("--tiles", nargs="*", type=pair, default=[(17, 3), (16, 15), (24, 0)], help="size/overlap px")
    parser.add_argument("--before", nargs="*", type=pair, default=[],
                        help="tiles also run as planned before the fix: one frame at a time, caches on disk")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernels", choices=("defaults", "measure"), default="defaults",
                        help="fixed default kernels, or measured per layer shape (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: torch's default). 1 keeps a loaded machine's scheduling out of the "
                             "ratios: small tiles are many small parallel regions, each waiting for its slowest thread")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.lower().split("x"))
    if args.threads:
        torch.set_num_threads(args.threads)
    model = models.build(args.family, torch.float32)
    z = models.make_input(args.family, dict(op="decode", frames=args.frames, height=height, width=width))
    cases = {"untiled": dict(memory_budget="auto")}
    cases.update({f"{t}/{o}": dict(tile_size=t, tile_overlap=o, memory_budget="auto") for t, o in args.tiles})
    cases.update({f"{t}/{o}, as planned before": dict(tile_size=t, tile_overlap=o, temporal_chunk=1, stream_frames=True,
                                                      cache_offload="disk") for t, o in args.before})
    opts = vae.Optimizations(kernel_choice=args.kernels)
    plans = {label: models.plan(model, "decode", tuple(z.shape), settings, opts) for label, settings in cases.items()}
    times, cpu, frames = {label: [] for label in cases}, {label: [] for label in cases}, {}
    with torch.inference_mode():
        for label, plan in plans.items():  # first runs: kernel measurements for the row's new layer shapes
            frames[label] = models.run(model, "decode", z, plan, opts).float()
            print(f"  {label}: {plan.settings()}", file=sys.stderr, flush=True)
        for _ in range(args.rounds):
            for label, plan in plans.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                models.run(model, "decode", z, plan, opts)
                times[label].append(time.perf_counter() - start)
                cpu[label].append(time.process_time() - start_cpu)
            print(f"  round: {', '.join(f'{label} {t[-1]:.1f} s' for label, t in times.items())}", file=sys.stderr,
                  flush=True)
    untiled, untiled_cpu = statistics.median(times["untiled"]), statistics.median(cpu["untiled"])
    rows = [dict(row=label, plan=plans[label].settings(), time=statistics.median(times[label]),
                 ratio=statistics.median(times[label]) / untiled, cpu=statistics.median(cpu[label]),
                 cpu_ratio=statistics.median(cpu[label]) / untiled_cpu,
                 max_err=(frames[label] - frames["untiled"]).abs().max().item()) for label in cases]
    machine = machine_summary()
    print(f"\n{args.family} decode {args.frames}x{height}x{width} fp32, memory_budget auto, {machine['cpu']} "
          f"({machine['cpu_capability']}), {machine['threads']} threads, torch {machine['torch']}, commit "
          f"{machine['commit']}, {args.kernels} kernels, median of {args.rounds} alternated rounds\n")
    print_table(rows, COLUMNS)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
