"""Every Triton kernel x dtype x GPU target compiled on this machine, no GPU needed, with the checks of
tests/test_triton_targets.py on each (which compiles a covering set of them in CI): the results rounded
to nearest in bf16 and fp16, every max keeping NaN (where a dropped NaN would change a result), no 32-bit
index arithmetic that wraps at 1080p with 512 channels (the norms) or at LTX-2.5's stage 5 at 720p (the
neighbourhood attention); and the time each compile took here (a CPU-bound compile, not a GPU measurement).

    python -m bench.triton_targets                      # all of it: a table, exit status 1 if a check failed
    python -m bench.triton_targets --targets sm_90 gfx942 --dtypes bf16
"""
import argparse
import platform
import sys
import time

import torch
import triton

from bench.common import git_commit
from tests import gpu_targets

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SHAPE = (1, 512, 21, 1080, 1920)  # B,C,T,H,W: SeedVR2's 512-channel layers at 1080p, 21 frames
# B,T,H,W,heads,D and windows: LTX-2.5's stage-5 neighbourhood attention at 720p, 121 frames
NA_SHAPE, NA_KERNEL = (1, 121, 180, 320, 4, 64), (11, 11, 11)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", nargs="+", choices=list(gpu_targets.TARGETS), default=list(gpu_targets.TARGETS))
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    args = parser.parse_args()
    print(f"# triton {triton.__version__}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"commit {git_commit() or 'unknown'}; launches of a {SHAPE} input (B,C,T,H,W) and of attention on a {NA_SHAPE} "
          f"grid (B,T,H,W,heads,D) with windows {NA_KERNEL}; compile seconds on this CPU")
    print("| kernel | dtype | " + " | ".join(args.targets) + " |")
    print("|---|---|" + "---|" * len(args.targets))
    failed = []
    for dtype in args.dtypes:
        found = [launch for layout in ("ncdhw", "ndhwc") for launch in gpu_targets.launches(SHAPE, DTYPES[dtype], layout)]
        for launch in found + gpu_targets.na_launches(NA_SHAPE, NA_KERNEL, DTYPES[dtype]):
            cells = []
            for name in args.targets:
                target = gpu_targets.TARGETS[name]
                start = time.perf_counter()
                code = gpu_targets.compiled(launch, target)
                seconds = time.perf_counter() - start
                problems = (gpu_targets.code_problems(launch, code, target)
                            + gpu_targets.int32_problems(gpu_targets.ttir(launch), launch))
                failed += [f"{launch.kernel} {dtype} {name}: {problem}" for problem in problems]
                cells.append(f"{seconds:.1f} s" + (" FAILED" if problems else ""))
            print(f"| {launch.kernel} | {dtype} | " + " | ".join(cells) + " |", flush=True)
    print("\n".join(["", *failed]) if failed else "\nevery check passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
