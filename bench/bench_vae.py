"""Encode/decode speed, memory and error of the full released VAE configs, side by side.

    python bench/bench_vae.py                      # SeedVR2, 5 and 9 frames of 256x256, fp32+bf16
    python bench/bench_vae.py --quick              # smaller and faster, for a smoke run
    python bench/bench_vae.py --json out/bench.json

Every variant (dtype x optimized/straightforward path) runs in its own process with random weights
(fixed seed) and the same input. Speed-up, max error and PSNR are against the float32 straightforward
path of the same run; TFLOP/s is the model's FLOPs over the median time, next to this machine's
GEMM / conv3d throughput measured in the same run.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from bench.common import ceilings, count_flops, machine_summary, print_table, psnr, run_worker, scratch_dir  # noqa: E402
from bench.families import FULL_CONFIGS, make_input  # noqa: E402

BASELINE = ("fp32", "straightforward")


def model_flops(family: str, spec: dict) -> int:
    """FLOPs of one encode/decode, counted on the meta device (no weights, no compute)."""
    family_cls, cfg = FULL_CONFIGS[family]()
    with torch.device("meta"):
        model = family_cls(cfg)
    x = make_input(model, spec).to("meta")
    fn = model.encode if spec["op"] == "encode" else model.decode
    return count_flops(lambda: fn(x, temporal_chunk=spec.get("temporal_chunk")))


def bench_workload(family, op, frames, height, width, args) -> list[dict]:
    base_spec = dict(family=family, op=op, frames=frames, height=height, width=width,
                     repeats=args.repeats, warmup=args.warmup, temporal_chunk=args.temporal_chunk)
    flops = model_flops(family, base_spec)
    variants = [BASELINE] + [(d, p) for d in args.dtypes for p in args.paths if (d, p) != BASELINE]
    rows, baseline = [], None
    for dtype, path in variants:
        out = scratch_dir() / f"{family}-{op}-{frames}-{dtype}-{path}.safetensors"
        result = run_worker("bench.worker", dict(base_spec, dtype=dtype, path=path, out=str(out)))
        output = load_file(str(out))["out"]
        row = dict(family=family, op=op, shape=f"{frames}x{height}x{width}", dtype=dtype, path=path,
                   time=result["median_s"], peak_gib=result["peak_activation"] / 2**30, tflops=flops / result["median_s"] / 1e12)
        if baseline is None:
            baseline = (result["median_s"], output)
        row["speedup"] = baseline[0] / result["median_s"]
        row["max_err"] = (output - baseline[1]).abs().max().item()
        row["psnr"] = psnr(output, baseline[1]) if row["max_err"] > 0 else None
        rows.append(row)
        print(f"  {family} {op} {row['shape']} {dtype} {path}: {row['time']:.2f} s", file=sys.stderr, flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["seedvr2"], choices=sorted(FULL_CONFIGS))
    parser.add_argument("--ops", nargs="+", default=["decode", "encode"], choices=["encode", "decode"])
    parser.add_argument("--frames", nargs="+", type=int, default=[5, 9])
    parser.add_argument("--size", default="256x256", help="HxW in pixels")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--paths", nargs="+", default=["optimized", "straightforward"],
                        help="optimized, straightforward, or the name of one switch to turn off")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--temporal-chunk", type=int, default=None, help="latent frames per step")
    parser.add_argument("--quick", action="store_true", help="5 frames of 128x128, 1 repeat, no warm-up")
    parser.add_argument("--json", help="also write the table and machine info to this file")
    args = parser.parse_args()
    if args.quick:
        args.frames, args.size, args.repeats, args.warmup = [5], "128x128", 1, 0
    height, width = (int(v) for v in args.size.lower().split("x"))

    machine = machine_summary()
    limits = ceilings(args.dtypes)
    rows = []
    for family in args.families:
        for op in args.ops:
            for frames in args.frames:
                rows.extend(bench_workload(family, op, frames, height, width, args))
    for row in rows:
        row["pct_conv_ceiling"] = 100 * row["tflops"] * 1e12 / limits[f"conv3d_{row['dtype']}"]

    print(f"\nmachine: {machine}")
    print("ceilings (same run): " + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in limits.items()) + "\n")
    print_table(rows, [("family", "family", "s"), ("op", "op", "s"), ("shape", "TxHxW", "s"), ("dtype", "dtype", "s"),
                       ("path", "path", "s"), ("time", "median s", ".2f"), ("speedup", "speed-up", ".2f"),
                       ("tflops", "TFLOP/s", ".3f"), ("pct_conv_ceiling", "% conv ceiling", ".0f"),
                       ("peak_gib", "peak act GiB", ".2f"), ("max_err", "max err", ".2e"), ("psnr", "PSNR dB", ".1f")])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": machine, "ceilings": limits, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
