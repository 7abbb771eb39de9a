"""Tiling: time, peak memory and error of untiled vs exact-tiled vs fast-tiled decoding, side by side.

    python -m bench.bench_tiling                      # SeedVR2 decode 9x256x384 fp32, tiles 128 / overlap 32
    python -m bench.bench_tiling --long-frames 65     # + 65 vs 9 frames untiled at --long-size (peak check)
    python -m bench.bench_tiling --modes --long-frames 65 --skip-timing   # only the clip-length peak check
    python -m bench.bench_tiling --quick              # smoke run: 5x128x192, tiles 64 / overlap 16, 1 run
    python -m bench.bench_tiling --cache-report       # only: what the causal caches hold between chunks
    python -m bench.bench_tiling --modes untiled exact exact-offload untiled-offload   # + caches on disk

Every row runs in its own processes: time in one (bench.worker: full released config, random seeded
weights, warm-up, then the median of --repeats), memory in another (bench.memory_worker: glibc's mmap
threshold fixed so RSS follows the live tensors, the Winograd cache filled by a tiny warm-up, one decode
into a preallocated output): "act" is the peak above what was resident just before the decode (the
activations, output excluded), "total" the peak above the process before the model existed (weights,
output and filter cache included). Errors are max |tiled - untiled| of the same run. The cache report
decodes two one-latent-frame chunks and sums the causal caches the second one leaves (per layer
resolution): memory that every exact mode keeps whole-frame between chunks, so tiling cannot cut it.
The "-offload" rows move those caches off the compute device between chunks (`cache_offload`: on
this CPU to a temporary file, which only the page cache holds; on a GPU to pinned host memory).
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from bench import models
from bench.common import machine_summary, print_table, run_worker, scratch_dir
from vae import families
from vae.run import memory, planning

COLUMNS = [("mode", "mode", "s"), ("shape", "TxHxW", "s"), ("tile", "tile/overlap px", "s"), ("time", "median s", ".2f"),
           ("time_ratio", "time vs first row", ".2f"), ("act_gib", "act GiB", ".3f"),
           ("act_ratio", "first row act / act", ".2f"), ("total_gib", "total GiB", ".3f"),
           ("total_ratio", "total vs first row", ".2f"), ("max_err", "max err vs untiled", ".1e")]


def measure(args, label, frames, engine, repeats) -> tuple[dict, object]:
    """One row: time and output (unless --skip-timing), then the memory of the same decode."""
    spec = dict(family=args.family, op="decode", frames=frames, height=args.height, width=args.width,
                temporal_chunk=args.temporal_chunk)
    row, out = dict(mode=label, shape=f"{frames}x{args.height}x{args.width}",
                    tile=f"{args.tile}/{engine.get('tile_overlap', 0)}" if "tile_size" in engine else "-"), None
    if not args.skip_timing:
        path = scratch_dir() / f"tiling-{label}-{frames}.safetensors"
        result = run_worker("bench.worker", dict(spec, dtype="fp32", variant="optimized", repeats=repeats,
                                                 warmup=args.warmup, engine=engine, out=str(path)))
        row["time"], out = statistics.median(result["times_s"]), load_file(str(path))["out"]
    memory = run_worker("bench.memory_worker", dict(spec, **engine))
    row.update(act_gib=memory["activation_bytes"] / 2**30, total_gib=memory["peak_bytes"] / 2**30)
    print(f"  {label} {frames} frames: {row.get('time', float('nan')):.2f} s, act {row['act_gib']:.3f} GiB",
          file=sys.stderr, flush=True)
    return row, out


def relative_to(row: dict, first: dict) -> None:
    for key, ratio, inverse in (("time", "time_ratio", False), ("act_gib", "act_ratio", True),
                                ("total_gib", "total_ratio", False)):
        if row.get(key) is not None:
            row[ratio] = first[key] / row[key] if inverse else row[key] / first[key]


def causal_cache_report(args) -> None:
    """Bytes of causal cache per layer resolution after two decode chunks of one latent frame (fp32)."""
    model = models.build(args.family, torch.float32)
    sf = model.spatial_factor
    by_size = {}
    for shape, nbytes in memory.steady_cache_sizes(model, "decode", (args.height // sf, args.width // sf)):
        entry = by_size.setdefault(tuple(shape[-2:]), [0, 0])
        entry[0] += 1
        entry[1] += nbytes
    rows = [dict(size=f"{h}x{w}", tensors=n, mib=b / 2**20) for (h, w), (n, b) in sorted(by_size.items())]
    total = sum(b for _, b in by_size.values())
    rows.append(dict(size="total", tensors=sum(n for n, _ in by_size.values()), mib=total / 2**20))
    print(f"\n{args.family} decode {args.height}x{args.width} fp32: causal caches between chunks, "
          f"{total / (args.height * args.width) / 1024:.1f} KiB per output pixel\n")
    print_table(rows, [("size", "layer HxW", "s"), ("tensors", "cached tensors", "d"), ("mib", "MiB", ".1f")])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default=families.SEEDVR2.name, choices=models.FAMILIES)
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--size", default="256x384", help="HxW in pixels")
    parser.add_argument("--tile", type=int, default=128, help="tile size, pixels")
    parser.add_argument("--overlap", type=int, default=32, help="fast-mode overlap, pixels")
    parser.add_argument("--temporal-chunk", type=int, default=None, help="latent frames per step (default 1)")
    parser.add_argument("--long-frames", type=int, default=0, help="also decode --frames and this many frames untiled (peak check)")
    parser.add_argument("--long-size", default="128x192", help="HxW of the clip-length check")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cache-report", action="store_true", help="only report the causal caches' size")
    parser.add_argument("--skip-timing", action="store_true", help="memory rows only (no timed runs, no errors)")
    parser.add_argument("--modes", nargs="*", default=["untiled", "exact", "fast"],
                        choices=["untiled", "exact", "fast", "exact-offload", "untiled-offload"],
                        help="which of the side-by-side rows to run (none: only the --long-frames rows)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    if args.quick:
        args.frames, args.size, args.tile, args.overlap, args.repeats, args.warmup = 5, "128x192", 64, 16, 1, 0
    args.height, args.width = (int(v) for v in args.size.lower().split("x"))
    if args.cache_report:
        return causal_cache_report(args)
    offload = dict(cache_offload=planning.offload_target("cpu"))
    modes = {"untiled": {}, "exact": dict(tile_size=args.tile),
             "fast": dict(tile_size=args.tile, tile_overlap=args.overlap, tiling="fast"),
             "exact-offload": dict(tile_size=args.tile, **offload), "untiled-offload": offload}
    rows, reference = [], None
    for mode, engine in ((mode, modes[mode]) for mode in args.modes):
        row, out = measure(args, mode, args.frames, engine, args.repeats)
        reference = reference or (row, out)
        relative_to(row, reference[0])
        if out is not None:
            row["max_err"] = (out - reference[1]).abs().max().item()
        rows.append(row)
    if args.long_frames:  # clip length: the peak must not grow with it (streamed into the output)
        args.height, args.width = (int(v) for v in args.long_size.lower().split("x"))
        base = None
        for frames in (args.frames, args.long_frames):
            row, _ = measure(args, "untiled", frames, {}, 1)
            base = base or row
            relative_to(row, base)
            rows.append(row)
    machine = machine_summary()
    print(f"\n{args.family} decode fp32, {machine['cpu']} ({machine['cpu_capability']}), {machine['threads']} threads, "
          f"torch {machine['torch']}, temporal chunk {args.temporal_chunk or 1} latent frame(s)\n")
    print_table(rows, COLUMNS)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
