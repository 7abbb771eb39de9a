"""Winograd F(m x m, 3 x 3) conv3d against oneDNN, per layer shape, side by side in one process.

    python -m bench.bench_winograd                 # decoder layers + channel sweep, F(2), F(4), F(6)
    python -m bench.bench_winograd --layers quick  # a few smaller layers
    python -m bench.bench_winograd --threads 1     # per-core efficiency (a noisy machine hurts less)
    python -m bench.bench_winograd --layers ltx2 --tiles 4 --gemm onednn --layout ndhwc
                                                   # LTX-2's 720p decoder convs as a run takes them

Per layer (x B,Cin,T,H,W -> Cout, kernel kt x 3 x 3, stride 1, padding (0, 1, 1)), activations and
weights in --layout: median time of oneDNN (the dispatch's path with the switch off) and of each
Winograd tile size (its GEMMs on --gemm), timed in
interleaved rounds after a warm-up (which also fills the filter-transform cache, as in a decode),
speed-up, max abs difference to oneDNN and throughput counted as direct-conv FLOPs. The accuracy
table compares every float32 kernel, oneDNN included, with a float64 reference.
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from bench.common import print_table
from vae.kernels.conv import conv3d
from vae.kernels.filter_cache import FilterCache
from vae.kernels.activation_layout import FORMATS
from vae.kernels.winograd import winograd_conv3d
from vae.kernels.winograd_gemm import GEMM_ROUTES

CACHE = FilterCache(1 << 34)  # every transform stays: the timings compare kernels, not cache misses

# (Cin, Cout, kt, T, H, W): SeedVR2 decoder convs (5 frames of 128x128 decode to these, 256x256 to
# twice the size), then a channel sweep at one size for the crossover.
DECODER = [
    (512, 512, 3, 3, 16, 16), (512, 512, 3, 4, 32, 32), (512, 512, 3, 3, 64, 64),
    (512, 512, 1, 2, 32, 32), (512, 256, 3, 6, 64, 64), (256, 256, 3, 6, 64, 64),
    (256, 256, 3, 6, 128, 128), (256, 128, 3, 6, 128, 128), (128, 128, 3, 6, 128, 128),
    (128, 128, 3, 6, 256, 256), (16, 512, 3, 3, 16, 16), (128, 3, 3, 6, 128, 128),
]
SWEEP = [(c, c, 3, 6, 64, 64) for c in (16, 32, 64, 128, 256, 512)] + [(c, c, 1, 3, 64, 64) for c in (32, 64, 128, 256)]
# LTX-2's decoder convs at 9x704x1280 (its residual groups' convs, frames with their replicated ends).
LTX2 = [(128, 128, 3, 11, 176, 320), (256, 256, 3, 7, 88, 160), (512, 512, 3, 5, 44, 80), (1024, 1024, 3, 4, 22, 40)]
QUICK = [(512, 512, 3, 4, 32, 32), (256, 256, 3, 6, 64, 64), (128, 128, 3, 6, 128, 128),
         (64, 64, 3, 6, 64, 64), (16, 16, 3, 6, 64, 64)]
ACCURACY = [(256, 256, 3, 3, 32, 32), (512, 512, 3, 3, 16, 16), (128, 128, 1, 2, 33, 31)]


def interleaved_medians(fns: dict, repeats: int, warmup: int) -> dict:
    """Median seconds of each fn, timed in rounds that run every fn once (noise hits all alike)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def layer_inputs(cin, cout, kt, t, h, w, seed=0, layout="ncdhw"):
    """Activations ~N(0,1), weights N(0,1)/sqrt(fan_in) (outputs O(1), as in the models), bias; activations
    and weights in `layout`, as a run's plan puts them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, cin, t, h, w, generator=g).contiguous(memory_format=FORMATS[layout])
    weight = (torch.randn(cout, cin, kt, 3, 3, generator=g) / (cin * kt * 9) ** 0.5).contiguous(memory_format=FORMATS[layout])
    return x, weight, torch.randn(cout, generator=g) * 0.1


def bench_layer(shape, tiles, repeats, warmup, layout="ncdhw", gemm="mkl") -> dict:
    cin, cout, kt, t, h, w = shape
    x, weight, bias = layer_inputs(*shape, layout=layout)
    onednn = lambda: conv3d(x, weight, bias, (1, 1, 1), (0, 1, 1))  # noqa: E731
    fns = {"onednn": onednn}
    for m in tiles:  # each tile size gets its own weight tensor, hence its own cached transform
        fns[f"F{m}"] = lambda m=m, wm=weight.clone(): winograd_conv3d(x, wm, bias, CACHE, m, gemm=gemm)
    medians = interleaved_medians(fns, repeats, warmup)
    ref = onednn()
    flops = 2 * cin * cout * kt * 9 * (t - kt + 1) * h * w
    row = dict(layer=f"{cin}->{cout} k{kt} {t}x{h}x{w}", onednn_ms=medians["onednn"] * 1e3,
               onednn_gflops=flops / medians["onednn"] / 1e9)
    for m in tiles:
        row[f"F{m}_ms"] = medians[f"F{m}"] * 1e3
        row[f"F{m}_x"] = medians["onednn"] / medians[f"F{m}"]
        row[f"F{m}_gflops"] = flops / medians[f"F{m}"] / 1e9
        row[f"F{m}_err"] = (fns[f"F{m}"]() - ref).abs().max().item()
    return row


def accuracy_row(shape, tiles) -> dict:
    x, weight, bias = layer_inputs(*shape)
    ref = F.conv3d(x.double(), weight.double(), bias.double(), 1, (0, 1, 1))
    scale = ref.abs().max().item()
    outputs = {"onednn": conv3d(x, weight, bias, (1, 1, 1), (0, 1, 1))}
    outputs.update({f"F{m}": winograd_conv3d(x, weight, bias, CACHE, m) for m in tiles})
    row = dict(layer=f"{shape[0]}->{shape[1]} k{shape[2]} {shape[3]}x{shape[4]}x{shape[5]}", max_ref=scale)
    for name, out in outputs.items():
        err = out.double() - ref
        row[f"{name}_max"] = err.abs().max().item()
        row[f"{name}_rel"] = err.abs().max().item() / scale
        row[f"{name}_rms"] = (err.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiles", nargs="+", type=int, default=[2, 4, 6], choices=[2, 4, 6])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--layers", choices=["all", "decoder", "sweep", "quick", "ltx2"], default="all",
                        help="SeedVR2 decoder shapes, the channel sweep, both, a few small layers, or LTX-2's")
    parser.add_argument("--layout", choices=list(FORMATS), default="ncdhw", help="activations' and weights' layout")
    parser.add_argument("--gemm", choices=list(GEMM_ROUTES), default="mkl", help="the Winograd GEMM route")
    parser.add_argument("--no-accuracy", action="store_true", help="skip the float64 accuracy table")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{torch.backends.cpu.get_cpu_capability()}, {args.layout.upper()}, Winograd GEMMs on {args.gemm}; "
          f"times are medians of {args.repeats} interleaved runs\n")

    columns = [("layer", "layer", ""), ("onednn_ms", "oneDNN ms", ".1f"), ("onednn_gflops", "GF/s", ".0f")]
    for m in args.tiles:
        columns += [(f"F{m}_ms", f"F({m}) ms", ".1f"), (f"F{m}_x", "speed-up", ".2f"),
                    (f"F{m}_gflops", "GF/s", ".0f"), (f"F{m}_err", "max|d|", ".1e")]
    rows = []
    for shape in dict(all=DECODER + SWEEP, decoder=DECODER, sweep=SWEEP, quick=QUICK, ltx2=LTX2)[args.layers]:
        rows.append(bench_layer(shape, args.tiles, args.repeats, args.warmup, args.layout, args.gemm))
        print(f"  {rows[-1]['layer']} done", file=sys.stderr, flush=True)
    print_table(rows, columns)

    if not args.no_accuracy:
        print("\nError against a float64 reference (max abs, max abs / max|ref|, rms / rms(ref)):\n")
        columns = [("layer", "layer", ""), ("max_ref", "max|ref|", ".2f")]
        for name in ["onednn"] + [f"F{m}" for m in args.tiles]:
            columns += [(f"{name}_max", f"{name} max", ".1e"), (f"{name}_rel", "rel", ".1e"),
                        (f"{name}_rms", "rms", ".1e")]
        print_table([accuracy_row(shape, args.tiles) for shape in ACCURACY], columns)


if __name__ == "__main__":
    main()
