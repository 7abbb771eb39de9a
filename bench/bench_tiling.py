"""Tiling: time, peak memory and error of untiled vs exact-tiled vs fast-tiled decoding, side by side.

    python bench/bench_tiling.py                      # SeedVR2 decode 9x256x384 fp32, tiles 128 / overlap 32
    python bench/bench_tiling.py --long-frames 65     # + 65 vs 9 frames untiled at --long-size (peak check)
    python bench/bench_tiling.py --quick              # smoke run: 5x128x192, tiles 64 / overlap 16, 1 run

Every row runs in its own process (bench/worker.py: full released config, random seeded weights,
warm-up, then the median of --repeats). Peak is the most the timed runs allocate above the process's
resident set before them (peak RSS on the CPU), so it covers activations and the decode's output.
Errors are max |tiled - untiled| of the same run.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import statistics  # noqa: E402

from safetensors.torch import load_file  # noqa: E402

from bench.common import machine_summary, print_table, run_worker, scratch_dir  # noqa: E402

COLUMNS = [("mode", "mode", "s"), ("shape", "TxHxW", "s"), ("tile", "tile/overlap px", "s"), ("time", "median s", ".2f"),
           ("time_ratio", "time vs untiled", ".2f"), ("peak_gib", "peak GiB", ".3f"),
           ("peak_ratio", "untiled peak / peak", ".2f"), ("max_err", "max err vs untiled", ".1e")]


def measure(args, label, frames, engine, repeats) -> tuple[dict, object]:
    out = scratch_dir() / f"tiling-{label}-{frames}.safetensors"
    spec = dict(family=args.family, op="decode", frames=frames, height=args.height, width=args.width, dtype="fp32",
                variant="optimized", repeats=repeats, warmup=args.warmup, temporal_chunk=args.temporal_chunk,
                engine=engine, out=str(out))
    result = run_worker("bench.worker", spec)
    print(f"  {label} {frames} frames: {statistics.median(result['times_s']):.2f} s", file=sys.stderr, flush=True)
    return result, load_file(str(out))["out"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="seedvr2", choices=["seedvr2", "wan21", "wan22"])
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
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    if args.quick:
        args.frames, args.size, args.tile, args.overlap, args.repeats, args.warmup = 5, "128x192", 64, 16, 1, 0
    args.height, args.width = (int(v) for v in args.size.lower().split("x"))
    shape = f"{args.frames}x{args.height}x{args.width}"
    modes = [("untiled", {}), ("exact", dict(tile_size=args.tile)),
             ("fast", dict(tile_size=args.tile, tile_overlap=args.overlap, tiling="fast"))]
    rows, reference = [], None
    for mode, engine in modes:
        result, out = measure(args, mode, args.frames, engine, args.repeats)
        row = dict(mode=mode, shape=shape, tile="-" if not engine else f"{args.tile}/{engine.get('tile_overlap', 0)}",
                   time=statistics.median(result["times_s"]), peak_gib=result["peak_activation"] / 2**30)
        if reference is None:
            reference = (row, out)
        row["time_ratio"] = row["time"] / reference[0]["time"]
        row["peak_ratio"] = reference[0]["peak_gib"] / row["peak_gib"]
        row["max_err"] = (out - reference[1]).abs().max().item()
        rows.append(row)
    if args.long_frames:  # clip length: the peak must not grow with it (streamed into the output)
        args.height, args.width = (int(v) for v in args.long_size.lower().split("x"))
        base = None
        for frames in (args.frames, args.long_frames):
            result, _ = measure(args, "untiled", frames, {}, 1)
            row = dict(mode="untiled", shape=f"{frames}x{args.height}x{args.width}", tile="-",
                       time=statistics.median(result["times_s"]), peak_gib=result["peak_activation"] / 2**30)
            base = base or row
            row.update(time_ratio=row["time"] / base["time"], peak_ratio=base["peak_gib"] / row["peak_gib"])
            rows.append(row)
    machine = machine_summary()
    print(f"\n{args.family} decode fp32, {machine['cpu']} ({machine['cpu_capability']}), {machine['threads']} threads, "
          f"torch {machine['torch']}, temporal chunk {args.temporal_chunk or 1} latent frame(s)\n")
    print_table(rows, COLUMNS)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
