"""Kernels chosen by measurement on the machine that runs, remembered on disk per machine.

Which exact implementation of a layer is fastest depends on the machine, not on the one the pack was
tuned on: on an AVX2 CPU Winograd's GEMMs (MKL) beat oneDNN's direct 3x3x3 conv; on an AVX-512 CPU
oneDNN's direct conv runs at about twice MKL's rate, so the same Winograd mostly loses (bench/RESULTS.md
sections 8 and 9). On GPUs the winning conv memory format and whether the Triton norm beats torch's
change with the GPU and the torch version. So, like cuDNN's benchmark mode but over the pack's own alternatives,
each distinct layer (a `key`: geometry, dtype, device, threads) times its candidates once, picks the
fastest and remembers the choice:

- in memory, per process, and in a JSON file per machine in the user cache directory
  (STREAMVAE_KERNEL_CACHE overrides the directory). The file name is a hash of the machine identity
  (`machine_identity`: CPU model and flags or GPU name, capability, driver, CUDA and cuDNN; torch
  version; pack version and the source of the kernels), so a new torch, a driver or pack update or
  another machine measures afresh instead of trusting stale timings;
- the same file keeps the verdicts of the custom kernels' first-use checks (kernel_check.py, keyed
  with the Triton version), so each kernel is checked once per machine;
- every candidate computes the same result up to float rounding (tests/test_kernel_choice.py);
  a candidate that raises is skipped (logged) and the default runs;
- `Optimizations.kernel_choice = "defaults"` skips all of this and runs the fixed defaults
  (deterministic from machine to machine; what the tests use).

Measuring costs a few of the layer's own runs (on at most two output frames of at most 128x128
pixels, see conv.py), once per shape per machine; each new shape logs one line with its times.
"""
import hashlib
import json
import logging
import os
import platform
import re
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch

from . import backend

log = logging.getLogger("streamvae")

MODES = ("measure", "defaults")
CACHE_ENV = "STREAMVAE_KERNEL_CACHE"
# Timed runs per candidate after its warm-up run (which also builds oneDNN primitives and Winograd's
# filter transform); the best counts, as the machine is shared and a run can only be slowed by noise.
TIMED_RUNS = 2
# A candidate replaces the default only when at least this much faster: a tie within the noise keeps
# the default, so the choice does not flip between runs on a busy machine.
MIN_GAIN = 1.05
# What measuring one new layer shape costs, for readouts (what the per-shape log lines show).
TUNING_COST = "about 0.5-3 s on a CPU, less on a GPU"
# Files next to the kernels whose source is part of the machine identity: a change to them can change
# which candidate wins.
_KERNEL_SOURCES = ("conv.py", "winograd.py", "winograd_job.py", "winograd_gemm.py", "norm_act.py", "triton_norm.py",
                   "kernel_choice.py", "layout.py", "kernel_check.py")


def cache_dir() -> Path:
    """Where the choices are stored: $STREAMVAE_KERNEL_CACHE, else the user cache directory."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "streamvae" / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "streamvae" / "kernels"


def pack_version() -> str:
    """The pack's version (pyproject.toml of the repository this file is in) and a hash of the kernel
    sources: a development change to a kernel invalidates old measurements as a release does."""
    here = Path(__file__).resolve().parent
    version = "unknown"
    for folder in (here, *here.parents):
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
            version = found.group(1) if found else version
            break
    digest = hashlib.sha1()
    for name in _KERNEL_SOURCES:
        source = here / name
        digest.update(source.read_bytes() if source.is_file() else b"")
    return f"{version}+{digest.hexdigest()[:10]}"


@lru_cache(maxsize=None)
def cpu_identity() -> dict:
    """CPU model and the instruction-set flags that decide kernel speed (Linux /proc/cpuinfo, read once
    per process; the benchmarks record it too). Callers must not modify the dict."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    fields = {}
    for line in info.splitlines():  # the first processor's entries
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = (fields.get("flags") or fields.get("Features") or "").split()  # x86 / arm64
    return {"cpu": fields.get("model name") or platform.processor() or platform.machine(),
            "flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "sve", "asimd"))),
            "capability": torch.backends.cpu.get_cpu_capability()}


def machine_identity(device) -> dict:
    """What a measurement on `device` is valid for: the hardware, torch and the pack."""
    device = torch.device(device)
    identity = {"torch": torch.__version__, "pack": pack_version(), "device": device.type}
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        identity.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                        arch=getattr(props, "gcnArchName", "") if torch.version.hip else "",
                        driver=backend.driver_version(), runtime=torch.version.hip or torch.version.cuda,
                        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    else:
        identity.update(cpu_identity())
    return identity


