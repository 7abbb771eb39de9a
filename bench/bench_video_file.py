"""Decode to a video file vs decode to an IMAGE: peak host RAM against clip length, and what writing costs.

    python -m bench.bench_video_file                 # both tables (tiny Wan2.2; ~25 min on 2 cores)
    python -m bench.bench_video_file --skip-timing    # only the RAM table
    python -m bench.bench_video_file --skip-memory --threads 2 --repeats 7 --name video_file_timing_2_threads
    python -m bench.bench_video_file --frames 17 65 --timing-frames 17 --repeats 1 --name smoke   # a smoke run

RAM: every row is a fresh process (glibc's mmap threshold fixed at 1 MiB so RSS follows the live
tensors, as in bench.memory_worker) that loads the tiny test model, makes a random latent, warms the
decode up on two latent frames (so per-size caches exist in every row), then decodes once: into a video file
(`vae.decode_to_file`, H.264) or into a preallocated IMAGE-sized tensor (fp32 and fp16, what StreamVAE
Decode's `output_dtype` chooses). "peak" is the process's peak RSS (VmHWM); "run peak" is that peak
minus the RSS just before the decode (model, latent and warm-up already resident).

Time: one process per torch thread count, the same latent and settings for every row, the rows run in
turn `--repeats` times (so machine noise hits them alike) after one warm-up round; medians of wall
time and of the process's CPU time (all threads). "decode, frames dropped" hands every chunk to a
sink that discards it: the decode alone. The file rows add the conversion to 8-bit frames and the
writer thread that encodes beside the decode; the IMAGE row copies into the tensor. With torch on
every core the encoder can only take CPU time from the decode; with one core left to it (as on a
machine whose GPU decodes) it runs beside the decode. The random-weight model decodes noise, the
costliest content for H.264/H.265 (real video encodes several times faster).
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import vae
from bench import models
from bench.common import machine_summary, peak_rss_bytes, print_table, reset_peak_rss, rss_bytes, run_worker
from bench.memory_worker import fixed_mmap_threshold
from vae import families

RESULTS = Path(__file__).resolve().parent / "results"
GIB = 2**30


def tiny_model_and_latent(spec: dict):
    """The family's tiny test model and a random latent that decodes to spec's frames x height x width."""
    model = models.build(spec["family"], torch.float32, tiny=True)
    return model, models.make_input(spec["family"], dict(spec, op="decode"))


def decode_runs(model, z, folder: Path) -> dict:
    """The ways to decode `z` that the tables compare: name -> zero-argument function."""
    t, h, w = vae.run.geometry.pixel_frames(z.shape[2]), z.shape[3] * model.spatial_factor, z.shape[4] * model.spatial_factor

    def to_image(dtype):
        return lambda: models.run(model, "decode", z, dict(temporal_chunk=1), out=torch.empty(1, 3, t, h, w, dtype=dtype))

    return {
        "decode, frames dropped": lambda: models.run(model, "decode", z, dict(temporal_chunk=1),
                                                     sink=lambda first, frames: None),
        "file, h264 (.mp4)": lambda: vae.decode_to_file(model, z, folder / "bench.mp4", vae.Settings(temporal_chunk=1),
                                                        overwrite=True),
        "file, ffv1 (.mkv, lossless)": lambda: vae.decode_to_file(model, z, folder / "bench.mkv",
                                                                  vae.Settings(temporal_chunk=1), codec="ffv1",
                                                                  overwrite=True),
        "IMAGE fp32": to_image(torch.float32),
        "IMAGE fp16": to_image(torch.float16),
    }


MEMORY_MODES = ("file, h264 (.mp4)", "IMAGE fp32", "IMAGE fp16")
TIMING_MODES = ("decode, frames dropped", "file, h264 (.mp4)", "file, ffv1 (.mkv, lossless)", "IMAGE fp32")


def memory_worker(spec: dict) -> dict:
    fixed_mmap_threshold(1 << 20)  # 1 MiB: tensors still come and go with mmap, small objects do not
    model, z = tiny_model_and_latent(spec)
    with tempfile.TemporaryDirectory() as folder:
        runs = decode_runs(model, z, Path(folder))
        decode_runs(model, z[:, :, :2], Path(folder))[spec["mode"]]()  # warm-up
        reset_peak_rss()
        before = rss_bytes()
        runs[spec["mode"]]()
        return {"peak": peak_rss_bytes(), "run_peak": peak_rss_bytes() - before}


def timing_worker(spec: dict) -> dict:
    torch.set_num_threads(spec["threads"])
    model, z = tiny_model_and_latent(spec)
    wall: dict[str, list[float]] = {name: [] for name in TIMING_MODES}
    cpu: dict[str, list[float]] = {name: [] for name in TIMING_MODES}
    with tempfile.TemporaryDirectory() as folder:
        runs = decode_runs(model, z, Path(folder))
        for round_ in range(spec["repeats"] + 1):  # round 0 warms up
            for name in TIMING_MODES:
                start, start_cpu = time.perf_counter(), time.process_time()
                runs[name]()
                if round_:
                    wall[name].append(time.perf_counter() - start)
                    cpu[name].append(time.process_time() - start_cpu)
    return {"wall": wall, "cpu": cpu}


def memory_table(args) -> list[dict]:
    rows = []
    for mode in MEMORY_MODES:
        first = None
        for frames in args.frames:
            spec = {"family": args.family, "height": args.height, "width": args.width, "frames": frames, "mode": mode}
            result = run_worker("bench.bench_video_file", {"worker": "memory", **spec})
            first = first or result
            image_gib = frames * args.height * args.width * 3 * (2 if "fp16" in mode else 4) / GIB
            rows.append({"mode": mode, "frames": frames, "image_gib": image_gib if "IMAGE" in mode else None,
                         "peak_gib": result["peak"] / GIB, "run_peak_gib": result["run_peak"] / GIB,
                         "peak_ratio": result["peak"] / first["peak"], "run_ratio": result["run_peak"] / first["run_peak"]})
            print(f"  {mode} {frames} frames: peak {rows[-1]['peak_gib']:.3f} GiB, run peak "
                  f"{rows[-1]['run_peak_gib']:.3f} GiB", flush=True)
    return rows


def timing_table(args) -> list[dict]:
    rows = []
    for threads in args.threads:
        spec = {"family": args.family, "height": args.timing_height, "width": args.timing_width,
                "frames": args.timing_frames, "repeats": args.repeats, "threads": threads}
        result = run_worker("bench.bench_video_file", {"worker": "timing", **spec})
        reference = {kind: statistics.median(result[kind]["decode, frames dropped"]) for kind in ("wall", "cpu")}
        for name in TIMING_MODES:
            wall, cpu = statistics.median(result["wall"][name]), statistics.median(result["cpu"][name])
            rows.append({"threads": threads, "mode": name, "median": wall, "ratio": wall / reference["wall"],
                         "cpu": cpu, "cpu_ratio": cpu / reference["cpu"],
                         "runs": " ".join(f"{x:.1f}" for x in result["wall"][name])})
            print(f"  {threads} thread(s) {name}: {wall:.2f} s ({rows[-1]['ratio']:.3f}x), cpu {cpu:.2f} s", flush=True)
    return rows


MEMORY_COLUMNS = [("mode", "decode into", "s"), ("frames", "frames", "d"), ("image_gib", "IMAGE GiB", ".2f"),
                  ("peak_gib", "peak RSS GiB", ".3f"), ("peak_ratio", "peak vs first", ".2f"),
                  ("run_peak_gib", "run peak GiB", ".3f"), ("run_ratio", "run peak vs first", ".2f")]
TIMING_COLUMNS = [("threads", "torch threads", "d"), ("mode", "decode into", "s"), ("median", "median s", ".2f"),
                  ("ratio", "vs decode alone", ".3f"), ("cpu", "CPU s", ".2f"), ("cpu_ratio", "CPU vs decode alone", ".3f"),
                  ("runs", "runs s", "s")]


def main() -> None:
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):  # worker mode: one JSON spec
        spec = json.loads(sys.argv[1])
        worker = memory_worker if spec.pop("worker") == "memory" else timing_worker
        print(json.dumps(worker(spec)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default=families.WAN22.name, choices=models.FAMILIES)
    parser.add_argument("--size", default="512x512", help="HxW in pixels (default: %(default)s)")
    parser.add_argument("--frames", type=int, nargs="+", default=[17, 257, 1001], help="clip lengths for the RAM table")
    parser.add_argument("--timing-frames", type=int, default=257, help="clip length for the time table")
    parser.add_argument("--timing-size", default="256x256", help="HxW for the time table (default: %(default)s)")
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1], help="torch threads, one time table each")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (median), after one warm-up round")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--name", default=None, help="results file stem (default: video_file_<family>_<size>)")
    args = parser.parse_args()
    args.height, args.width = (int(v) for v in args.size.lower().split("x"))
    args.timing_height, args.timing_width = (int(v) for v in args.timing_size.lower().split("x"))
    machine = machine_summary()
    header = (f"tiny {args.family} decode to file vs IMAGE, {args.height}x{args.width}, 1 latent frame per chunk; "
              f"{machine['cpu_model']['cpu']} ({', '.join(machine['cpu_model']['flags'])}), {machine['threads']} threads, "
              f"torch {machine['torch']}, commit {machine['commit']}")
    print(header, flush=True)
    result = {"machine": machine, "settings": vars(args)}
    if not args.skip_memory:
        result["memory"] = memory_table(args)
    if not args.skip_timing:
        result["timing"] = timing_table(args)
    RESULTS.mkdir(exist_ok=True)
    stem = args.name or f"video_file_{args.family}_{args.height}x{args.width}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1))
    with open(RESULTS / f"{stem}.txt", "w") as text:
        for out in (sys.stdout, text):
            print(header, file=out)
            if "memory" in result:
                print("\nPeak host RSS against clip length (each row a fresh process):\n", file=out)
                _print(print_table, result["memory"], MEMORY_COLUMNS, out)
            if "timing" in result:
                print(f"\nTime of {args.timing_frames} frames of {args.timing_height}x{args.timing_width}, the rows in "
                      f"turn, median of {args.repeats} after a warm-up round:\n", file=out)
                _print(print_table, result["timing"], TIMING_COLUMNS, out)


def _print(table, rows, columns, out) -> None:
    """print_table writes to stdout; send it to `out` as well."""
    saved, sys.stdout = sys.stdout, out
    try:
        table(rows, columns)
    finally:
        sys.stdout = saved


if __name__ == "__main__":
    main()
