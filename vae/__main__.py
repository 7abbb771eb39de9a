"""Command line: round-trip a video through a VAE checkpoint, or encode/decode between video files and
latent files without holding the clip in memory.

    python -m vae roundtrip [input.mp4] [--checkpoint ema_vae_fp16.safetensors] [--out out/roundtrip.mp4]
    python -m vae encode --in clip.mp4 [--out out/latent.safetensors] [--every 2 --width 960 ...]
    python -m vae decode out/latent.safetensors [--out out/decoded.mp4] [--codec h264 --crf 19 ...]
    python -m vae doctor [--device cuda:0] [--dtype bf16 ...]   # what a bug report needs (vae/doctor.py)

Without an input a moving test pattern is generated; without a checkpoint the tiny SeedVR2 fixture
model from ../shared/reference is used (random weights: the output only shows that the pipeline runs).
Latent files are ComfyUI's (Save Latent / Load Latent): `latent_tensor` holds the family's ComfyUI
LATENT (SeedVR2: raw x 0.9152; Wan: raw; `VideoVAE.to_comfy_latent`), and the safetensors metadata the
frame count, pixel size and frame rate to decode back to. `decode` reads core's files the same way.
"""
import argparse
import math
import os
import sys
import time
from fractions import Fraction
from pathlib import Path

import torch

from . import engine, load
from .devices import DTYPES
from .geometry import latent_frames
from .planning import Settings
from .video_codecs import BIT_DEPTHS, CODECS, PIXEL_FORMATS
from .video_reader import RESIZE_FILTERS, VideoReader

REPO = Path(__file__).resolve().parent.parent
CODEC_OF_SUFFIX = {".mp4": "h264", ".mkv": "ffv1", ".mov": "prores"}
LATENT_SPACE_KEY = "streamvae_latent_space"  # latent file metadata: "comfyui" (ComfyUI's LATENT) or "raw"


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


def load_model(args: argparse.Namespace):
    if args.checkpoint:
        checkpoint, config = Path(args.checkpoint), {}
    else:
        checkpoint, config = tiny_fixture()
        print(f"no --checkpoint given: using the tiny SeedVR2 fixture model {checkpoint} "
              "(random weights, so the output shows only that the pipeline runs)")
    model = load(checkpoint, device=args.device, dtype=DTYPES[args.dtype], config=config)
    print(f"loaded {checkpoint.name}: family {model.family}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
          f"{args.dtype} on {args.device}")
    return model


def settings(args: argparse.Namespace) -> Settings:
    budget = args.memory_budget if args.memory_budget in (None, "auto") else int(float(args.memory_budget) * 2**30)
    return Settings(temporal_chunk=args.temporal_chunk, tile_size=args.tile_size, tile_overlap=args.tile_overlap,
                    tiling=args.tiling, memory_budget=budget, cache_offload=args.cache_offload)


def video_kwargs(args: argparse.Namespace, out: Path) -> dict:
    codec = args.codec or CODEC_OF_SUFFIX.get(out.suffix.lower())
    if codec is None:
        sys.exit(f"cannot tell the codec from {out.name}: name it .mp4, .mkv or .mov, or pass --codec")
    return dict(codec=codec, crf=args.crf, pixel_format=args.pixel_format, bit_depth=args.bit_depth)


