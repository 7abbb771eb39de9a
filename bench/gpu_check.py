"""The GPU check: validate and measure StreamVAE on the GPU it runs on, in one command.

    python -m bench.gpu_check                       # every part on the CUDA device
    python -m bench.gpu_check --parts tests decode  # some parts
    python -m bench.gpu_check --device cpu          # dry run on the CPU with the tiny models (CI)

Parts, each planned to end within `--part-budget` seconds (8 minutes by default, so each fits a remote
machine that stops a command at 10):
- tests: the CUDA tests (`pytest -m gpu`).
- decode / encode: for every family, realistic clips (full released configs, random weights) in
  fp32 and bf16: the reference (fp32, every switch off, TF32 off), the optimized default, each GPU
  switch flipped, exact tiles and a memory budget. Each case runs in its own process, so its peak
  memory (`torch.cuda.max_memory_allocated`) is its own and a crash costs one row. Recorded: median
  time, peak against the memory model's prediction, max error and PSNR against the reference.
- calibrate: the CUDA memory calibration (bench/calibrate_memory.py on this device: fit, then a
  check at other sizes); the calibration file is copied into `--out`.
- profile: where the time of one decode goes, per kernel and per kind (bench/gpu_profile.py).

Results go to `--out` (default bench/results/gpu/) as JSON lines, one per case as it finishes, plus
a table printed at the end; the machine (GPU, driver, torch, Triton, cuDNN, commit) heads each file.
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.common import git_commit, print_table, psnr  # noqa: E402

# Realistic clips per family (issue 15): (frames, height, width). The tiny CPU dry run shrinks them.
WORKLOADS = {
    "seedvr2": [(21, 720, 1280), (21, 1080, 1920)],
    "wan21": [(81, 480, 832), (81, 720, 1280)],
    "wan22": [(81, 704, 1280)],
}
DRY_WORKLOADS = {"seedvr2": [(5, 64, 96)], "wan21": [(5, 64, 96)], "wan22": [(5, 64, 96)]}

# Variants per workload: name -> what differs from the optimized default.
VARIANTS = {
    "reference": dict(dtype="fp32", opts="straightforward", backend=dict(tf32=False)),
    "fp32": dict(dtype="fp32"),
    "bf16": dict(dtype="bf16"),
    "bf16-no-triton": dict(dtype="bf16", opts="no-triton_norm"),
    "bf16-no-fused": dict(dtype="bf16", opts="no-fused_norm_act"),
    "bf16-kernels-defaults": dict(dtype="bf16", opts="kernels_defaults"),  # fixed kernels instead of measured
    "bf16-cudnn-benchmark": dict(dtype="bf16", backend=dict(cudnn_benchmark=True)),
    "bf16-channels-last": dict(dtype="bf16", channels_last=True),
    "bf16-tiles": dict(dtype="bf16", tile=512),
    "bf16-budget-12g": dict(dtype="bf16", budget=12 * 2**30),
    "bf16-auto": dict(dtype="bf16", budget="auto"),  # what the nodes run by default
    "bf16-fast-tiles": dict(dtype="bf16", tile=512, tiling="fast", overlap=64),
    # torch.compile (inductor) of every block; "first s" includes the compile, the status is recorded.
    "bf16-compile": dict(dtype="bf16", compile="default"),
    "bf16-compile-cudagraphs": dict(dtype="bf16", compile="reduce-overhead"),
    "core-bf16": dict(dtype="bf16", core=True),
    "core-fp32": dict(dtype="fp32", core=True),
}
DEFAULT_VARIANTS = ["reference", "fp32", "bf16", "bf16-kernels-defaults", "bf16-no-triton", "bf16-tiles"]


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
    import vae
    from bench.common import random_state_dict
    from bench.families import FULL_CONFIGS, make_input
    from bench.variants import options
    from tests.reference import TINY_CONFIG_OVERRIDES, tiny_checkpoint

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[spec["dtype"]]
    if spec.get("core"):  # ComfyUI core's own VAE with the same weights (bench/core_vae.py)
        from bench.core_vae import core_model

        family_cls, cfg = FULL_CONFIGS[spec["family"]]()
        with torch.device("meta"):
            meta = family_cls(cfg)
        model = core_model(spec["family"], cfg, random_state_dict(meta), dtype, cpu=spec["device"] == "cpu")
        model = model.to(spec["device"])
        x = make_input(meta, spec).to(spec["device"], dtype)
        op = model.encode if spec["op"] == "encode" else model.decode
        return None, (lambda: op(x).to("cpu")), x
    if spec["tiny"]:
        model = vae.load(tiny_checkpoint(spec["family"]), config=TINY_CONFIG_OVERRIDES[spec["family"]],
                         device=spec["device"], dtype=dtype)
    else:
        family_cls, cfg = FULL_CONFIGS[spec["family"]]()
        with torch.device("meta"):
            meta = family_cls(cfg)
        model = vae.load(random_state_dict(meta), device=spec["device"], dtype=dtype)
    x = make_input(model, spec).to(spec["device"])
    if spec["op"] == "encode":
        x = x.to(dtype)
    kwargs = dict(temporal_chunk=spec.get("chunk"))
    if spec.get("tile"):
        kwargs.update(tile_size=spec["tile"], tiling=spec.get("tiling", "exact"), tile_overlap=spec.get("overlap", 0))
    if spec.get("budget"):
        kwargs["memory_budget"] = spec["budget"]
    if spec["op"] == "decode":
        kwargs["out_device"] = "cpu"  # as the nodes do: frames go to host memory chunk by chunk
    kwargs["opts"] = options(spec.get("opts", "optimized"))
    op = vae.encode if spec["op"] == "encode" else vae.decode
    return model, (lambda: op(model, x, **kwargs)), x


def run_case(spec: dict) -> dict:
    import vae
    from bench.variants import options
    from vae.optimizations.backend import BackendFlags, applied, to_channels_last_3d
    from vae.optimizations.compile import CompileSettings, compile_blocks, dynamo_limits, run_with_fallback

    device = torch.device(spec["device"])
    model, op, x = _build(spec)
    if spec.get("channels_last"):
        to_channels_last_3d(model)
    compiled, limits = None, contextlib.nullcontext
    if spec.get("compile"):
        settings = CompileSettings(mode=spec["compile"])
        compiled, limits = compile_blocks(model, settings), partial(dynamo_limits, settings)
    flags = BackendFlags(**spec.get("backend", {}))
    cuda = device.type == "cuda"

    def once():
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with applied(flags), limits(), torch.inference_mode():
            y = run_with_fallback(op)
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - start, y

    result = dict(spec)
    predicted = None
    if model is not None:  # what the engine plans for these settings (peak unknown where uncalibrated)
        plan = vae.plan(model, spec["op"], tuple(x.shape), temporal_chunk=spec.get("chunk"), tile_size=spec.get("tile"),
                        tiling=spec.get("tiling", "exact"), tile_overlap=spec.get("overlap", 0),
                        memory_budget=spec.get("budget"), opts=options(spec.get("opts", "optimized")))
        predicted = plan.peak_bytes
        result["plan"] = plan.describe()
    result["predicted_peak_gib"] = None if predicted is None else predicted / 2**30
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
    if compiled is not None:
        result["compile"] = compiled.status
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
        result["psnr_db"] = psnr(y, ref)
    return result


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
        for variant in args.variants:
            left = args.part_budget - (time.monotonic() - start)
            if left < 20:
                rows.append(dict(family=family, op=op, variant=variant, key=key, error="skipped: part budget spent"))
                continue
            spec = dict(VARIANTS[variant], family=family, op=op, frames=frames, height=height, width=width,
                        variant=variant, key=key, device=args.device, tiny=args.device == "cpu",
                        repeats=args.repeats, scratch=str(scratch), reference=args.reference)
            if spec.get("tile") and spec["tiny"]:
                spec["tile"] = 32  # the dry run's frames are smaller than a real tile
            row = _case_process(spec, timeout=left)
            rows.append(row)
            with out_file.open("a") as f:
                f.write(json.dumps(row) + "\n")
            compiled = f", compile: {row['compile']}" if row.get("compile") else ""
            status = row.get("error") or (f"{row['median_s']:.2f} s, peak {row.get('peak_gib', 0):.2f} GiB, "
                                          f"err {row.get('max_err', 0):.2e}{compiled}")
            print(f"[gpu_check] {key} {variant}: {status}", flush=True)
    return rows


def run_tests(args, out_file: Path) -> dict:
    files = ["tests/test_triton_kernels.py", "tests/test_backend_and_compile.py",
             "tests/test_causal_cache.py", "tests/test_gpu_decisions.py", "tests/test_kernel_choice.py"]
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
    """Fit this device type's memory model, check it at other sizes, keep a copy of the file."""
    from vae import memory

    start = time.monotonic()
    tool = [sys.executable, "bench/calibrate_memory.py", "--device", args.device, "--families", *args.families]
    _logged_run(tool, args.part_budget)
    left = args.part_budget - (time.monotonic() - start)
    if left > 30:
        _logged_run(tool + ["--check"], left)
    if memory.CALIBRATION.is_file():
        (out / memory.CALIBRATION.name).write_text(memory.CALIBRATION.read_text())


COLUMNS = [("key", "workload", "s"), ("variant", "variant", "s"), ("median_s", "median s", ".2f"),
           ("first_s", "first s", ".2f"), ("peak_gib", "peak GiB", ".2f"), ("peak_reserved_gib", "reserved GiB", ".2f"),
           ("predicted_peak_gib", "predicted GiB", ".2f"),
           ("max_err", "max err", ".1e"), ("psnr_db", "PSNR dB", ".1f"), ("error", "error", "s")]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--parts", nargs="+", default=["tests", "calibrate", "decode", "encode", "profile"],
                        choices=["tests", "calibrate", "decode", "encode", "profile"])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--families", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    parser.add_argument("--sizes", type=int, default=1, help="how many of each family's workload sizes (smallest first)")
    parser.add_argument("--workloads", nargs="+", metavar="FAMILY:FxHxW",
                        help="run these clips instead, e.g. seedvr2:81x720x1248")
    parser.add_argument("--reference", default="reference", choices=list(VARIANTS),
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


if __name__ == "__main__":
    main()
