"""Command line: round-trip a video through a VAE checkpoint, or encode/decode between video files and
latent files without holding the clip in memory.

    python -m vae roundtrip [input.mp4] [--checkpoint ema_vae_fp16.safetensors] [--out out/roundtrip.mp4]
    python -m vae encode --in clip.mp4 [--out out/latent.safetensors] [--every 2 --width 960 ...]
    python -m vae decode out/latent.safetensors [--out out/decoded.mp4] [--codec h264 --crf 19 ...]
    python -m vae doctor [--device cuda:0] [--dtype bf16 ...]   # what a bug report needs (vae/doctor.py)

Without an input a moving test pattern is generated; without a checkpoint a tiny fixture model from
../shared/reference is used (random weights: the output only shows that the pipeline runs): SeedVR2's,
or for `decode` the one of the family the latent file names. Latent files are ComfyUI's (Save Latent /
Load Latent): `latent_tensor` holds the family's ComfyUI LATENT (SeedVR2: raw x 0.9152; Wan: raw;
`VideoVAE.to_comfy_latent`), and the safetensors metadata the family, frame count, pixel size and frame
rate to decode back to; `decode` checks the family, channels and spatial factor against the model, and
reads core's files (no family) the same way. No file is replaced without --overwrite. Every failure is
one `error:` line and exit status 2.
"""
import argparse
import logging
import math
import os
import sys
import time
from fractions import Fraction
from pathlib import Path

import torch

from . import families, load
from .kernels.backend import DTYPES
from .run import engine
from .run.planning import BudgetTooSmall, Settings
from .run.run_warnings import collected
from .video_codecs import BIT_DEPTHS, CODECS, PIXEL_FORMATS
from .video_reader import RESIZE_FILTERS, VideoReader

REPO = Path(__file__).resolve().parent.parent
CODEC_OF_SUFFIX = {".mp4": "h264", ".mkv": "ffv1", ".mov": "prores"}
LATENT_SPACE_KEY = "streamvae_latent_space"  # latent file metadata: "comfyui" (ComfyUI's LATENT) or "raw"
log = logging.getLogger("streamvae")


# The family whose tiny test model runs without --checkpoint: the first registered (SeedVR2).
DEFAULT_FAMILY = families.SPECS[0].name


class CommandError(ValueError):
    """Bad input or setup, said in the command line's words."""


def tiny_fixture(family: str = DEFAULT_FAMILY) -> tuple[Path, dict]:
    """The tiny test model of `family` from the reference data folder, and the config values its shapes
    cannot tell (`TinyModel.fixture_config` of the family's spec)."""
    shared = Path(os.environ.get("STREAMVAE_SHARED", REPO.parent / "shared"))
    path = shared / "reference" / family / "tiny_vae.safetensors"
    config = families.spec(family).tiny.fixture_config if family in families.NAMES else None
    if config is None or not path.is_file():
        raise CommandError(f"no --checkpoint given and there is no tiny {family} test model at {path}; pass "
                           f"--checkpoint with the {family} VAE file")
    return path, dict(config)


