"""Speed, memory and error of the full released VAE configs: every optimization, one row each.

    python -m bench.bench_vae                                   # SeedVR2 decode 9x256x256, fp32 + bf16
    python -m bench.bench_vae --families seedvr2 wan21 wan22    # + Wan (and ComfyUI core's Wan VAE)
    python -m bench.bench_vae --quick                           # smoke run: 5x64x64, 1 run, few rows
    python -m bench.bench_vae --json out/bench.json             # also write the table

Rows per family, op and shape (the variant table, bench/variants.py): "straightforward" (every switch
off: upstream's behaviour) and "optimized" (every switch on) in each of --dtypes; in each of
--toggle-dtypes one "no-<switch>" row per switch (the optimized path with that switch alone off: the
switch's effect), the extras (kernels_defaults: the fixed default kernels instead of the measured ones;
kernels_cached: the optimized row again in a new process that reads the kernel choices the optimized
row measured; both activation layouts, the Winograd cache without its cap, torch.compile with --compile) and
ComfyUI core's VAE with the same weights and input (--core: its version; 0.3.75 has Wan's only).
Kernel choices go to a fresh cache folder per invocation (unless STREAMVAE_KERNEL_CACHE is set): "1st run s" is the first (untimed) run of each
row, which pays for kernel tuning where the "kernel tuning" column says so. Every row runs in
its own process: the model is built with random seeded weights, warmed up (--warmup runs), then run
--repeats times; the median is reported. Speed-up and error (max abs, PSNR over the [-1, 1] range)
are against the float32 straightforward row of the same run; TFLOP/s is upstream's FLOP count (torch's
FLOP counter over the baseline's first warm-up; the optimized path does fewer) over the median, next
to this machine's GEMM throughput measured in the same run. A second table lists the optimizations this machine cannot
measure (CUDA-only ones without a GPU) with their verdicts.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from bench.common import ceilings, machine_summary, print_table, psnr, run_worker, scratch_dir
from bench.core_vae import TREES
from bench.models import FAMILIES
from bench.variants import NOT_MEASURED, SWITCHES, VARIANTS, is_extra, variant, verdict
from vae import families
from vae.kernels.backend import DTYPES
from vae.kernels import kernel_choice

BASELINE = ("fp32", "straightforward")
DEFAULT_EXTRAS = ("kernels_defaults", "kernels_cached", "ndhwc", "ncdhw", "winograd_uncapped")
COLUMNS = [("family", "family", "s"), ("op", "op", "s"), ("shape", "TxHxW", "s"), ("dtype", "dtype", "s"),
           ("variant", "variant", "s"), ("time", "median s", ".2f"), ("fastest", "min s", ".2f"),
           ("first_s", "1st run s", ".2f"), ("tuning", "kernel tuning", "s"),
           ("speedup", "vs fp32 straight", ".2f"), ("tflops", "TFLOP/s", ".3f"), ("pct_gemm", "% GEMM", ".0f"),
           ("peak_gib", "peak act GiB", ".2f"), ("weights_gib", "weights GiB", ".2f"),
           ("max_err", "max err", ".1e"), ("psnr", "PSNR dB", ".1f"), ("verdict", "verdict", "s")]


def variants_for(family: str, args) -> list[tuple[str, str]]:
    """(dtype, variant) in run order, the fp32 straightforward baseline first."""
    toggles = [f"no-{s}" for s in SWITCHES if s != "triton_norm" or torch.cuda.is_available()]
    core = f"core_{args.core}" if args.core else None
    out = [BASELINE]
    if args.only:
        # core's VAE runs in fp32 only (in half precision it would take a CPU's reference kernels); as
        # without --only, toggles and extras run in --toggle-dtypes only
        return out + [(d, v) for d in args.dtypes for v in args.only
                      if (d, v) != BASELINE and (variant(v).core is None or d == "fp32")
                      and (v in ("straightforward", "optimized") or variant(v).core or d in args.toggle_dtypes)]
    for dtype in args.dtypes:
        names = ["straightforward", "optimized"]
        if dtype in args.toggle_dtypes:
            names += toggles + list(args.extras)
        if dtype == "fp32" and core and family in TREES[args.core].modules:
            names.append(core)
        out += [(dtype, v) for v in names if (dtype, v) != BASELINE]
    return out


def bench_workload(family: str, op: str, frames: int, height: int, width: int, args, gemm: dict) -> tuple[list, list]:
    spec = dict(family=family, op=op, frames=frames, height=height, width=width, repeats=args.repeats,
                warmup=args.warmup, temporal_chunk=args.temporal_chunk)
    notes, rows, baseline, fastest, upstream = [], [], None, {}, None
    for dtype, name in variants_for(family, args):
        out = scratch_dir() / f"{family}-{op}-{frames}x{height}x{width}-{dtype}-{name}.safetensors"
        try:
            result = run_worker("bench.worker", dict(spec, dtype=dtype, variant=name, out=str(out),
                                                     count_flops=upstream is None))
        except RuntimeError as error:
            notes.append(f"{family} {dtype} {name}: failed, no row ({str(error).strip().splitlines()[-1][:200]})")
            print(f"  {family} {op} {dtype} {name}: FAILED", file=sys.stderr, flush=True)
            continue
        output, median = load_file(str(out))["out"], statistics.median(result["times_s"])
        if baseline is None:
            baseline, upstream = (median, output), result["flops"]
            notes.append(f"{family} {op} {frames}x{height}x{width}: {upstream / 1e12:.3f} TFLOP as upstream computes it")
        if name == "optimized":
            fastest[dtype] = median
        row = dict(family=family, op=op, shape=f"{frames}x{height}x{width}", dtype=dtype, variant=name,
                   what=variant(name).what, time=median, fastest=min(result["times_s"]), times=result["times_s"],
                   speedup=baseline[0] / median, tflops=upstream / median / 1e12,
                   pct_gemm=100 * upstream / median / gemm[dtype], peak_gib=result["peak_activation"] / 2**30,
                   retained_gib=result["retained"] / 2**30, weights_gib=result["weight_bytes"] / 2**30,
                   max_err=(output - baseline[1]).abs().max().item())
        row["psnr"] = psnr(output, baseline[1]) if row["max_err"] > 0 else None
        row["first_s"], row["tuning"] = result.get("first_run_s"), tuning_text(result.get("kernels"))
        row["verdict"] = verdict(name, median, fastest.get(dtype))
        if result.get("compile"):  # e.g. blocks that ran past the recompile limit, or eager tile steps
            row["verdict"] += f"; {result['compile']}"
        rows.append(row)
        print(f"  {family} {op} {row['shape']} {dtype} {name}: median {median:.2f} s of "
              f"{[round(t, 2) for t in result['times_s']]}", file=sys.stderr, flush=True)
    return rows, notes


def tuning_text(kernels: dict | None) -> str | None:
    """What the worker's process did about kernel choices: tuned shapes and time, or reused ones."""
    if not kernels:
        return None
    return f"{kernels['measured']} tuned {kernels['tuning_s']:.1f} s, {kernels['reused']} cached"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=[families.SEEDVR2.name], choices=FAMILIES)
    parser.add_argument("--ops", nargs="+", default=["decode"], choices=["encode", "decode"])
    parser.add_argument("--frames", nargs="+", type=int, default=[9], help="pixel frames (1 + 4k)")
    parser.add_argument("--size", default="256x256", help="HxW in pixels")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    parser.add_argument("--toggle-dtypes", nargs="*", default=["fp32"],
                        help="dtypes that get the per-switch and extra rows (others: optimized + straightforward)")
    parser.add_argument("--extras", nargs="*", default=list(DEFAULT_EXTRAS), choices=[v for v in VARIANTS if is_extra(v)])
    parser.add_argument("--compile", action="store_true", help="add the torch.compile (inductor) row")
    parser.add_argument("--core", default="0.3.75", choices=list(TREES), help="the ComfyUI core whose VAE gets a row")
    parser.add_argument("--no-core", dest="core", action="store_const", const=None, help="skip ComfyUI core's VAE rows")
    parser.add_argument("--only", nargs="+", metavar="VARIANT", choices=list(VARIANTS),
                        help="run just these variants per dtype (after the fp32 straightforward baseline; toggles "
                             "and extras in --toggle-dtypes only), e.g. optimized no-winograd_conv ndhwc core_0.3.75")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--temporal-chunk", type=int, default=None, help="latent frames per step")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 5x64x64, fp32, 1 run after 1 warm-up, optimized/straightforward/core only")
    parser.add_argument("--json", help="also write the rows, ceilings and machine info to this file")
    args = parser.parse_args()
    if args.compile and "compile" not in args.extras:
        args.extras.append("compile")
    if args.quick:
        args.frames, args.size, args.repeats, args.warmup = [5], "64x64", 1, 1
        args.dtypes, args.toggle_dtypes, args.extras = ["fp32"], [], []
    if "fp32" not in args.dtypes:
        args.dtypes.insert(0, "fp32")  # the baseline
    height, width = (int(v) for v in args.size.lower().split("x"))

    # Kernel choices: a fresh cache for this run (unless one is given), so the first measuring row pays
    # for the tuning, later rows (kernels_cached) read it, and the "1st run s" column shows both costs.
    os.environ.setdefault(kernel_choice.CACHE_ENV, str(scratch_dir() / f"kernels-{time.strftime('%Y%m%d-%H%M%S')}"))
    machine = machine_summary()
    limits = ceilings(sorted({"fp32", *args.dtypes}))
    # The GEMM throughput a dtype's convs can reach here: without native half-precision kernels they
    # run in float32, so float32's GEMM is their ceiling too.
    gemm = {d: max(limits[f"gemm_{d}"], limits["gemm_fp32"]) for d in args.dtypes}
    rows, notes = [], []
    for family in args.families:
        for op in args.ops:
            for frames in args.frames:
                r, n = bench_workload(family, op, frames, height, width, args, gemm)
                rows.extend(r)
                notes.extend(n)
    if not machine["native_bf16_conv"]:
        notes.append("this CPU has no native bf16/fp16 conv kernels: half-precision convs are computed in fp32 "
                     "(vae/kernels/conv.py), so bf16 rows can only gain from halved memory traffic")
    if not torch.cuda.is_available():
        notes.append("no CUDA device: the triton_norm switch changes nothing on the CPU and has no row; "
                     "CUDA-only optimizations are listed below as not measured")

    notes.append(f"kernel choices cached in {os.environ[kernel_choice.CACHE_ENV]}")
    print(f"\nmachine: {machine}")
    print("ceilings (same run): " + ", ".join(f"{k} {v / 1e9:.3g} GFLOP/s" for k, v in limits.items()) + "\n")
    print_table(rows, COLUMNS)
    print()
    for note in notes:
        print(f"note: {note}")
    print("\nNot measured on this machine:\n")
    not_measured = [dict(optimization=o, verdict=v) for o, v in NOT_MEASURED]
    print_table(not_measured, [("optimization", "optimization", "s"), ("verdict", "verdict", "s")])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": machine, "ceilings": limits, "rows": rows, "notes": notes,
                                               "not_measured": not_measured, "argv": sys.argv[1:]}, indent=1))


if __name__ == "__main__":
    main()
