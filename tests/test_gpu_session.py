"""The resumable GPU session (bench/gpu_session.py), dry-run on the CPU: a part that ran to its end is recorded for
this code and device and skipped by the next window; a part stopped at its time is not; the fingerprint follows
the sources, not the committed results; everything a window wrote comes back in one archive."""
import json
import subprocess
import sys
import tarfile

import pytest

from bench import gpu_session
from bench.core_vae import TREES
from tests.reference import REPO


def session(tmp_path, *args):
    cmd = [sys.executable, "-m", "bench.gpu_session", "--device", "cpu", "--out", str(tmp_path),
           "--ledger", str(tmp_path / "ledger.jsonl"), *args]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_a_recorded_part_is_skipped_by_the_next_window(tmp_path):
    tree = TREES["0.33.0"]
    if not (tree.path / "comfy").is_dir() or not tree.sites():
        pytest.skip(f"no ComfyUI 0.33.0 at {tree.path} with its packages (run .ci/setup): the part has core's row")
    session(tmp_path, "--seconds", "300", "--parts", "decode-wan21-480p")
    ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [(e["part"], e["status"], e["code"]) for e in ledger] == [
        ("decode-wan21-480p", "recorded", gpu_session.code_fingerprint())]
    with tarfile.open(tmp_path / "gpu-results.tar.gz") as tar:
        decode = next(m for m in tar.getmembers() if m.name.endswith("-decode.jsonl"))
        rows = [json.loads(line) for line in tar.extractfile(decode).read().decode().splitlines()[1:]]
    assert [r["variant"] for r in rows] == gpu_session.SPEED_ROWS and not any("error" in r for r in rows), rows

    again = session(tmp_path, "--seconds", "300", "--parts", "decode-wan21-480p", "encode-wan21-480p")
    assert "recorded ['decode-wan21-480p']; to run ['encode-wan21-480p']" in again
    assert "skipped" not in again  # the encode part fitted and ran, the decode part did not run again
    assert [json.loads(line)["part"] for line in (tmp_path / "ledger.jsonl").read_text().splitlines()] == [
        "decode-wan21-480p", "encode-wan21-480p"]


def test_a_part_stopped_at_its_time_is_not_recorded(tmp_path):
    part = next(p for p in gpu_session.PARTS if p.name == "decode-wan21-480p")
    with (tmp_path / "log").open("w") as log:
        status, seconds = gpu_session.run_part(part, 1.0, tmp_path, "cpu", log)
    assert status == "timed out" and seconds < 30
    entry = dict(part=part.name, gpu="cpu", code="c0de", status=status)
    (tmp_path / "ledger.jsonl").write_text(json.dumps(entry) + "\n" + json.dumps(dict(entry, part="tests", status="recorded")) + "\n")
    assert gpu_session.recorded(tmp_path / "ledger.jsonl", "cpu", "c0de") == {"tests"}
    assert gpu_session.recorded(tmp_path / "ledger.jsonl", "cpu", "other code") == set()
    assert gpu_session.recorded(tmp_path / "ledger.jsonl", "NVIDIA H100 80GB HBM3", "c0de") == set()


def test_a_window_too_short_for_a_part_skips_it(tmp_path):
    out = session(tmp_path, "--seconds", "5", "--parts", "tests")
    assert "tests: skipped, needs about" in out
    assert not (tmp_path / "ledger.jsonl").exists()


def test_the_fingerprint_follows_sources_not_results(tmp_path):
    for folder in gpu_session.FINGERPRINTED:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text("x = 1\n")
    before = gpu_session.code_fingerprint(tmp_path)
    (tmp_path / "bench" / "results").mkdir()
    (tmp_path / "bench" / "results" / "ledger.jsonl").write_text("{}\n")
    assert gpu_session.code_fingerprint(tmp_path) == before
    (tmp_path / "vae" / "a.py").write_text("x = 2\n")
    assert gpu_session.code_fingerprint(tmp_path) != before
