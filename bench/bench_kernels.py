"""Measured kernel choice against the fixed defaults, the straightforward path, ComfyUI core and `auto`
precision: full released configs, decode, timed in interleaved rounds in one process.

    python -m bench.bench_kernels --families seedvr2 wan21 wan22 --frames 5 --size 256x256 --rounds 3
    python -m bench.bench_kernels --families ltx2 --core 0.33.0 --frames 17 --size 512x512
    python -m bench.bench_kernels --families hv15 --core 0.33.0 --variants optimized   # against core only

On a shared, loaded machine, rows timed minutes apart in separate processes (bench.bench_vae) see
different load; here every round runs each variant once, one after another, so load changes hit all
of them alike and the median over rounds gives the ratios. Rows per family (same random seeded
weights, same latent; names from the variant table, bench/variants.py): "straightforward" (every
switch off, default kernels: upstream's behaviour), "kernels_defaults" (every switch on, fixed default
kernels), "optimized" (every switch on, kernels measured on this machine: StreamVAE's default),
"bf16-optimized" (optimized in the precision `decode_dtype: auto` gives this CPU: bf16 with AVX-512
BF16/AMX; not run where that is fp32, as it is "optimized" then) and "core_<version>" where that core
has the family's VAE (--core: 0.3.75, Wan's WanVAE; 0.33.0, also SeedVR2's and LTX-2's; fp32; one
ComfyUI per process).

Before the rounds, the tuning overhead: the first measured decode with an empty kernel cache (it
tunes every new layer shape and computes the Winograd filter transforms) and the first one after the
in-memory state is dropped (choices read back from the disk cache, transforms recomputed), next to the
steady median. Peak memory per variant is bench.bench_vae's (one process per row); this script
reports time and error only. Results: a table per family and, with --json, a file with the machine
(CPU model and flags, torch, commit), the kernel choices of every layer shape and all times.
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
from bench.common import machine_summary, print_table, psnr
from bench.core_vae import TREES
from bench.variants import options, parse_row
from vae import families
from vae.kernels import backend
from vae.kernels import filter_cache, kernel_choice

VARIANTS = ("straightforward", "kernels_defaults", "optimized")


def timed(fn) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def decoder(model, variant: str, z: torch.Tensor):
    """A zero-argument decode of z by `model` with `variant`'s optimizations."""
    return lambda: models.run(model, "decode", z, opts=options(variant))


def bench_family(family: str, args) -> dict:
    z = models.make_input(family, dict(op="decode", frames=args.frames, height=args.height, width=args.width))
    auto = backend.auto_dtype("cpu", "decode")
    fp32 = models.drop_other_half(models.build(family, torch.float32), "decode")
    runs = {name: decoder(fp32, name, z) for name in args.variants}
    if auto != torch.float32:  # else `auto` is "optimized"
        runs[f"{backend.dtype_name(auto)}-optimized"] = decoder(
            models.drop_other_half(models.build(family, auto), "decode"), "optimized", z)
    if family in TREES[args.core].modules:
        core = models.drop_other_half(models.build(family, torch.float32, core=args.core), "decode")
        runs[f"core_{args.core}"] = lambda: core.decode(z)

    with torch.inference_mode():
        # Tuning overhead: an empty cache, then the disk cache alone (in-memory choices and transforms
        # dropped). In-memory state is dropped before the family too, so its summary counts its own shapes.
        kernel_choice._choices_for.cache_clear()
        first, _ = timed(runs["optimized"])
        tuning = kernel_choice.choices_for("cpu").summary()
        kernel_choice._choices_for.cache_clear()
        filter_cache.filter_cache().clear()
        cached_first, _ = timed(runs["optimized"])
        for name, run in runs.items():  # warm-up: every variant's transforms and oneDNN primitives
            run()
        times, outputs = {name: [] for name in runs}, {}
        for _ in range(args.rounds):
            for name, run in runs.items():
                seconds, outputs[name] = timed(run)
                times[name].append(seconds)
                print(f"  {family} {name}: {seconds:.2f} s", file=sys.stderr, flush=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    reference_row = next(iter(runs))  # the errors' reference: "straightforward" unless --variants leaves it out
    reference = outputs[reference_row].float()

    def ratio(base: str, name: str) -> float | None:
        return medians[base] / medians[name] if base in medians else None

    rows = [dict(family=family, variant=name, time=medians[name], times=times[name],
                 vs_straight=ratio("straightforward", name), vs_defaults=ratio("kernels_defaults", name),
                 vs_measured=ratio("optimized", name), max_err=(outputs[name].float() - reference).abs().max().item(),
                 psnr=psnr(outputs[name].float(), reference) if name != reference_row else None, dtype=parse_row(name)[0])
            for name in runs]
    if f"core_{args.core}" in medians:
        for row in rows:
            row["vs_core"] = medians[f"core_{args.core}"] / row["time"]
    return dict(rows=rows, tuning=dict(first_run_s=first, cached_first_run_s=cached_first,
                                       steady_s=medians["optimized"], **tuning))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=[families.SEEDVR2.name], choices=models.FAMILIES)
    parser.add_argument("--frames", type=int, default=5, help="pixel frames (1 + 4k; LTX-2: 1 + 8k)")
    parser.add_argument("--size", default="256x256", help="HxW in pixels")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--core", default="0.3.75", choices=list(TREES), help="the ComfyUI core whose VAE gets a row")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                        help="StreamVAE's rows (always with optimized, whose first runs give the tuning overhead)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    args.height, args.width = (int(v) for v in args.size.lower().split("x"))
    args.variants = [v for v in VARIANTS if v in args.variants or v == "optimized"]
    # A fresh kernel cache: the first measured decode pays for all its tuning.
    cache = tempfile.mkdtemp(prefix="streamvae-kernels-")
    os.environ[kernel_choice.CACHE_ENV] = cache
    machine = machine_summary()
    results = {family: bench_family(family, args) for family in args.families}
    print(f"\nmachine: {machine}\ndecode {args.frames}x{args.height}x{args.width}, median of {args.rounds} interleaved "
          f"rounds; `auto` decodes in {backend.auto_dtype('cpu', 'decode')} here\n")
    rows = [row for result in results.values() for row in result["rows"]]
    print_table(rows, [("family", "family", "s"), ("variant", "variant", "s"), ("dtype", "dtype", "s"),
                       ("time", "median s", ".2f"), ("vs_straight", "vs straightforward", ".2f"),
                       ("vs_core", "vs core", ".2f"), ("vs_defaults", "vs kernels_defaults", ".2f"),
                       ("vs_measured", "vs optimized", ".2f"), ("max_err", "max err", ".1e"), ("psnr", "PSNR dB", ".1f")])
    print()
    for family, result in results.items():
        t = result["tuning"]
        print(f"{family} kernel tuning: first run {t['first_run_s']:.1f} s ({t['measured']} shapes tuned in "
              f"{t['tuning_s']:.1f} s: {t['wins']}), first run from the disk cache {t['cached_first_run_s']:.1f} s, "
              f"steady {t['steady_s']:.1f} s")
    if args.json:
        choices = json.loads(next(Path(cache).glob("kernels-*.json")).read_text())
        Path(args.json).write_text(json.dumps({"machine": machine, "argv": sys.argv[1:], "results": results,
                                               "kernel_choices": choices}, indent=1))


if __name__ == "__main__":
    main()
