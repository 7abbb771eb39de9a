"""The GPU check in parts that resume: run, within a given number of seconds, the parts not yet recorded for
this code and this GPU, most important first, so that several short GPU windows add up to the whole check.

    python -m bench.gpu_session --seconds 540                 # on the GPU machine (bench/gpu_session.sh)
    python -m bench.gpu_session --list                        # what is recorded, what is left
    python -m bench.gpu_session --seconds 300 --device cpu    # dry run with the tiny models (CI)

A part is recorded in the ledger (bench/results/gpu/ledger.jsonl, committed) once it ran to its end on a GPU
for a code fingerprint (a hash of vae/, bench/ and tests/ sources: committing results does not change it, a
code change does). A part that ran out of time or crashed is logged but not recorded, so the next window runs
it again. Code changes every session, so a part that older code recorded on this GPU runs after the parts
never recorded there (the CUDA tests excepted: they run first for new code). The device tool brings back at
most 8 files, so everything a run writes goes into one archive, `$OUT/gpu-results.tar.gz` (rewritten after
each part, so a run stopped at its limit keeps what it finished), beside `$OUT/ledger.jsonl` (this run's new
ledger lines, to append to the committed ledger).

Each part's estimate is what it took on an H100 (bench/RESULTS.md sections 0, 12 and 16), process starts and
the fp32 reference rows included; a part starts only when its estimate fits the time left, and is stopped
after 1.5x its estimate (or at the time left), so one part that hangs leaves the others their window.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO
from vae import families

LEDGER = REPO / "bench" / "results" / "gpu" / "ledger.jsonl"
FINGERPRINTED = ("vae", "bench", "tests")  # the sources a result depends on (*.py, *.sh)
SPEED_ROWS = ["reference", "bf16", "bf16-core_0.33.0", "bf16-ncdhw"]
OVERRUN = 1.5  # a part is stopped after this many times its estimate


@dataclass(frozen=True)
class Part:
    name: str
    seconds: int  # the estimate (and the stop: a part never runs past the session's time left)
    why: str
    args: tuple[str, ...]  # `python -m` arguments; {out} is the results folder, {budget} the part's seconds
    # files of the checkout the part writes, copied into the results after it (named <folder>_<file>)
    keeps: tuple[str, ...] = ()
    first: bool = False  # runs first for new code even if older code's run recorded it (correctness)


def _decode(name: str, workload: str, seconds: int, why: str, op: str = "decode", rows=SPEED_ROWS) -> Part:
    return Part(name, seconds, why, ("bench.gpu_check", "--parts", op, "--workloads", workload, "--variants", *rows,
                                     "--part-budget", "{budget}", "--out", "{out}"))


def _sweep(name: str, size: str, budgets: list[str], seconds: int, why: str, untiled: bool = True) -> Part:
    rows = len(budgets) + untiled  # each row stopped at its share, so one slow budget leaves the others their time
    return Part(name, seconds, why, ("bench.memory_sweep", "--device", "{device}", "--dtype", "bf16", "--frames", "21",
                                     "--sizes", size, "--budgets-gib", *budgets, *(() if untiled else ("--no-untiled",)),
                                     "--row-timeout", str(seconds // rows), "--out", f"{{out}}/memory_sweep_{name}.jsonl"))


# In the order of issue 39: correctness, the 6 GiB promise, speed against core, calibration, the rest.
PARTS = [
    Part("tests", 110, "the CUDA tests: both layouts and every Triton kernel natively",
         ("bench.gpu_check", "--parts", "tests", "--part-budget", "{budget}", "--out", "{out}"), first=True),
    _sweep("seedvr2-1080p-6gib", "1080x1920", ["6"], 240,
           "SeedVR2 21x1080x1920 bf16 decode within a 6 GiB card: measured against predicted, exact against untiled"),
    _decode("decode-wan21-480p", "wan21:81x480x832", 100, "Wan2.1 decode: the default, NCDHW and core 0.33.0"),
    _decode("decode-seedvr2-720p", "seedvr2:81x720x1248", 240, "SeedVR2 decode: the default, NCDHW and core 0.33.0"),
    _decode("decode-wan22-704p", "wan22:81x704x1280", 200, "Wan2.2 decode: the default, NCDHW and core 0.33.0"),
    _decode("decode-ltx2-720p", "ltx2:121x720x1280", 110, "LTX-2 decode: the default, NCDHW and core 0.33.0 (issue 38)"),
    _decode("encode-wan21-480p", "wan21:81x480x832", 90, "Wan2.1 encode: NDHWC against NCDHW", op="encode",
            rows=["reference", "bf16", "bf16-ncdhw"]),
    Part("calibrate-streamed", 200, "the streamed mode's CUDA memory coefficients (SeedVR2, Wan2.1 decode)",
         ("bench.calibrate_memory", "--device", "{device}", "--modes", "streamed", "--families", families.SEEDVR2.name,
          families.WAN21.name, "--ops", "decode"),
         keeps=tuple(f"vae/model/{f.name}/memory_calibration.json" for f in (families.SEEDVR2, families.WAN21))),
    _sweep("seedvr2-1080p-cards", "1080x1920", ["8", "12", "16"], 300, "SeedVR2 1080p within 8, 12 and 16 GiB cards",
           untiled=False),
    _sweep("seedvr2-4k-cards", "2160x3840", ["10", "16"], 240, "SeedVR2 4K within 10 and 16 GiB cards", untiled=False),
    _decode("decode-hv15-720p", "hv15:121x720x1280", 420,
            "HunyuanVideo 1.5 decode (issue 41): the default, within 6 GiB, core 0.33.0 and its unmasked attention",
            rows=["reference", "bf16", "bf16-budget_6g", "bf16-core_0.33.0", "bf16-core_attention"]),
    _decode("decode-hv10-480p", "hv10:17x480x848", 150,
            "HunyuanVideo 1.0 / Kandinsky decode (issue 52): the default, within 12 GiB (chunks after the statistics "
            "passes), its frames as core computes them and core 0.33.0",
            rows=["reference", "bf16", "bf16-budget_12g", "bf16-core_frames", "bf16-core_0.33.0"]),
    _decode("decode-minimax_h3-480p", "minimax_h3:121x480x864", 300,
            "MiniMax-H3 decode (issue 51): the default (a clip's 15 tiles at once), within 6 GiB (fewer at once) and "
            "within 2 GiB (its decoder's blocks streamed from host memory) and core 0.33.0 (its frames before its clamp)",
            rows=["reference", "bf16", "bf16-budget_6g", "bf16-budget_2g", "bf16-core_0.33.0"]),
    _decode("decode-ltx25-720p", "ltx25:121x720x1280", 300,
            "LTX-2.5 diffusion-decoder decode (issue 50): the default (the Triton neighbourhood attention), within "
            "8 GiB (2 latent frames a chunk, caches to host) and core 0.33.0 with comfy-kitchen",
            rows=["reference", "bf16", "bf16-budget_8g", "bf16-core_0.33.0"]),
    Part("profile-wan21", 60, "where the default Wan2.1 decode's time goes",
         ("bench.gpu_check", "--parts", "profile", "--workloads", "wan21:81x480x832", "--part-budget", "{budget}",
          "--out", "{out}")),
]


def code_fingerprint(root: Path = REPO) -> str:
    """A hash of the sources results depend on; the device copy has no git history, so files, not commits."""
    digest = hashlib.sha256()
    for top in FINGERPRINTED:
        for path in sorted((root / top).rglob("*")):
            if path.suffix in (".py", ".sh") and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


def recorded(ledger: Path, gpu: str, code: str | None) -> set[str]:
    """The parts that ran to their end on this GPU for this code (None: for any code)."""
    if not ledger.is_file():
        return set()
    lines = (json.loads(line) for line in ledger.read_text().splitlines() if line.strip())
    return {r["part"] for r in lines
            if r["gpu"] == gpu and code in (None, r["code"]) and r["status"] == "recorded"}


def in_order(todo: list[Part], measured_before: set[str]) -> list[Part]:
    """The parts to run, most needed first: a part some older code recorded on this GPU goes after those
    never recorded there (unless it is a `first` part), so that windows add up although every session
    changes the code; otherwise the order of PARTS."""
    return sorted(todo, key=lambda p: not p.first and p.name in measured_before)


def dry_run_args(args: list[str]) -> list[str]:
    """The same part on the CPU in seconds: the tiny models' clips, 5 frames of 64x64 for the sweeps."""
    shrunk = [f"{a.split(':')[0]}:5x32x32" if ":" in a and a[0].isalpha() else a for a in args]
    for flag, value in (("--sizes", "64x64"), ("--frames", "5")):
        if flag in shrunk:
            shrunk[shrunk.index(flag) + 1] = value
    return shrunk + (["--device", "cpu", "--repeats", "1"] if shrunk[0] == "bench.gpu_check" else [])


