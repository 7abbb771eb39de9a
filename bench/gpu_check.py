"""The GPU check: validate and measure StreamVAE on the GPU it runs on, in one command.

    python -m bench.gpu_check                       # every part on the CUDA device
    python -m bench.gpu_check --parts tests decode  # some parts
    python -m bench.gpu_check --device cpu          # dry run on the CPU with the tiny models (CI)
    python -m bench.gpu_check --parts decode --families wan21 --variants reference bf16 bf16-core_0.33.0

Parts, each planned to end within `--part-budget` seconds (8 minutes by default, so each fits a remote
machine that stops a command at 10):
- tests: the CUDA tests (`pytest -m gpu`).
- decode / encode: for every family, realistic clips (full released configs, random weights), one row
  per --variants name (the variant table, bench/variants.py: `<dtype>-<variant>`, e.g. `reference`,
  `bf16`, `bf16-no-triton_norm`, `bf16-tiles`, `bf16-core_0.33.0` for ComfyUI 0.33.0 core's own VAE with
  the same weights). Each case runs in its own process, so its peak memory
  (`torch.cuda.max_memory_allocated`) is its own and a crash costs one row. Recorded: median time, peak
  against the memory model's prediction, max error and PSNR against the reference row (fp32, every
  switch off, TF32 off), and for core rows the versions of its comfy-kitchen and comfy-aimdo.
- calibrate: the CUDA memory calibration (bench.calibrate_memory on this device: fit, then a
  check at other sizes); the calibration file is copied into `--out`.
- profile: where the time of one decode goes, per kernel and per kind (bench.gpu_profile).

Results go to `--out` (default bench/results/gpu/) as JSON lines, one per case as it finishes, plus
a table printed at the end; the machine (GPU, driver, torch, Triton, cuDNN, commit) heads each file.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench import models
from bench.common import REPO, git_commit, print_table, psnr, rate
from bench.variants import parse_row, prepared, variant
from vae import families
from vae.kernels.backend import DTYPES
from vae.run.geometry import min_tile

# Realistic clips per family (issue 15; `Bench.gpu` of its spec): (frames, height, width), smallest first,
# for the families measured here. The tiny CPU dry run takes its own (`Bench.dry`).
WORKLOADS = {spec.name: [(clip.frames, clip.height, clip.width) for clip in spec.bench.gpu]
             for spec in families.SPECS if spec.bench.gpu}
DRY_WORKLOADS = {spec.name: [(spec.bench.dry.frames, spec.bench.dry.height, spec.bench.dry.width)]
                 for spec in families.SPECS if spec.bench.dry is not None}
DRY_TILE, DRY_OVERLAP = 32, 8  # the dry run's frames are smaller than a real tile (at least the family's smallest)

DEFAULT_VARIANTS = ["reference", "fp32", "bf16", "bf16-kernels_defaults", "bf16-no-triton_norm", "bf16-tiles"]


def machine() -> dict:
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                    memory_gib=round(props.total_memory / 2**30, 1))
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            info["driver"] = smi.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    # a copy of the tree without its git history (a remote GPU machine) gets the commit from outside
    info["commit"] = os.environ.get("STREAMVAE_COMMIT") or git_commit()
    return info


# --- one case, in its own process ------------------------------------------------------------------

def _build(spec: dict):
    """(model, input, plan settings, run(opts)) of a case: StreamVAE's model run by the engine, or None,
    None and ComfyUI core's own VAE with the same weights called directly (bench/core_vae.py)."""
    dtype_name, name = parse_row(spec["variant"])
    dtype, core = DTYPES[dtype_name], variant(name).core
    model = models.build(spec["family"], dtype, spec["device"], tiny=spec["tiny"], core=core,
                         config=variant(name).model_config)
    x = models.make_input(spec["family"], spec).to(spec["device"])
    if core is not None:
        x = x.to(dtype)
        op = model.encode if spec["op"] == "encode" else model.decode
        return None, x, None, lambda opts: op(x).to("cpu")
    if spec["op"] == "encode":
        x = x.to(dtype)
    settings = dict(temporal_chunk=spec.get("chunk"), **variant(name).settings)
    if settings.get("tile_size") and spec["tiny"]:
        settings.update(tile_size=max(DRY_TILE, min_tile(model.spatial_factor)),
                        tile_overlap=min(settings.get("tile_overlap", 0), DRY_OVERLAP))
    io = dict(out_device="cpu") if spec["op"] == "decode" else {}  # as the nodes do: frames to host memory
    return model, x, settings, lambda opts: models.run(model, spec["op"], x, settings, opts, **io)


