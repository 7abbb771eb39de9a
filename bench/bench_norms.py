"""Per-frame GroupNorm (+SiLU) on the CPU: the pack's blockwise kernels against torch's, side by side.

    python -m bench.bench_norms --json norms.json   # channel planes (NCDHW)
    python -m bench.bench_norms --layout ndhwc --rounds 3 --json bench/results/norms_cpu_ndhwc.json   # channels-last

Shapes are the SeedVR2 decoder's norm inputs for 5 output frames of 256x256 (B,C,T,H,W; 32 groups).
For each shape and dtype, interleaved rounds (every variant once per round, median of the rounds):
- statistics: `norm_act.torch_group_moments` (`torch.var_mean` over (C/G, H*W) of each frame, a float32
  copy per frame for half precision: what the fused norm used on the CPU before) against `norm_act.group_norm_moments` (blocks of channel
  planes, norm_act.CPU_BLOCK_BYTES);
- norm + SiLU: the straightforward path (frames folded into the batch, F.group_norm, F.silu: upstream's
  behaviour, `fused_norm_act=False`) against `norm_act.group_norm_act`;
- RMS + SiLU (Wan's norm, on the same inputs): upstream's F.normalize * sqrt(C) * gamma, F.silu, against
  `norm_act.rms_norm_act`.
`--layout ndhwc` makes the inputs channels-last (the pack's channels-last paths; the straightforward ones
are torch's ops on the same tensors).
Errors are against the same computed in float64 (statistics: the variance's relative error).
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import machine_summary, print_table
from vae.kernels import norm_act
from vae.kernels.activation_layout import FORMATS

SHAPES = [(128, 256), (256, 128), (512, 64), (512, 32)]  # (channels, side)
FRAMES, GROUPS = 5, 32


def straightforward_norm_act(x, weight, bias):
    b, c, t, h, w = x.shape
    frames = x.transpose(1, 2).reshape(b * t, c, h, w)
    y = F.silu(F.group_norm(frames, GROUPS, weight.to(x.dtype), bias.to(x.dtype), 1e-6))
    return y.reshape(b, t, c, h, w).transpose(1, 2).contiguous()


def reference(x, weight, bias):
    """(mean, var) and SiLU(GroupNorm(x)) in float64."""
    b, c, t, h, w = x.shape
    grouped = x.double().reshape(b, GROUPS, c // GROUPS, t, h * w)
    mean, var = grouped.mean(dim=(2, 4)), grouped.var(dim=(2, 4), unbiased=False)
    return (mean, var), straightforward_norm_act(x.double(), weight.double(), bias.double())


def straightforward_rms_act(x, gamma):
    return F.silu(F.normalize(x, dim=1) * x.shape[1] ** 0.5 * gamma.to(x.dtype))


def bench_shape(channels: int, side: int, dtype: torch.dtype, rounds: int, memory_format) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(1, channels, FRAMES, side, side, generator=g) * 2 + 0.5).to(dtype)
    x = x.contiguous(memory_format=memory_format)
    weight, bias = torch.rand(channels, generator=g) + 0.5, torch.randn(channels, generator=g)
    gamma = torch.rand(channels, 1, 1, 1, generator=g) + 0.5
    variants = {
        ("statistics", "torch var_mean"): lambda: norm_act.torch_group_moments(x, GROUPS),
        ("statistics", "blockwise"): lambda: norm_act.group_norm_moments(x, GROUPS),
        ("norm + SiLU", "straightforward"): lambda: straightforward_norm_act(x, weight, bias),
        ("norm + SiLU", "fused, blockwise statistics"): lambda: norm_act.group_norm_act(x, GROUPS, weight, bias, 1e-6),
        ("RMS + SiLU", "straightforward"): lambda: straightforward_rms_act(x, gamma),
        ("RMS + SiLU", "fused"): lambda: norm_act.rms_norm_act(x, gamma),
    }
    times = {key: [] for key in variants}
    outputs = {key: run() for key, run in variants.items()}  # warm-up
    for _ in range(rounds):
        for key, run in variants.items():
            start = time.perf_counter()
            outputs[key] = run()
            times[key].append(time.perf_counter() - start)
    (_, ref_var), ref_out = reference(x, weight, bias)
    ref_rms = straightforward_rms_act(x.double(), gamma.double())
    rows = []
    for (step, variant), t in times.items():
        out = outputs[step, variant]
        if step == "statistics":
            error = ((out[1].double() - ref_var).abs() / ref_var).max().item()
        else:
            error = (out.double() - (ref_rms if step == "RMS + SiLU" else ref_out)).abs().max().item()
        baseline = statistics.median(times[step, "torch var_mean" if step == "statistics" else "straightforward"])
        rows.append(dict(shape=f"{channels}ch {side}x{side}", dtype=str(dtype).removeprefix("torch."), step=step,
                         variant=variant, ms=statistics.median(t) * 1e3, times=t, speedup=baseline / statistics.median(t),
                         gbps=x.numel() * x.element_size() / statistics.median(t) / 1e9, error=error))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layout", choices=sorted(FORMATS), default="ncdhw", help="the inputs' memory layout")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    machine = machine_summary()
    rows = [row for dtype in (torch.float32, torch.bfloat16) for channels, side in SHAPES
            for row in bench_shape(channels, side, dtype, args.rounds, FORMATS[args.layout])]
    print(f"machine: {machine}\n1 x C x {FRAMES} frames x side^2 ({args.layout}), {GROUPS} groups, median of "
          f"{args.rounds} interleaved rounds\n")
    print_table(rows, [("shape", "shape", "s"), ("dtype", "dtype", "s"), ("step", "step", "s"), ("variant", "variant", "s"),
                       ("ms", "median ms", ".1f"), ("gbps", "input GB/s", ".1f"), ("speedup", "vs torch", ".2f"),
                       ("error", "max err (statistics: variance, relative)", ".1e")])
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "argv": sys.argv[1:], "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