def roundtrip(args: argparse.Namespace) -> None:
    from .video_file import decode_to_file

    model = load_model(args)
    if args.input:
        with VideoReader(args.input, frame_count=args.frames or 0, channels=model.in_channels) as reader:
            video, fps = reader.read(0, reader.frames), reader.fps
    else:
        height, width = (int(v) for v in args.size.lower().split("x"))
        pattern, fps = test_pattern(args.frames or 17, height, width), 24
        if model.in_channels == 4:  # RGBA VAEs: an opaque pattern
            pattern = torch.cat([pattern, torch.ones_like(pattern[..., :1])], dim=-1)
        video = pattern.permute(3, 0, 1, 2).unsqueeze(0) * 2 - 1  # B,C,T,H,W in [-1, 1]
        print(f"no input given: generated a {pattern.shape[0]}-frame {height}x{width} test pattern")
    t, h, w = video.shape[2:]
    z = engine.encode(model, video, settings(args), progress=Progress("encode"))
    print(f"latent {tuple(z.shape)} ({latent_frames(t)} latent frames for {t} frames)")
    up = model.decode_upscale
    expected = ((video[0].permute(1, 2, 3, 0) + 1) * 127.5).double()  # T,H,W,C in 0..255
    # an upscale decoder's frames are compared with the input repeated to their size
    expected = expected.repeat_interleave(up, dim=1).repeat_interleave(up, dim=2)
    squared = [0.0]

    def measure(first, pixels):  # PSNR of the written 8-bit frames against the input, chunk by chunk
        want = expected[first:first + len(pixels), ..., :pixels.shape[-1]]
        squared[0] += float(((torch.from_numpy(pixels).double() - want) ** 2).sum()) * expected.shape[-1] / pixels.shape[-1]

    out = Path(args.out)
    video_args = video_kwargs(args, out)
    if (h % 2 or w % 2) and args.pixel_format == "auto" and CODECS[video_args["codec"]].pixel_format == "yuv420":
        video_args["pixel_format"] = "yuv444"  # 4:2:0 needs even sizes; keep every pixel instead of cropping
    decode_to_file(model, z, out, settings(args), fps=fps, num_frames=t, height=h * up, width=w * up, observe=measure,
                   progress=Progress("decode"), **video_args)
    mse = squared[0] / expected.numel() / 255**2
    psnr = 10 * math.log10(1 / mse) if mse > 0 else float("inf")
    print(f"wrote {out}: {t} frames {h * up}x{w * up}; round-trip PSNR {psnr:.2f} dB vs the input")


