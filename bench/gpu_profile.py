"""Where the GPU time of one decode goes: per kernel and per kind (convolution, norm, attention,
copies, other), from torch.profiler over one decode after a warm-up.

    python -m bench.gpu_profile --family wan21 --size 81x480x832 [--dtype bf16] [--out profile.txt]

Full released config with random weights, the optimized default path, frames to host memory as the
nodes do. Kinds are read from kernel names (cuDNN/CUTLASS convolution kernels, our Triton norm
kernels, SDPA kernels, copy and fill kernels); the table says how much fell in none of them.
"""
import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch

from bench import models
from bench.common import machine_summary
from vae import families
from vae.kernels.backend import DTYPES

KINDS = [  # (kind, substrings of kernel names), first match wins
    ("norm", ("_gn_partial", "_center_scale_act", "_rms_act", "group_norm", "GroupNorm", "norm_kernel")),
    # cuDNN's conversions around a conv whose activations are not in its kernel's layout (NCDHW runs)
    ("layout conversion", ("nchwToNhwc", "nhwcToNchw", "NchwToNhwc", "NhwcToNchw")),
    ("attention", ("fmha", "flash", "attention", "Attention", "softmax")),
    ("conv", ("conv", "Conv", "xmma", "implicit", "cutlass", "sm90", "sm80", "gemm", "Gemm", "wgrad", "dgrad", "fprop")),
    ("copy", ("copy", "Copy", "Memcpy", "memcpy", "Memset", "fill", "cat_", "CatArray", "pad", "index")),
    ("elementwise", ("elementwise", "vectorized", "silu", "add", "mul")),
]


def kind_of(name: str) -> str:
    return next((kind for kind, keys in KINDS if any(k in name for k in keys)), "other")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default=families.WAN21.name, choices=models.FAMILIES)
    parser.add_argument("--size", default="81x480x832", help="pixel frames x height x width")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--out", help="also write the tables to this file")
    args = parser.parse_args()
    frames, height, width = (int(v) for v in args.size.lower().split("x"))
    model = models.build(args.family, DTYPES[args.dtype], args.device)
    z = models.make_input(args.family, dict(op="decode", frames=frames, height=height, width=width)).to(args.device)

    def decode():
        models.run(model, "decode", z, out_device="cpu")
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    decode()  # warm-up: Triton compilation, cuDNN heuristics, the allocator's pool
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        decode()
    wall = time.perf_counter() - start
    per_kernel, per_kind = defaultdict(float), defaultdict(float)
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(event, "self_cuda_time_total", 0)
        if device_us and event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.key] += device_us / 1e6
            per_kind[kind_of(event.key)] += device_us / 1e6
    total = sum(per_kernel.values())
    lines = [f"machine: {machine_summary()}",
             f"{args.family} decode {args.size} {args.dtype}: wall {wall:.2f} s under the profiler, GPU kernels {total:.2f} s", "",
             "| kind | GPU s | share |", "|---|---|---|"]
    lines += [f"| {k} | {v:.3f} | {100 * v / total:.1f}% |" for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1])] if total else []
    lines += ["", "| kernel | kind | GPU s | share |", "|---|---|---|---|"]
    for name, seconds in sorted(per_kernel.items(), key=lambda kv: -kv[1])[: args.top]:
        lines.append(f"| {name[:110]} | {kind_of(name)} | {seconds:.3f} | {100 * seconds / total:.1f}% |")
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