def check_device(name: str) -> None:
    """CommandError when `--device` names no device this torch can use (before anything is loaded)."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise CommandError(f"--device {name!r} is not a device; use cpu, cuda, cuda:1 or mps") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        have = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else \
            f"no CUDA (torch {torch.__version__}{', a CPU-only build' if torch.version.cuda is None else ''})"
        raise CommandError(f"--device {name}: this torch has {have}; use --device cpu, or a CUDA build of torch")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise CommandError(f"--device {name}: MPS is not available here; use --device cpu")


def check_new(path: Path, args: argparse.Namespace) -> None:
    """CommandError when `path` is a folder, or exists and --overwrite was not given (checked before any work)."""
    if path.is_dir():
        raise CommandError(f"--out {path} is a folder: name a file in it, e.g. --out {path / ('out' + path.suffix)}")
    if path.exists() and not args.overwrite:
        raise CommandError(f"{path} exists; pass --overwrite to replace it, or choose another --out")


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


def load_model(args: argparse.Namespace, family: str = DEFAULT_FAMILY):
    """The --checkpoint model, or the tiny test model of `family`."""
    check_device(args.device)
    if args.checkpoint:
        checkpoint, config = Path(args.checkpoint), {}
    else:
        checkpoint, config = tiny_fixture(family)
        print(f"no --checkpoint given: using the tiny {family} fixture model {checkpoint} "
              "(random weights, so the output shows only that the pipeline runs)")
    model = load(checkpoint, device=args.device, dtype=DTYPES[args.dtype], config=config,
                 allow_nonfinite=args.allow_nonfinite)
    print(f"loaded {checkpoint.name}: family {model.family}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
          f"{args.dtype} on {args.device}")
    return model


def settings(args: argparse.Namespace) -> Settings:
    """The engine settings of the options; --memory-budget in GiB ("auto": the free memory; left out: no limit)."""
    budget = args.memory_budget
    if budget not in (None, "auto"):
        try:
            gib = float(budget)
        except ValueError:
            raise CommandError(f"--memory-budget must be a number of GiB or auto; got {budget!r}") from None
        if not 0 < gib < math.inf:
            raise CommandError(f"--memory-budget must be more than 0 GiB, or auto (leave it out for no limit); got {budget}")
        budget = max(1, math.ceil(gib * 2**30))  # a budget of a few bytes stays a budget (and is refused with its floor)
    return Settings(temporal_chunk=args.temporal_chunk, tile_size=args.tile_size, tile_overlap=args.tile_overlap,
                    tiling=args.tiling, memory_budget=budget, cache_offload=args.cache_offload)


def video_kwargs(args: argparse.Namespace, out: Path) -> dict:
    codec = args.codec or CODEC_OF_SUFFIX.get(out.suffix.lower())
    if codec is None:
        raise CommandError(f"cannot tell the codec from {out.name}: name it .mp4, .mkv or .mov, or pass --codec")
    return dict(codec=codec, crf=args.crf, pixel_format=args.pixel_format, bit_depth=args.bit_depth)


def roundtrip(args: argparse.Namespace) -> None:
    from .video_file import decode_to_file

    out = Path(args.out)
    video_args, how = video_kwargs(args, out), settings(args)
    check_new(out, args)
    model = load_model(args)
    if args.input:
        with VideoReader(args.input, frame_count=args.frames or 0, channels=model.in_channels) as reader:
            video, fps = reader.read(0, reader.frames), reader.fps
        for note in reader.notes:
            log.warning(note)
    else:
        try:
            height, width = (int(v) for v in args.size.lower().split("x"))
        except ValueError:
            raise CommandError(f"--size must be HxW in pixels, e.g. 256x384; got {args.size!r}") from None
        pattern, fps = test_pattern(args.frames or 17, height, width), 24
        if model.in_channels == 4:  # RGBA VAEs: an opaque pattern
            pattern = torch.cat([pattern, torch.ones_like(pattern[..., :1])], dim=-1)
        video = pattern.permute(3, 0, 1, 2).unsqueeze(0) * 2 - 1  # B,C,T,H,W in [-1, 1]
        print(f"no input given: generated a {pattern.shape[0]}-frame {height}x{width} test pattern")
    t, h, w = video.shape[2:]
    z = engine.encode(model, video, how, progress=Progress("encode"))
    print(f"latent {tuple(z.shape)} ({model.frames_made('encode', t)} latent frames for {t} frames)")
    up = model.decode_upscale
    expected = ((video[0].permute(1, 2, 3, 0) + 1) * 127.5).double()  # T,H,W,C in 0..255
    # an upscale decoder's frames are compared with the input repeated to their size
    expected = expected.repeat_interleave(up, dim=1).repeat_interleave(up, dim=2)
    squared = [0.0]

    def measure(first, pixels):  # PSNR of the written 8-bit frames against the input, chunk by chunk
        want = expected[first:first + len(pixels), ..., :pixels.shape[-1]]
        squared[0] += float(((torch.from_numpy(pixels).double() - want) ** 2).sum()) * expected.shape[-1] / pixels.shape[-1]

    if (h % 2 or w % 2) and args.pixel_format == "auto" and CODECS[video_args["codec"]].pixel_format == "yuv420":
        video_args["pixel_format"] = "yuv444"  # 4:2:0 needs even sizes; keep every pixel instead of cropping
    decode_to_file(model, z, out, how, fps=fps, num_frames=t, height=h * up, width=w * up, observe=measure,
                   progress=Progress("decode"), overwrite=args.overwrite, **video_args)
    mse = squared[0] / expected.numel() / 255**2
    psnr = 10 * math.log10(1 / mse) if mse > 0 else float("inf")
    print(f"wrote {out}: {t} frames {h * up}x{w * up}; round-trip PSNR {psnr:.2f} dB vs the input")


def encode(args: argparse.Namespace) -> None:
    from safetensors.torch import save_file

    from .video_file import encode_from_file

    out, how = Path(args.out), settings(args)
    check_new(out, args)
    model = load_model(args)
    z, clip = encode_from_file(model, args.input, how, start_frame=args.start, frame_count=args.count,
                               every_nth=args.every, width=args.width, height=args.height, resize_filter=args.filter,
                               progress=Progress("encode"))
    for note in clip.notes:
        log.warning(note)
    out.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"streamvae_frames": str(clip.frames), "streamvae_size": f"{clip.height},{clip.width}",
                "fps": str(clip.fps), "family": model.family, LATENT_SPACE_KEY: "comfyui"}
    samples = model.to_comfy_latent(z).float().contiguous()
    check_new(out, args)  # made by someone else while this encoded: left alone
    save_file({"latent_tensor": samples, "latent_format_version_0": torch.tensor([])}, str(out), metadata)
    print(f"wrote {out}: latent {tuple(z.shape)} for {clip.frames} frames {clip.height}x{clip.width} at {float(clip.fps):g} fps")


def read_latent_file(path: str) -> tuple[torch.Tensor, dict]:
    """`latent_tensor` and the metadata of a latent file (ours or Save Latent's)."""
    from safetensors import SafetensorError, safe_open

    if not os.path.isfile(path):
        raise CommandError(f"latent file not found: {path}")
    try:
        with safe_open(path, framework="pt") as file:
            metadata = file.metadata() or {}
            if "latent_tensor" not in file.keys():
                raise CommandError(f"{path} holds no latent_tensor: it is a safetensors file, but not a latent (Save "
                                   "Latent, python -m vae encode)")
            return file.get_tensor("latent_tensor"), metadata
    except SafetensorError as error:
        raise CommandError(f"{path} is not a latent file ({error}): give a .latent / .safetensors file from Save Latent "
                           "or python -m vae encode, not a video") from None


def checked_latent(model, z: torch.Tensor, metadata: dict, path: str) -> None:
    """CommandError when the latent file was not made by a VAE like `model`: the family it names, its
    channel count and the spatial factor its pixel size implies, each naming both sides."""
    family = metadata.get("family")
    if family and family != model.family:
        raise CommandError(f"{path} was made by a {family} VAE, but {model.family} is loaded: pass --checkpoint with a "
                           f"{family} VAE file")
    if not z.dtype.is_floating_point:
        raise CommandError(f"{path} holds {str(z.dtype).removeprefix('torch.')} values, but a latent is floating-point "
                           "numbers: it is not a latent (Save Latent, python -m vae encode), or it was damaged")
    if z.dim() not in (4, 5) or z.shape[1] != model.latent_channels:
        raise CommandError(f"{path} holds a latent of shape {tuple(z.shape)}, but this {model.family} VAE decodes "
                           f"B,{model.latent_channels},T,h,w latents: pass --checkpoint with the VAE that made it")
    if "streamvae_size" in metadata:
        height, width = (int(v) for v in metadata["streamvae_size"].split(","))
        sf, (h, w) = model.spatial_factor, z.shape[-2:]
        if (-(-height // sf), -(-width // sf)) != (h, w):
            raise CommandError(f"{path} is {width}x{height} px as a {w}x{h} latent, but this {model.family} VAE's latent "
                               f"cells are {sf} px (a {-(-width // sf)}x{-(-height // sf)} latent): it was made by a VAE "
                               "with another spatial factor; pass --checkpoint with that VAE")


def decode(args: argparse.Namespace) -> None:
    from .video_file import decode_to_file

    z, metadata = read_latent_file(args.latent)
    if args.fps is not None and not 0 < args.fps <= 1000:  # NaN too
        raise CommandError(f"--fps must be a number of frames per second above 0, at most 1000; got {args.fps}")
    out = Path(args.out)
    video_args, how = video_kwargs(args, out), settings(args)
    check_new(out, args)
    if not args.checkpoint and "family" not in metadata:
        raise CommandError(f"{args.latent} does not say which VAE made it (Save Latent's files do not): pass --checkpoint "
                           "with that VAE file")
    model = load_model(args, metadata.get("family", DEFAULT_FAMILY))
    checked_latent(model, z, metadata, args.latent)
    # Files from before this key held the raw latent; every other one holds ComfyUI's LATENT.
    if metadata.get(LATENT_SPACE_KEY, "comfyui" if "streamvae_frames" not in metadata else "raw") == "comfyui":
        z = model.from_comfy_latent(z.float())
    frames = int(metadata["streamvae_frames"]) if "streamvae_frames" in metadata else None
    height, width = (int(v) for v in metadata["streamvae_size"].split(",")) if "streamvae_size" in metadata else (None, None)
    fps = args.fps or file_fps(metadata, args.latent)
    path = decode_to_file(model, z, out, how, fps=fps, num_frames=frames, height=height, width=width,
                          progress=Progress("decode"), overwrite=args.overwrite, **video_args)
    print(f"wrote {path}")


def file_fps(metadata: dict, path: str) -> Fraction:
    """The frame rate a latent file states (24 where it states none)."""
    try:
        return Fraction(metadata.get("fps", "24"))
    except (ValueError, ZeroDivisionError):
        raise CommandError(f"{path} states fps {metadata['fps']!r}, not a number of frames per second: pass --fps") from None


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
    parser.add_argument("--memory-budget", default=None, help="GiB (more than 0), or 'auto' (the free memory): picks "
                        "the largest chunk and tile that fit; left out: no limit")
    parser.add_argument("--cache-offload", choices=("auto", "none", "host", "disk"), default="auto",
                        help="where the causal caches wait between chunks; auto: off the device only when memory needs it")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists (default: refuse)")
    parser.add_argument("--allow-nonfinite", action="store_true",
                        help="load a checkpoint with NaN/Inf weights anyway (default: refuse it, naming them)")


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
    said = logging.StreamHandler(sys.stderr)  # the library's warnings, each once, as they happen
    said.setFormatter(logging.Formatter("warning: %(message)s"))
    log.addHandler(said)
    try:
        with collected():  # the same warnings raised as Python warnings are not said twice
            {"roundtrip": roundtrip, "encode": encode, "decode": decode, "doctor": doctor}[args.command](args)
    except BudgetTooSmall as error:
        fail(error.plan.below_floor("--memory-budget", "leave it out for no limit", in_bytes=False))
    except KeyboardInterrupt:
        fail("interrupted")
    except Exception as error:  # bad input or setup, or a fault: one line, never a traceback (argparse's are 2 too)
        fail(str(error) or type(error).__name__)
    finally:
        log.removeHandler(said)


def fail(message: str) -> None:
    """One `error:` line (a message's line breaks joined) and exit status 2."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
