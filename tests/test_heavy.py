"""Heavy tests run once per version of their code (tests/heavy.py): a pytest run with `--record-heavy`
records the heavy tests that passed; the next run skips them, saying where they passed; a change to a file
their code hash covers, or `--run-heavy`, runs them again. Driven through real pytest subprocesses on the
stand-in below, with the record in a scratch file."""
import json
import os
import subprocess
import sys

import pytest

import heavy
from tests.reference import REPO

STAND_IN = "tests/test_heavy.py::test_a_heavy_stand_in"


@pytest.mark.heavy
def test_a_heavy_stand_in():
    """What the other tests record and skip (it is heavy only by its mark)."""


def pytest_run(record, *options):
    """A pytest of the stand-in (the conv check's verdicts from this process's scratch folder: conftest.py)."""
    env = dict(os.environ, STREAMVAE_HEAVY_RECORD=str(record))
    env.pop("PYTEST_XDIST_WORKER", None)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *options, STAND_IN],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return result.stdout


def test_a_recorded_pass_is_skipped_until_its_code_changes(tmp_path):
    record = tmp_path / "heavy.jsonl"
    assert "1 passed" in pytest_run(record, "--record-heavy")
    entry, = (json.loads(line) for line in record.read_text().splitlines())
    assert entry["test"] == STAND_IN and entry["code"] == heavy.code("tests/test_heavy.py")
    skipped = pytest_run(record)
    assert "1 skipped" in skipped and "heavy: passed on this code" in skipped and entry["machine"] in skipped
    record.write_text(json.dumps(dict(entry, code="0" * 64)) + "\n")  # recorded on other code
    assert "1 passed" in pytest_run(record)


def test_the_code_covers_the_product_the_module_and_what_it_names_but_not_the_docs():
    shared = dict(heavy._shared_files())
    assert "vae/run/planning.py" in shared and "tests/conftest.py" in shared and "requirements.txt" in shared
    assert not any(p.startswith(heavy.NOT_CODE) or p.endswith(".md") or heavy._test_module(p) for p in shared)
    assert any(p.startswith("tests/comfy_support") for p in shared)
    own = heavy.code("tests/test_heavy.py")
    assert own != heavy.code("tests/test_engine.py")
    assert own != heavy.code("tests/test_heavy.py", ("tests/test_engine.py",))


def test_the_record_keeps_the_newest_entry_per_test(tmp_path):
    record = tmp_path / "heavy.jsonl"
    heavy.write({"a.py::t": ("1" * 64, 10.0), "b.py::t": ("2" * 64, 20.0)}, record)
    heavy.write({"a.py::t": ("3" * 64, 30.0)}, record)
    entries = heavy.read(record)
    assert {t: (e["code"][0], e["seconds"]) for t, e in entries.items()} == {"a.py::t": ("3", 30.0),
                                                                             "b.py::t": ("2", 20.0)}
    assert heavy.passed_on_this_code("b.py::t@tests.b", "2" * 64, entries)["seconds"] == 20.0
    assert heavy.passed_on_this_code("b.py::t", "3" * 64, entries) is None
