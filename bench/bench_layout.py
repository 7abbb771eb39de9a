"""Both activation layouts side by side under the engine's plans: the same decode in NDHWC and in NCDHW,
untiled, in exact tiles and with frames streamed one at a time.

    python -m bench.bench_layout --family seedvr2 --dtype bf16 --size 256x256 --frames 5

Full released config with seeded weights (bench/models.py), fixed kernels (both layouts run the same
default kernels), one latent frame per chunk. Rounds alternate the layouts (every case once per round);
the median of the rounds is reported, with the NDHWC speed-up and the largest difference between the
two layouts' frames (rounding of the precision).
"""
import argparse
import statistics
import time

import torch

import vae
from bench import models
from bench.common import machine_summary, print_table
from vae import families
from vae.kernels.backend import DTYPES

PLANS = {"untiled": dict(temporal_chunk=1), "exact tiles 128 px": dict(temporal_chunk=1, tile_size=128),
         "frames streamed": dict(temporal_chunk=1, stream_frames=True)}
LAYOUTS = ("ndhwc", "ncdhw")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default=families.SEEDVR2.name, choices=models.FAMILIES)
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--size", default="256x256", help="pixels, HxW")
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.split("x"))
    spec = dict(op="decode", frames=args.frames, height=height, width=width)
    model = models.build(args.family, DTYPES[args.dtype])
    z = models.make_input(args.family, spec)
    times = {(plan, layout): [] for plan in PLANS for layout in LAYOUTS}
    frames = {}
    for _ in range(args.rounds):
        for plan, settings in PLANS.items():
            for layout in LAYOUTS:
                opts = vae.Optimizations(kernel_choice="defaults", activation_layout=layout)
                start = time.perf_counter()
                frames[plan, layout] = models.run(model, "decode", z, settings, opts).float()
                times[plan, layout].append(time.perf_counter() - start)
    rows = []
    for plan in PLANS:
        ndhwc, ncdhw = (statistics.median(times[plan, layout]) for layout in LAYOUTS)
        rows.append(dict(plan=plan, ndhwc=ndhwc, ncdhw=ncdhw, speedup=ncdhw / ndhwc,
                         diff=(frames[plan, "ndhwc"] - frames[plan, "ncdhw"]).abs().max().item()))
    print(f"machine: {machine_summary()}\n{args.family} decode {args.frames}x{args.size} {args.dtype}, "
          f"median of {args.rounds} alternated rounds\n")
    print_table(rows, [("plan", "plan", "s"), ("ndhwc", "NDHWC s", ".2f"), ("ncdhw", "NCDHW s", ".2f"),
                       ("speedup", "NDHWC speed-up", ".2f"), ("diff", "max diff", ".1e")])


if __name__ == "__main__":
    main()