def encode(args: argparse.Namespace) -> None:
    from safetensors.torch import save_file

    from .video_file import encode_from_file

    model = load_model(args)
    z, clip = encode_from_file(model, args.input, settings(args), start_frame=args.start, frame_count=args.count,
                               every_nth=args.every, width=args.width, height=args.height, resize_filter=args.filter,
                               progress=Progress("encode"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"streamvae_frames": str(clip.frames), "streamvae_size": f"{clip.height},{clip.width}",
                "fps": str(clip.fps), "family": model.family, LATENT_SPACE_KEY: "comfyui"}
    samples = model.to_comfy_latent(z).float().contiguous()
    save_file({"latent_tensor": samples, "latent_format_version_0": torch.tensor([])}, str(out), metadata)
    print(f"wrote {out}: latent {tuple(z.shape)} for {clip.frames} frames {clip.height}x{clip.width} at {float(clip.fps):g} fps")


def decode(args: argparse.Namespace) -> None:
    from safetensors import safe_open

    from .video_file import decode_to_file

    with safe_open(args.latent, framework="pt") as file:
        metadata = file.metadata() or {}
        z = file.get_tensor("latent_tensor")
    model = load_model(args)
    # Files from before this key held the raw latent; every other one holds ComfyUI's LATENT.
    if metadata.get(LATENT_SPACE_KEY, "comfyui" if "streamvae_frames" not in metadata else "raw") == "comfyui":
        z = model.from_comfy_latent(z.float())
    frames = int(metadata["streamvae_frames"]) if "streamvae_frames" in metadata else None
    height, width = (int(v) for v in metadata["streamvae_size"].split(",")) if "streamvae_size" in metadata else (None, None)
    fps = args.fps or Fraction(metadata.get("fps", "24"))
    out = Path(args.out)
    path = decode_to_file(model, z, out, settings(args), fps=fps, num_frames=frames, height=height, width=width,
                          progress=Progress("decode"), **video_kwargs(args, out))
    print(f"wrote {path}")


def doctor(args: argparse.Namespace) -> None:
    from .doctor import main as doctor_main

    doctor_main(args.device, args.dtype)


def add_common(parser: argparse.ArgumentParser) -> None:
    """Model and engine options every command takes."""
    parser.add_argument("--checkpoint", help="VAE checkpoint (.safetensors/.pth); default: the tiny SeedVR2 fixture")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32", help="compute dtype (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    parser.add_argument("--temporal-chunk", type=int, default=None, help="latent frames per step (default: 1, or the budget's choice)")
    parser.add_argument("--tile-size", type=int, default=None, help="spatial tile in pixels (default: untiled)")
    parser.add_argument("--tile-overlap", type=int, default=0, help="tile overlap in pixels (fast tiling only)")
    parser.add_argument("--tiling", choices=("exact", "fast"), default="exact",
                        help="exact: equals untiled; fast: blended tiles (not with video files)")
    parser.add_argument("--memory-budget", default=None, help="GiB, or 'auto': picks the largest chunk and tile that fit")
    parser.add_argument("--cache-offload", choices=("auto", "none", "host", "disk"), default="auto",
                        help="where the causal caches wait between chunks; auto: off the device only when memory needs it")


def add_video_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--codec", choices=CODECS, default=None,
                        help="h264/h265 (.mp4), ffv1 (.mkv, lossless), prores (.mov); default: from --out's extension")
    parser.add_argument("--crf", type=int, default=19, help="H.264/H.265 quality, 0 (best) to 51 (default: %(default)s)")
    parser.add_argument("--pixel-format", choices=PIXEL_FORMATS, default="auto",
                        help="yuv420/422/444 (BT.709, limited range) or rgb (default: the codec's usual)")
    parser.add_argument("--bit-depth", choices=BIT_DEPTHS, default="auto", help="bits per channel (default: the codec's usual)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vae", description="StreamVAE video VAE tools")
    sub = parser.add_subparsers(dest="command", required=True)
    rt = sub.add_parser("roundtrip", help="encode then decode a video file or a generated clip")
    rt.add_argument("input", nargs="?", help="video file (default: a generated test pattern)")
    rt.add_argument("--out", default="out/roundtrip.mp4", help="output video path (default: %(default)s)")
    rt.add_argument("--frames", type=int, help="frames to read from the input / to generate (default: all / 17)")
    rt.add_argument("--size", default="256x256", help="HxW of the generated pattern in pixels (default: %(default)s)")
    add_common(rt)
    add_video_output(rt)
    enc = sub.add_parser("encode", help="encode a video file to a latent file, reading frames as they are needed")
    enc.add_argument("--in", dest="input", required=True, help="video file to encode")
    enc.add_argument("--out", default="out/latent.safetensors", help="latent file to write (default: %(default)s)")
    enc.add_argument("--start", type=int, default=0, help="first frame to encode (0-based; default: %(default)s)")
    enc.add_argument("--count", type=int, default=0, help="frames to encode; 0 = to the end (default: %(default)s)")
    enc.add_argument("--every", type=int, default=1, help="take every n-th frame (default: %(default)s)")
    enc.add_argument("--width", type=int, default=0, help="resize to this width in pixels; 0 = keep (default: %(default)s)")
    enc.add_argument("--height", type=int, default=0, help="resize to this height in pixels; 0 = keep (default: %(default)s)")
    enc.add_argument("--filter", choices=RESIZE_FILTERS, default="bicubic", help="resize filter (default: %(default)s)")
    add_common(enc)
    dec = sub.add_parser("decode", help="decode a latent file to a video file, writing frames as they are decoded")
    dec.add_argument("latent", help="latent .safetensors (from `encode`, or ComfyUI's Save Latent)")
    dec.add_argument("--out", default="out/decoded.mp4", help="video file to write (default: %(default)s)")
    dec.add_argument("--fps", type=float, default=None, help="frames per second (default: the latent file's, else 24)")
    add_common(dec)
    add_video_output(dec)
    doc = sub.add_parser("doctor", help="device, versions, the kernels and layout a run takes here and why, memory calibration")
    doc.add_argument("--device", default=None, help="torch device (default: the GPU, else the CPU)")
    doc.add_argument("--dtype", choices=DTYPES, action="append", default=None,
                     help="a precision to report (repeatable; default: what auto decodes and encodes in there)")
    args = parser.parse_args(argv)
    try:
        {"roundtrip": roundtrip, "encode": encode, "decode": decode, "doctor": doctor}[args.command](args)
    except (ValueError, RuntimeError, OSError) as error:  # bad input or setup: one clear line, no traceback
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
