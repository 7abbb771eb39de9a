"""Calibrate the memory model (vae/memory_calibration.json) by measuring peak memory.

    python bench/calibrate_memory.py                    # all families, CPU (peak RSS) or CUDA
    python bench/calibrate_memory.py --families seedvr2 --check
    python bench/calibrate_memory.py --modes caches      # only the causal-cache profiles (seconds)

Each measurement runs one encode/decode of the full released config (random weights, float32) in a
fresh process (bench/memory_worker.py) and records the activation peak of the call after a warm-up
(which leaves the CPU Winograd filter cache resident; `vae.memory` computes that from the weights):
peak RSS (CPU; live tensors only, VmHWM reset after the model, buffers and warm-up) or
torch.cuda.max_memory_allocated (CUDA) minus what was resident before.
A least-squares fit of activations / element size = per_pixel * chunk pixel-frames
+ per_tile_pixel * tile pixel-frames + fixed gives the coefficients `vae.memory` uses; the causal
caches' share of that (`vae.memory.cache_profile`: elements per video pixel, all and the largest, from
a short run of the same model) is stored too, for plans that offload them. `--check` compares the
stored model with fresh measurements at other sizes instead.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.common import build_random_model, run_worker  # noqa: E402
from bench.families import FULL_CONFIGS  # noqa: E402
from vae import memory  # noqa: E402

FAMILIES = ("seedvr2", "wan21", "wan22")
# (video size in pixels, tile in pixels or None); 5 frames with temporal_chunk 1, so the measured
# peak is that of a steady 4-frame chunk.
FIT_POINTS = {
    "untiled": [(96, None), (160, None)],
    "exact": [(96, 48), (128, 64), (160, 64)],
}
CHECK_POINTS = {"untiled": [(128, None), (224, None)], "exact": [(160, 48), (256, 128)], "fast": [(160, 64), (256, 128)]}
FRAMES = 5


def measure(family: str, op: str, size: int, tile, mode: str, device: str) -> dict:
    spec = dict(family=family, op=op, frames=FRAMES, height=size, width=size, tile_size=tile,
                tiling="exact" if mode == "untiled" else mode, temporal_chunk=1, device=device)
    return run_worker("bench.memory_worker", spec)


def features(family: str, op: str, size: int, tile) -> tuple[float, float]:
    pixels = 4 * size * size
    return pixels, (4 * min(tile, size) ** 2 if tile else 0.0)


def fit(samples: list[tuple[float, float, float]], tiled: bool) -> dict:
    """Least squares for act = a * pixels (+ b * tile_pixels) + c."""
    rows = [[p, t, 1.0] if tiled else [p, 1.0] for p, t, _ in samples]
    a = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor([[v] for *_, v in samples], dtype=torch.float64)
    sol = torch.linalg.lstsq(a, y).solution.flatten().tolist()
    if tiled:
        return {"per_pixel": max(sol[0], 0.0), "per_tile_pixel": max(sol[1], 0.0), "fixed": max(sol[2], 0.0)}
    return {"per_pixel": max(sol[0], 0.0), "per_tile_pixel": 0.0, "fixed": max(sol[1], 0.0)}


def save(device_type: str, family: str, op: str, mode: str, entry: dict) -> None:
    """Merge one fitted entry into the calibration file as it is now (other runs may write it too)."""
    table = json.loads(memory.CALIBRATION.read_text()) if memory.CALIBRATION.is_file() else {}
    table.setdefault(device_type, {}).setdefault(family, {}).setdefault(op, {})[mode] = entry
    memory.CALIBRATION.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {family} {op} {mode} to {memory.CALIBRATION}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--ops", nargs="+", default=["decode", "encode"])
    parser.add_argument("--modes", nargs="+", default=None, choices=[*CHECK_POINTS, "caches"],
                        help="default: untiled, exact (fitted) and caches; with --check untiled, exact and fast")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--check", action="store_true", help="compare predictions with measurements at new sizes")
    args = parser.parse_args()
    device_type = torch.device(args.device).type
    args.modes = args.modes or list(CHECK_POINTS if args.check else [*FIT_POINTS, "caches"])
    for family in args.families:
        if "caches" in args.modes and not args.check:
            model = build_random_model(*FULL_CONFIGS[family](), torch.float32, device=args.device)
            for op in args.ops:
                save(device_type, family, op, "caches", memory.cache_profile(model, op))
            del model
        for op in args.ops:
            for mode in (m for m in args.modes if m != "caches"):
                points = (CHECK_POINTS if args.check else FIT_POINTS)[mode]
                samples = []
                for size, tile in points:
                    result = measure(family, op, size, tile, mode, args.device)
                    pixels, tile_pixels = features(family, op, size, tile)
                    samples.append((pixels, tile_pixels, result["activation_bytes"] / 4))
                    line = f"{family} {op} {mode} {size}px tile {tile}: activations {result['activation_bytes'] / 2**20:.1f} MiB"
                    if args.check:
                        line += f", predicted total {result['predicted_bytes'] / 2**20:.1f} MiB vs measured {result['peak_bytes'] / 2**20:.1f} MiB" \
                                f" ({100 * (result['predicted_bytes'] / result['peak_bytes'] - 1):+.1f}%)"
                    print(line, flush=True)
                if not args.check:
                    save(device_type, family, op, mode, fit(samples, mode != "untiled"))


if __name__ == "__main__":
    main()