def run_part(part: Part, budget: float, out: Path, device: str, log) -> tuple[str, float]:
    """Run one part, stopped after `budget` seconds; ("recorded" | "timed out" | "exit N", seconds)."""
    args = [a.format(out=out, budget=int(budget), device=device) for a in part.args]
    if device == "cpu":
        args = dry_run_args(args)
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              timeout=budget)
        status = "recorded" if proc.returncode == 0 else f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        status = "timed out"
    for kept in part.keeps:
        if (REPO / kept).is_file():
            shutil.copy(REPO / kept, out / "_".join(Path(kept).parts[-2:]))  # <folder>_<file>: one per family
    return status, time.monotonic() - start


def pack(folder: Path, archive: Path) -> None:
    """Everything under `folder` into one archive (the device tool returns at most 8 files)."""
    tmp = archive.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    tmp.replace(archive)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=540, help="time this session may take, in seconds")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--parts", nargs="+", choices=[p.name for p in PARTS], help="only these (default: all)")
    parser.add_argument("--ledger", type=Path, default=LEDGER)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or REPO / "bench" / "results" / "gpu"))
    parser.add_argument("--list", action="store_true", help="print what is recorded and what is left, run nothing")
    args = parser.parse_args()
    deadline = time.monotonic() + args.seconds
    code, gpu = code_fingerprint(), device_name(args.device)
    done = recorded(args.ledger, gpu, code)
    todo = in_order([p for p in PARTS if (not args.parts or p.name in args.parts) and p.name not in done],
                    recorded(args.ledger, gpu, None))
    print(f"[gpu_session] {gpu}, code {code}: recorded {sorted(done) or 'none'}; to run {[p.name for p in todo]}",
          flush=True)
    if args.list:
        return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = Path("/tmp") / f"gpu-results-{stamp}"
    results.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    new_ledger = args.out / "ledger.jsonl"
    commit = os.environ.get("STREAMVAE_COMMIT")
    for part in todo:
        left = deadline - time.monotonic()
        if part.seconds > left:
            print(f"[gpu_session] {part.name}: skipped, needs about {part.seconds} s, {left:.0f} s left", flush=True)
            continue
        stop = min(left, OVERRUN * part.seconds)
        print(f"[gpu_session] {part.name} ({part.why}), up to {stop:.0f} s", flush=True)
        with (results / f"{part.name}.log").open("w") as log:
            status, seconds = run_part(part, stop, results, args.device, log)
        print((results / f"{part.name}.log").read_text()[-4000:], flush=True)
        print(f"[gpu_session] {part.name}: {status} in {seconds:.0f} s", flush=True)
        entry = dict(part=part.name, gpu=gpu, code=code, commit=commit, status=status, seconds=round(seconds, 1),
                     at=time.strftime("%Y-%m-%dT%H:%M:%S"), results=results.name)
        with new_ledger.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        pack(results, args.out / "gpu-results.tar.gz")


if __name__ == "__main__":
    main()