def run_case(spec: dict) -> dict:
    from bench.core_vae import package_versions

    device = torch.device(spec["device"])
    model, x, settings, call = _build(spec)
    cuda = device.type == "cuda"
    result = dict(spec, predicted_peak_gib=None)
    with prepared(model, parse_row(spec["variant"])[1]) as setup:
        if model is not None:  # what the engine plans for these settings (peak unknown where uncalibrated)
            plan = models.plan(model, spec["op"], tuple(x.shape), settings, setup.opts)
            result["plan"] = plan.describe()
            result["predicted_peak_gib"] = None if plan.peak_bytes is None else plan.peak_bytes / 2**30

        def once():
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            with setup.per_run(), torch.inference_mode():
                y = call(setup.opts)  # a block that fails to compile: the engine restarts the run eagerly
            if cuda:
                torch.cuda.synchronize(device)
            return time.perf_counter() - start, y

        # The fp32 reference runs once: it is only the yardstick for the error columns.
        warm = once()[0] if spec["variant"] != "reference" else None
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        times, y = [], None
        for _ in range(1 if spec["variant"] == "reference" else spec.get("repeats", 2)):
            y = None
            t, y = once()
            times.append(t)
    result.update(first_s=warm, times_s=times, median_s=statistics.median(times))
    if setup.compile_report is not None:
        result["compile"] = setup.compile_report.status
    if model is None:
        result["core_packages"] = package_versions()
    result["gemm_bf16_tflops"] = gemm_tflops(device)
    if cuda:
        result["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30  # what the memory model predicts
        result["peak_above_start_gib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**30
    y = y.float().cpu()
    result["finite"] = bool(torch.isfinite(y).all())
    ref_path = Path(spec["scratch"]) / f"{spec['key']}-{spec['reference']}.pt"
    if spec["variant"] == spec["reference"]:
        torch.save(y, ref_path)
    elif ref_path.is_file():
        ref = torch.load(ref_path)
        result["max_err"] = (y - ref).abs().max().item()
        result["max_abs"] = ref.abs().max().item()  # what an exactness bound on max_err scales with
        result["psnr_db"] = psnr(y, ref)
    return result


def gemm_tflops(device: torch.device) -> float:
    """This device's bf16 GEMM rate right now (TFLOP/s, 8192^3 products for half a second; 512^3 on the CPU
    dry run): the yardstick of the rows' model-FLOP rate, measured in the same process as the row."""
    n = 8192 if device.type == "cuda" else 512
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    return rate(lambda: a @ b, 2 * n ** 3, 0.5, sync) / 1e12


# --- the parts --------------------------------------------------------------------------------------

def _case_process(spec: dict, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "bench.gpu_check", "--case", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(spec, error=f"timed out after {timeout:.0f} s")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        return dict(spec, error=f"exit {proc.returncode}: {tail}", stderr=proc.stderr[-4000:])
    return json.loads(lines[-1])


def workloads(args) -> list[tuple[str, int, int, int]]:
    """(family, frames, height, width) to run: --workloads, else each family's first --sizes."""
    if args.workloads:
        parsed = []
        for item in args.workloads:
            family, size = item.split(":")
            parsed.append((family, *(int(v) for v in size.lower().split("x"))))
        return parsed
    table = DRY_WORKLOADS if args.device == "cpu" else WORKLOADS
    return [(family, *size) for family in args.families for size in table[family][: args.sizes]]


def run_workloads(op: str, args, out_file: Path) -> list[dict]:
    rows, start = [], time.monotonic()
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    for family, frames, height, width in workloads(args):
        key = f"{family}-{op}-{frames}x{height}x{width}"
        clip = dict(frames=frames, height=height, width=width)
        model_tflop = models.model_flops(family, op, clip, tiny=args.device == "cpu") / 1e12
        for row_name in args.variants:
            left = args.part_budget - (time.monotonic() - start)
            if left < 20:
                rows.append(dict(family=family, op=op, variant=row_name, key=key, error="skipped: part budget spent"))
                continue
            spec = dict(family=family, op=op, frames=frames, height=height, width=width, variant=row_name, key=key,
                        device=args.device, tiny=args.device == "cpu", repeats=args.repeats, scratch=str(scratch),
                        reference=args.reference)
            row = _case_process(spec, timeout=left)
            if row.get("median_s"):  # upstream's FLOPs over the time, against the same process's GEMM rate
                row.update(model_tflop=model_tflop, tflops=model_tflop / row["median_s"])
                row["pct_gemm"] = 100 * row["tflops"] / row["gemm_bf16_tflops"]
            rows.append(row)
            with out_file.open("a") as f:
                f.write(json.dumps(row) + "\n")
            compiled = f", compile: {row['compile']}" if row.get("compile") else ""
            psnr = f", PSNR {row['psnr_db']:.1f} dB" if row.get("psnr_db") else ""
            status = row.get("error") or (f"{row['median_s']:.2f} s, peak {row.get('peak_gib', 0):.2f} GiB, "
                                          f"err {row.get('max_err', 0):.2e}{psnr}, {row['pct_gemm']:.0f} % of bf16 GEMM"
                                          f"{compiled}")
            print(f"[gpu_check] {key} {row_name}: {status}", flush=True)
    return rows


def run_tests(args, out_file: Path) -> dict:
    files = ["tests/test_triton_kernels.py", "tests/test_backend_and_compile.py",
             "tests/test_causal_cache.py", "tests/test_gpu_decisions.py", "tests/test_kernel_choice.py", "tests/test_layout.py",
             "tests/test_kernel_check.py", "tests/test_conv_check.py", "tests/test_kernel_log.py", "tests/test_triton_na.py"]
    files = [f for f in files if (REPO / f).is_file()]
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.part_budget)
        summary, code, output = proc.stdout.strip().splitlines()[-1:] or [""], proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as error:
        summary, code, output = ["timed out"], -1, str(error.stdout or "")
    row = dict(part="tests", returncode=code, summary=summary[0], seconds=time.monotonic() - start, output=output[-20000:])
    with out_file.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(output[-6000:], flush=True)
    return row


def _logged_run(cmd: list[str], timeout: float) -> int:
    """Run a tool, its output passed through; its exit code (-1 when it ran out of time)."""
    try:
        return subprocess.run(cmd, cwd=REPO, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"[gpu_check] {' '.join(cmd[2:4])}: stopped after {timeout:.0f} s", flush=True)
        return -1


def calibrate(args, out: Path) -> None:
    """Fit this device type's memory model, check it at other sizes, keep a copy of each family's file."""
    from vae.run import memory

    start = time.monotonic()
    tool = [sys.executable, "-m", "bench.calibrate_memory", "--device", args.device, "--families", *args.families]
    _logged_run(tool, args.part_budget)
    left = args.part_budget - (time.monotonic() - start)
    if left > 30:
        _logged_run(tool + ["--check"], left)
    for family in args.families:
        if memory.calibration_path(family).is_file():
            (out / f"{family}_{memory.CALIBRATION_FILE}").write_text(memory.calibration_path(family).read_text())


COLUMNS = [("key", "workload", "s"), ("variant", "variant", "s"), ("median_s", "median s", ".2f"),
           ("first_s", "first s", ".2f"), ("peak_gib", "peak GiB", ".2f"), ("peak_reserved_gib", "reserved GiB", ".2f"),
           ("predicted_peak_gib", "predicted GiB", ".2f"), ("tflops", "TFLOP/s", ".1f"), ("pct_gemm", "% GEMM", ".0f"),
           ("max_err", "max err", ".1e"), ("psnr_db", "PSNR dB", ".1f"), ("error", "error", "s")]


def _row_name(name: str) -> str:
    try:
        parse_row(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return name


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--parts", nargs="+", default=["tests", "calibrate", "decode", "encode", "profile"],
                        choices=["tests", "calibrate", "decode", "encode", "profile"])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--families", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, type=_row_name, metavar="ROW",
                        help="rows: <dtype>-<variant> of bench/variants.py's table, a bare dtype (its optimized row) "
                             "or a bare variant (fp32)")
    parser.add_argument("--sizes", type=int, default=1, help="how many of each family's workload sizes (smallest first)")
    parser.add_argument("--workloads", nargs="+", metavar="FAMILY:FxHxW",
                        help="run these clips instead, e.g. seedvr2:81x720x1248")
    parser.add_argument("--reference", default="reference", type=_row_name,
                        help="the variant whose output the error columns compare with (run it first)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--part-budget", type=float, default=480.0, help="seconds per part")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "gpu"))
    parser.add_argument("--scratch", default="/tmp/streamvae-gpu-check")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(json.loads(args.case))))
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --device cpu for the dry run")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    info = machine()
    print(f"[gpu_check] {json.dumps(info)}", flush=True)
    rows = []
    for part in args.parts:
        out_file = out / f"{stamp}-{part}.jsonl"
        if part in ("tests", "decode", "encode"):
            out_file.write_text(json.dumps({"machine": info, "argv": sys.argv[1:]}) + "\n")
        if part == "tests":
            run_tests(args, out_file)
        elif part == "calibrate":
            calibrate(args, out)
        elif part == "profile":
            family, frames, height, width = workloads(args)[0]
            _logged_run([sys.executable, "-m", "bench.gpu_profile", "--family", family, "--size", f"{frames}x{height}x{width}",
                         "--device", args.device, "--out", str(out / f"{stamp}-profile.txt")], args.part_budget)
        else:
            rows += run_workloads(part, args, out_file)
    if rows:
        print_table(rows, COLUMNS)
    failed = [f"{row['key']} {row['variant']}" for row in rows if "error" in row]
    if failed:  # a part missing a row has not measured what it was run for (gpu_session does not record it)
        sys.exit(f"{len(failed)} row(s) failed or were skipped: {', '.join(failed)}")


if __name__ == "__main__":
    main()
