"""The resumable GPU session (bench/gpu_session.py), dry-run on the CPU: a part that ran to its end is recorded for
this code and device and skipped by the next window; a part stopped at its time is not; the fingerprint follows
the sources, not the committed results; everything a window wrote comes back in one archive."""
import json
import os
import subprocess
import sys
import tarfile

import pytest

from bench import gpu_session
from bench.core_vae import TREES
from comfy_support import environment
from tests.reference import REPO


def session(tmp_path, *args):
    cmd = [sys.executable, "-m", "bench.gpu_session", "--device", "cpu", "--out", str(tmp_path),
           "--ledger", str(tmp_path / "ledger.jsonl"), *args]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_a_recorded_part_is_skipped_by_the_next_window(tmp_path):
    tree = TREES["0.33.0"]
    environment.require((tree.path / "comfy").is_dir() and bool(tree.sites()),
                        f"ComfyUI 0.33.0 at {tree.path} with its packages (the part has core's row)")
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


def test_a_sweep_part_with_a_row_stopped_is_not_recorded(tmp_path):
    """A memory sweep part runs to its end even when a row is stopped at its share of the time (the 6 GiB
    1080p row on an H100, 2026-11-27); the part has not measured that row, so it is not recorded."""
    part = next(p for p in gpu_session.PARTS if p.name == "seedvr2-1080p-6gib")
    part = gpu_session.Part(part.name, part.seconds, part.why, tuple(
        "0.5" if previous == "--row-timeout" else a for previous, a in zip(("",) + part.args, part.args)))
    with (tmp_path / "log").open("w") as log:
        status, _ = gpu_session.run_part(part, 300, tmp_path, "cpu", log)
    assert status == "exit 1", (tmp_path / "log").read_text()[-2000:]
    assert "stopped after" in (tmp_path / "log").read_text()


def test_parts_older_code_recorded_run_after_those_never_recorded(tmp_path):
    """Windows add up across code changes: what an older fingerprint recorded on this device waits behind
    what was never recorded there, except the tests, which new code runs first."""
    old = dict(gpu="cpu", code="older code", status="recorded")
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("".join(json.dumps(dict(old, part=name)) + "\n" for name in ("tests", "decode-wan21-480p")))
    listed = session(tmp_path, "--list", "--parts", "tests", "decode-wan21-480p", "decode-seedvr2-720p")
    assert "to run ['tests', 'decode-seedvr2-720p', 'decode-wan21-480p']" in listed


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


@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_the_carry_holds_every_core_vae_the_rows_import(tmp_path):
    """A GPU machine has no network: prepare_gpu_carry.sh's copies of the core trees must import every core VAE
    bench.core_vae compares with (LTX-2's and HV1.5's rows failed on a GPU once for a folder left behind)."""
    for version, tree in TREES.items():
        environment.require((tree.path / "comfy").is_dir() and (version != "0.33.0" or bool(tree.sites())),
                            f"ComfyUI {version} at {tree.path} with its packages")
    env = {**os.environ, "STREAMVAE_CARRY": str(tmp_path)}
    subprocess.run(["bash", "bench/prepare_gpu_carry.sh", "--trees-only"], cwd=REPO, env=env, check=True,
                   capture_output=True, timeout=300)
    for version, tree in TREES.items():  # one core per process
        env[tree.env] = str(tmp_path / f"comfyui-{version}")
        code = (f"from bench.core_vae import _import_core\nfor module in {sorted(set(tree.modules.values()))!r}:\n"
                f"    _import_core({version!r}, module, cpu=True)")
        result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, f"{version}: {result.stderr[-1500:]}"