class KernelChoices:
    """The measured choices of one machine identity, in memory and in `path` (JSON; None: memory only).

    The file holds {"machine": identity, "choices": {key: {"choice": name, "ms": {name: best ms}}},
    "checks": {key: verdict}} (the first-use checks' verdicts, `check` / `keep_check`); it is re-read
    before a key is measured or checked and merged before every write, so processes sharing it (a
    ComfyUI server and a script, several workers) use and add to each other's choices.
    """

    def __init__(self, path: Path | None, machine: dict):
        self.path, self.machine = path, machine
        self._lock = threading.Lock()
        stored = self._read()
        self._choices, self._checks = stored["choices"], stored["checks"]
        self.reused: set[str] = set()  # keys answered from the file
        self.measured: set[str] = set()  # keys measured by this process
        self.tuning_s = 0.0

    def _read(self) -> dict:
        """{"choices": ..., "checks": ...} of this machine in the file (empty ones without a file)."""
        empty = {"choices": {}, "checks": {}}
        if self.path is None or not self.path.is_file():
            return empty
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as error:
            log.warning("StreamVAE: ignoring unreadable kernel-choice cache %s (%s)", self.path, error)
            return empty
        return {part: data.get(part, {}) for part in empty} if data.get("machine") == self.machine else empty

    def _write(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            stored = self._read()
            merged = {"choices": {**stored["choices"], **self._choices}, "checks": {**stored["checks"], **self._checks}}
            scratch = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            scratch.write_text(json.dumps({"machine": self.machine, **merged}, indent=1, sort_keys=True))
            os.replace(scratch, self.path)
        except OSError as error:
            log.warning("StreamVAE: cannot store kernel choices in %s (%s); they are kept for this process only "
                        "(set %s to a writable folder)", self.path, error, CACHE_ENV)
            self.path = None

    def cached(self, key: str) -> str | None:
        entry = self._choices.get(key)
        return None if entry is None else entry["choice"]

    def choose(self, key: str, candidates: dict[str, Callable[[], object]], default: str,
               sync: Callable[[], None] = lambda: None) -> str:
        """The name of the fastest of `candidates` (name -> zero-argument run) for `key`, measured once.

        Each candidate runs once untimed, then TIMED_RUNS times (`sync` waits for the device before a
        clock is read); the best time counts. One that raises is skipped. `default` (a key of
        `candidates`) wins unless another is MIN_GAIN faster, or when every candidate failed.
        """
        with self._lock:
            if key not in self._choices:  # another process sharing the file may have measured it meanwhile
                self._choices = {**self._read()["choices"], **self._choices}
            choice = self.cached(key)
            if choice in candidates:
                if key not in self.measured:
                    self.reused.add(key)
                return choice
        start = time.perf_counter()
        best = {name: self._best_time(name, run, key, sync) for name, run in candidates.items()}
        best = {name: t for name, t in best.items() if t is not None}
        choice = default
        if best:
            fastest = min(best, key=best.get)
            if default not in best or best[fastest] * MIN_GAIN < best[default]:
                choice = fastest
        spent = time.perf_counter() - start
        log.info("StreamVAE: measured kernels for %s in %.2f s (once per shape on this machine): %s -> %s", key, spent,
                 ", ".join(f"{name} {t * 1e3:.1f} ms" for name, t in best.items()) or "all failed", choice)
        with self._lock:
            self._choices[key] = {"choice": choice, "ms": {name: round(t * 1e3, 3) for name, t in best.items()}}
            self.measured.add(key)
            self.reused.discard(key)
            self.tuning_s += spent
            self._write()
        return choice

    @staticmethod
    def _best_time(name: str, run: Callable[[], object], key: str, sync) -> float | None:
        try:
            run()
            sync()
            times = []
            for _ in range(TIMED_RUNS):
                start = time.perf_counter()
                run()
                sync()
                times.append(time.perf_counter() - start)
            return min(times)
        except Exception as error:  # noqa: BLE001 - any failure of an optional kernel means: not this one
            log.warning("StreamVAE: kernel %s failed for %s, skipped (%s: %s)", name, key, type(error).__name__, error)
            return None

    def check(self, key: str) -> dict | None:
        """The first-use check verdict on record for `key` (kernel_check.py), or None."""
        with self._lock:
            if key not in self._checks:  # another process sharing the file may have checked it meanwhile
                self._checks = {**self._read()["checks"], **self._checks}
            return self._checks.get(key)

    def keep_check(self, key: str, verdict: dict) -> None:
        """Put a first-use check's verdict (a JSON-able dict) on record."""
        with self._lock:
            self._checks[key] = verdict
            self._write()

    def chosen(self, prefix: str) -> set[str]:
        """The choices on record for the keys that start with `prefix`."""
        return {entry["choice"] for entry in self.recorded(prefix).values()}

    def recorded(self, prefix: str) -> dict:
        """{key: entry} on record for the keys that start with `prefix` (a copy)."""
        with self._lock:
            return {key: dict(entry) for key, entry in self._choices.items() if key.startswith(prefix)}

    def on_record(self) -> int:
        """How many layer shapes have a choice on record for this machine (any model)."""
        with self._lock:
            return len(self._choices)

    def summary(self) -> dict:
        """Counts for the readout: shapes decided in this process and what won."""
        with self._lock:
            used = self.measured | self.reused
            wins: dict[str, int] = {}
            for key in used:
                name = self._choices[key]["choice"]
                wins[name] = wins.get(name, 0) + 1
            return {"shapes": len(used), "measured": len(self.measured), "reused": len(self.reused),
                    "wins": dict(sorted(wins.items())), "tuning_s": self.tuning_s}


@lru_cache(maxsize=None)
def _choices_for(folder: str | None, machine_json: str) -> KernelChoices:
    machine = json.loads(machine_json)
    path = None if folder is None else Path(folder) / f"kernels-{hashlib.sha1(machine_json.encode()).hexdigest()[:16]}.json"
    return KernelChoices(path, machine)


@lru_cache(maxsize=None)
def _identity_json(device: str) -> str:
    return json.dumps(machine_identity(device), sort_keys=True)


def choices_for(device) -> KernelChoices:
    """The choices of this machine for `device` (one instance per cache folder and machine identity)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _choices_for(str(cache_dir()), _identity_json("cpu" if device.type == "cpu" else str(device)))


def pick(key: str, device, candidates: dict[str, Callable[[], object]], default: str) -> str:
    """`KernelChoices.choose` on this machine's choices for `device` (waiting for a GPU before the clock)."""
    device = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    return choices_for(device).choose(key, candidates, default, sync)
