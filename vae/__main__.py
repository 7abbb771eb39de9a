"""Command line: round-trip a video through a VAE checkpoint.

    python -m vae roundtrip [input.mp4] [--checkpoint ema_vae_fp16.safetensors] [--out out/roundtrip.mp4]

Without an input a moving test pattern is generated; without a checkpoint the tiny SeedVR2 fixture
model from ../shared/reference is used (random weights: the output only shows that the pipeline runs).
"""
import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

from . import load
from .streaming import latent_frames

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
REPO = Path(__file__).resolve().parent.parent


def tiny_fixture() -> tuple[Path, dict]:
    shared = Path(os.environ.get("STREAMVAE_SHARED", REPO.parent / "shared"))
    path = shared / "reference" / "seedvr2" / "tiny_vae.safetensors"
    if not path.is_file():
        sys.exit(f"no --checkpoint given and the tiny fixture model is not at {path}; pass --checkpoint PATH")
    return path, {"norm_num_groups": 8}


def test_pattern(frames: int, height: int, width: int) -> torch.Tensor:
    """A smooth moving colour pattern, T,H,W,3 in [0, 1]."""
    t = torch.arange(frames).view(-1, 1, 1, 1) / max(frames, 1)
    y = torch.linspace(0, 1, height).view(1, -1, 1, 1)
    x = torch.linspace(0, 1, width).view(1, 1, -1, 1)
    phase = torch.tensor([0.0, 2.1, 4.2]).view(1, 1, 1, 3)
    return 0.5 + 0.5 * torch.sin(2 * math.pi * (2 * x + y + t) + phase) * torch.cos(2 * math.pi * (x - 1.5 * y - t))


def read_video(path: str, max_frames: int | None) -> tuple[torch.Tensor, float]:
    """Frames of a video file as T,H,W,3 float in [0, 1], and its frame rate."""
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate or 24)
        frames = []
        for frame in container.decode(stream):
            frames.append(torch.from_numpy(frame.to_ndarray(format="rgb24")))
            if max_frames and len(frames) >= max_frames:
                break
    if not frames:
        sys.exit(f"{path} has no video frames")
    return torch.stack(frames).float() / 255, fps


def write_video(path: Path, frames: torch.Tensor, fps: float) -> None:
    """T,H,W,3 in [0, 1] -> H.264 mp4 (even sizes are required by yuv420p, so one pixel may be cropped)."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    t, h, w, _ = frames.shape
    data = (frames[:, : h - h % 2, : w - w % 2] * 255).round().clamp(0, 255).to(torch.uint8).numpy()
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=round(fps))
        stream.width, stream.height, stream.pix_fmt = data.shape[2], data.shape[1], "yuv420p"
        for array in data:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        container.mux(stream.encode())


class Progress:
    """A one-line text progress bar on stderr (units: tile x temporal chunk steps)."""

    def __init__(self, label: str):
        self.label, self.start, self.shown = label, time.perf_counter(), 0.0

    def __call__(self, done: int, total: int) -> None:
        filled = int(30 * done / total)
        elapsed = time.perf_counter() - self.start
        if done < total and elapsed - self.shown < 0.5:  # redraw twice a second at most
            return
        self.shown = elapsed
        end = "\n" if done == total else ""
        print(f"\r{self.label:7s} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total} steps {elapsed:6.1f}s", end=end, file=sys.stderr, flush=True)


def roundtrip(args: argparse.Namespace) -> None:
    if args.checkpoint:
        checkpoint, config = Path(args.checkpoint), {}
    else:
        checkpoint, config = tiny_fixture()
        print(f"no --checkpoint given: using the tiny SeedVR2 fixture model {checkpoint} "
              "(random weights, so the output shows only that the pipeline runs)")
    model = load(checkpoint, device=args.device, dtype=DTYPES[args.dtype], config=config)
    print(f"loaded {checkpoint.name}: family {model.family}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
          f"{args.dtype} on {args.device}")
    if args.input:
        frames, fps = read_video(args.input, args.frames)
    else:
        height, width = (int(v) for v in args.size.lower().split("x"))
        frames, fps = test_pattern(args.frames or 17, height, width), 24.0
        print(f"no input given: generated a {frames.shape[0]}-frame {height}x{width} test pattern")
    t, h, w, _ = frames.shape
    video = (frames.permute(3, 0, 1, 2).unsqueeze(0) * 2 - 1)  # B,3,T,H,W in [-1, 1]
    budget = args.memory_budget if args.memory_budget in (None, "auto") else int(float(args.memory_budget) * 2**30)
    tiling = dict(temporal_chunk=args.temporal_chunk, tile_size=args.tile_size, tile_overlap=args.tile_overlap,
                  tiling=args.tiling, memory_budget=budget, cache_offload=args.cache_offload)
    z = model.encode(video, progress=Progress("encode"), **tiling)
    print(f"latent {tuple(z.shape)} ({latent_frames(t)} latent frames for {t} frames)")
    out = model.decode(z, num_frames=t, height=h, width=w, progress=Progress("decode"), **tiling)
    result = ((out[0].permute(1, 2, 3, 0) + 1) / 2).clamp(0, 1)
    mse = torch.mean((result - frames) ** 2).item()
    psnr = 10 * math.log10(1 / mse) if mse > 0 else float("inf")
    write_video(Path(args.out), result, fps)
    print(f"wrote {args.out}: {t} frames {h}x{w}; round-trip PSNR {psnr:.2f} dB vs the input")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vae", description="StreamVAE video VAE tools")
    sub = parser.add_subparsers(dest="command", required=True)
    rt = sub.add_parser("roundtrip", help="encode then decode a video file or a generated clip")
    rt.add_argument("input", nargs="?", help="video file (default: a generated test pattern)")
    rt.add_argument("--checkpoint", help="VAE checkpoint (.safetensors/.pth); default: the tiny SeedVR2 fixture")
    rt.add_argument("--out", default="out/roundtrip.mp4", help="output video path (default: %(default)s)")
    rt.add_argument("--frames", type=int, help="frames to read from the input / to generate (default: all / 17)")
    rt.add_argument("--size", default="256x256", help="HxW of the generated pattern in pixels (default: %(default)s)")
    rt.add_argument("--dtype", choices=DTYPES, default="fp32", help="compute dtype (default: %(default)s)")
    rt.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    rt.add_argument("--temporal-chunk", type=int, default=None, help="latent frames per step (default: 1, or the budget's choice)")
    rt.add_argument("--tile-size", type=int, default=None, help="spatial tile in pixels (default: untiled)")
    rt.add_argument("--tile-overlap", type=int, default=0, help="tile overlap in pixels (fast tiling only)")
    rt.add_argument("--tiling", choices=("exact", "fast"), default="exact", help="exact: equals untiled; fast: blended tiles")
    rt.add_argument("--memory-budget", default=None, help="GiB, or 'auto': picks the largest chunk and tile that fit")
    rt.add_argument("--cache-offload", choices=("auto", "none", "host", "disk"), default="auto",
                    help="where the causal caches wait between chunks; auto: off the device only when memory needs it")
    args = parser.parse_args(argv)
    roundtrip(args)


if __name__ == "__main__":
    main()
