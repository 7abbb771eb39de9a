"""Wan2.1 / Wan2.2 decode at the full released configs: optimized vs straightforward, fp32 vs bf16.

    python bench/bench_wan.py                          # decode 9 frames of 256x256, both families
    python bench/bench_wan.py --families wan21         # latent 3x32x32 (Wan2.2: 3x16x16)
    python bench/bench_wan.py --quick                  # 5 frames of 128x128, 1 run after the warm-up
    python bench/bench_wan.py --json out/bench_wan.json

One process per family and dtype builds the full released config with random seeded weights
(N(0,1)/sqrt(fan_in), norm scales 1, biases 0) and decodes the same N(0,1) raw latent on both paths,
interleaved (warm-up each, then ABBA order) so a noisy machine slows both alike. Reported: median of
`--repeats` runs; memory per path: "peak act" = most a run allocates above the RSS it starts from
(VmHWM reset before each run), "retained" = what the path's first run leaves resident (caches, e.g.
Winograd filter transforms), "peak RSS" = weights + retained + peak act; speed-up and errors against
the float32 straightforward path; "eff. TFLOP/s" = upstream's FLOP count (the straightforward
path's) over the median time.

Half precision: before a bf16 process, one conv3d is timed in fp32 and bf16 (bench_vae's probe); if
the fp32 straightforward time times that ratio exceeds `--max-seconds` per run, the bf16 rows are
skipped with a printed note. Expect ~1.5 min (Wan2.1) / ~3.5 min (Wan2.2) per fp32 run on a 2-core
AVX2 CPU at ~55 GFLOP/s, i.e. 8 runs per family and dtype.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from bench.common import (DTYPES, build_random_model, ceilings, count_flops, machine_summary, peak_rss_bytes,  # noqa: E402
                          print_table, psnr, reset_peak_rss, rss_bytes, run_worker, scratch_dir)
from bench.families import FULL_CONFIGS, make_input  # noqa: E402
from optimizations import Optimizations  # noqa: E402

PATHS = {"straightforward": Optimizations.straightforward(), "optimized": Optimizations()}


def decode_flops(family: str, spec: dict, opts: Optimizations) -> int:
    """FLOPs of one decode with `opts`, counted on the meta device (no weights, no compute)."""
    family_cls, cfg = FULL_CONFIGS[family]()
    with torch.device("meta"):
        model = family_cls(cfg)
    model.opts = opts
    z = make_input(model, spec).to("meta")
    return count_flops(lambda: model.decode(z, temporal_chunk=spec["temporal_chunk"]))


def worker(spec: dict) -> dict:
    """Both paths for one family and dtype in this process; outputs saved under spec["out"] + path.

    Memory per path: "peak" is the most a run allocates above the RSS it starts from (VmHWM reset
    before each run), "retained" what the path's first run leaves resident (caches such as the
    Winograd filter transforms). The straightforward path runs first, so its numbers never include
    the optimized path's caches.
    """
    family_cls, cfg = FULL_CONFIGS[spec["family"]]()
    model = build_random_model(family_cls, cfg, DTYPES[spec["dtype"]])
    z = make_input(model, spec)
    base = rss_bytes()
    result = {path: {"times_s": [], "peak": 0} for path in PATHS}

    def run(path):
        model.opts = PATHS[path]
        before = rss_bytes()
        reset_peak_rss()
        start = time.perf_counter()
        out = model.decode(z, temporal_chunk=spec["temporal_chunk"])
        elapsed = time.perf_counter() - start
        r = result[path]
        r["peak"] = max(r["peak"], peak_rss_bytes() - before)
        r.setdefault("retained", rss_bytes() - before)
        return out, elapsed

    order = list(PATHS)
    for _ in range(spec["warmup"]):
        for path in order:
            run(path)
    for i in range(spec["repeats"]):
        for path in order if i % 2 == 0 else order[::-1]:
            out, elapsed = run(path)
            result[path]["times_s"].append(elapsed)
            save_file({"out": out.float().contiguous()}, f"{spec['out']}-{path}.safetensors")
    for r in result.values():
        r.update(median_s=statistics.median(r["times_s"]), weights_rss=base)
    return result


def bench_family(family: str, args, slowdown: dict[str, float], notes: list[str]) -> list[dict]:
    spec = dict(family=family, frames=args.frames, height=args.height, width=args.width, op="decode",
                repeats=args.repeats, warmup=args.warmup, temporal_chunk=args.temporal_chunk)
    # Every row's TFLOP/s counts upstream's work (the straightforward path) so rows compare; the
    # optimized path does fewer FLOPs (sub-pixel upsample convs, skipped zero-head taps).
    flops = decode_flops(family, spec, PATHS["straightforward"])
    notes.append(f"{family}: decode {flops / 1e12:.2f} TFLOP as upstream computes it, "
                 f"{decode_flops(family, spec, PATHS['optimized']) / 1e12:.2f} TFLOP on the optimized path")
    rows, baseline = [], None
    for dtype in args.dtypes:
        if baseline is not None and dtype != "fp32" and baseline[0] * slowdown[dtype] > args.max_seconds:
            notes.append(f"{family} {dtype}: skipped; one run predicted {baseline[0] * slowdown[dtype]:.0f} s (conv3d "
                         f"{dtype} takes {slowdown[dtype]:.1f}x the fp32 time here) > --max-seconds {args.max_seconds:.0f}")
            continue
        out = scratch_dir() / f"wan-{family}-{args.frames}x{args.height}x{args.width}-{dtype}"
        result = run_worker("bench.bench_wan", dict(spec, dtype=dtype, out=str(out)))
        for path in PATHS:
            r, output = result[path], load_file(f"{out}-{path}.safetensors")["out"]
            if baseline is None:
                baseline = (r["median_s"], output)
            row = dict(family=family, shape=f"{args.frames}x{args.height}x{args.width}", dtype=dtype, path=path,
                       time=r["median_s"], fastest=min(r["times_s"]), speedup=baseline[0] / r["median_s"],
                       tflops=flops / r["median_s"] / 1e12, peak_act=r["peak"] / 2**30, retained=r["retained"] / 2**30,
                       peak_rss=(r["weights_rss"] + r["retained"] + r["peak"]) / 2**30,
                       max_err=(output - baseline[1]).abs().max().item())
            row["psnr"] = psnr(output, baseline[1]) if row["max_err"] > 0 else None
            if path == "optimized":
                row["opt_ratio"] = result["straightforward"]["median_s"] / r["median_s"]
            rows.append(row)
            print(f"  {family} {dtype} {path}: median {row['time']:.1f} s of "
                  f"{[round(t, 1) for t in r['times_s']]}", file=sys.stderr, flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["wan21", "wan22"], choices=["wan21", "wan22"])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--frames", type=int, default=9, help="output frames (1 + 4k)")
    parser.add_argument("--size", default="256x256", help="output HxW in pixels (multiples of 16)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--temporal-chunk", type=int, default=None, help="latent frames per step (default 1)")
    parser.add_argument("--max-seconds", type=float, default=180.0, help="skip half-precision rows predicted slower")
    parser.add_argument("--quick", action="store_true", help="5 frames of 128x128, 1 run after the warm-up")
    parser.add_argument("--json", help="also write the rows and machine info to this file")
    args = parser.parse_args()
    if args.quick:
        args.frames, args.size, args.repeats = 5, "128x128", 1
    args.dtypes = ["fp32"] + [d for d in args.dtypes if d != "fp32"]  # fp32 first: the baseline
    args.height, args.width = (int(v) for v in args.size.lower().split("x"))

    machine = machine_summary()
    limits = ceilings(args.dtypes)
    slowdown = {d: limits["conv3d_fp32"] / limits[f"conv3d_{d}"] for d in args.dtypes}
    rows, notes = [], []
    for family in args.families:
        rows.extend(bench_family(family, args, slowdown, notes))

    print(f"\nmachine: {machine}")
    print("conv3d probe (same run): " + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in limits.items()) + "\n")
    print_table(rows, [("family", "family", "s"), ("shape", "TxHxW", "s"), ("dtype", "dtype", "s"), ("path", "path", "s"),
                       ("time", "median s", ".1f"), ("fastest", "min s", ".1f"), ("opt_ratio", "straight / opt", ".2f"),
                       ("speedup", "vs fp32 straight", ".2f"), ("tflops", "eff. TFLOP/s", ".3f"),
                       ("peak_act", "peak act GiB", ".2f"), ("retained", "retained GiB", ".2f"),
                       ("peak_rss", "peak RSS GiB", ".2f"),
                       ("max_err", "max err", ".2e"), ("psnr", "PSNR dB", ".1f")])
    for note in notes:
        print(f"note: {note}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": machine, "ceilings": limits, "rows": rows, "notes": notes}, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):  # run_worker: python -m bench.bench_wan '<json spec>'
        torch.manual_seed(0)
        print(json.dumps(worker(json.loads(sys.argv[1]))))
    else:
        main()
