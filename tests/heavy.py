"""Heavy tests (`@pytest.mark.heavy`: minutes of CPU each: full-size decodes in fresh processes, released
widths, the GPU scripts' dry runs) run once per version of the code they test, not on every CI run.

A heavy test's *code* is a hash of what it can depend on: every tracked file of the repository but the
docs, the Markdown files, the recorded results (bench/results/) and the other test modules, plus the
versions of Python and of the packages that compute (torch, triton, diffusers, numpy, safetensors). A test
that reruns other modules names them (`@pytest.mark.heavy("tests/test_nodes_server.py", ...)`, as
test_old_torch.py does). A run with `--record-heavy` writes each heavy test that passed, with its code,
seconds and machine, into `RECORD` (committed); a later run, on any machine, skips a heavy test the record
holds as passed on the same code, saying when and where it passed (`--run-heavy` runs them all the same).
Change anything it depends on and it runs again: CI then takes its minutes, or the change's author records
it first.
"""
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import time
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD = Path(os.environ.get("STREAMVAE_HEAVY_RECORD", REPO / "bench" / "results" / "heavy_tests.jsonl"))
PACKAGES = ("torch", "triton", "diffusers", "numpy", "safetensors")
NOT_CODE = ("docs/", "bench/results/")


def test_id(nodeid: str) -> str:
    """A test's id without the pytest-xdist group that `--dist loadgroup` appends ("...@comfyui-0.33.0")."""
    return nodeid.split("@", 1)[0]


@lru_cache(maxsize=1)
def _shared_files() -> tuple[tuple[str, str], ...] | None:
    """(path, content hash) of every tracked file a heavy test may depend on, test modules aside; None
    outside a git checkout (then no record applies and every heavy test runs)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = sorted(p for p in listed.decode().split("\0") if p and not p.startswith(NOT_CODE)
                   and not p.endswith(".md") and not _test_module(p))
    return tuple((p, _file_hash(p)) for p in paths if (REPO / p).is_file())


def _test_module(path: str) -> bool:
    return Path(path).parent == Path("tests") and Path(path).name.startswith("test_")


def _file_hash(path: str) -> str:
    return hashlib.sha256((REPO / path).read_bytes()).hexdigest()


def _versions() -> dict[str, str | None]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def code(module: str, also: tuple[str, ...] = ()) -> str | None:
    """The code a heavy test in `module` (a path from the repository root) and the test modules `also`
    runs: one hash (module docstring); None outside a git checkout."""
    shared = _shared_files()
    if shared is None:
        return None
    digest = hashlib.sha256(json.dumps(_versions(), sort_keys=True).encode())
    for path, content in (*shared, *((p, _file_hash(p)) for p in sorted({module, *also}))):
        digest.update(f"{path}\0{content}\n".encode())
    return digest.hexdigest()


def read(record: Path = RECORD) -> dict[str, dict]:
    """The record: test id -> its latest entry."""
    if not record.is_file():
        return {}
    entries = (json.loads(line) for line in record.read_text().splitlines() if line.strip())
    return {entry["test"]: entry for entry in entries}


def passed_on_this_code(test: str, code_hash: str | None, entries: dict[str, dict]) -> dict | None:
    """The record's entry saying `test` passed on `code_hash`, or None."""
    entry = entries.get(test_id(test))
    return entry if code_hash is not None and entry is not None and entry["code"] == code_hash else None


def machine() -> str:
    """The CPU's model and its widest vector unit, the names a result is compared by."""
    model = platform.processor() or platform.machine()
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        flags = next(line for line in info.splitlines() if line.startswith("flags")).split()
        model += ", AVX-512" + (" BF16" if "avx512_bf16" in flags else "") if "avx512f" in flags else ", AVX2"
    except (OSError, StopIteration):
        pass
    return model


def write(passed: dict[str, tuple[str, float]], record: Path = RECORD) -> None:
    """Put `passed` (test id -> (code, seconds)) into the record, one line per test, the newest kept."""
    entries = read(record)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for test, (code_hash, seconds) in passed.items():
        entries[test] = {"test": test, "code": code_hash, "seconds": round(seconds, 1), "machine": machine(),
                         "date": stamp, "head": commit, "torch": _versions()["torch"]}
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("".join(json.dumps(entries[t], sort_keys=True) + "\n" for t in sorted(entries)))


def skip_reason(entry: dict) -> str:
    return (f"heavy: passed on this code {entry['date']} on {entry['machine']} in {entry['seconds']} s "
            f"({RECORD.name}; --run-heavy runs it)")



class Recorder:
    """A pytest plugin, in the process that runs or gathers every test (`--record-heavy`): each heavy test
    whose setup and call passed, with its code and seconds, goes into the record when the session ends."""

    def __init__(self):
        self.passed: dict[str, tuple[str, float]] = {}
        self.waiting: set[str] = set()  # set up, its call yet to pass

    def pytest_runtest_logreport(self, report):
        code_hash = dict(report.user_properties).get("heavy_code")
        if code_hash is None or report.when == "teardown" or not report.passed:
            return
        test = test_id(report.nodeid)
        self.passed[test] = (code_hash, self.passed.get(test, (code_hash, 0.0))[1] + report.duration)
        (self.waiting.add if report.when == "setup" else self.waiting.discard)(test)

    def pytest_sessionfinish(self, session):
        write({test: value for test, value in self.passed.items() if test not in self.waiting})
