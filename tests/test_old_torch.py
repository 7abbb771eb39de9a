"""The pack on torch 2.4-2.8, whose APIs lack what 2.9-2.13 added (comfy_support/old_torch.py).

`test_suite_runs_on_older_torch` reruns the node and optimization tests in a subprocess with those
APIs hidden, in the test process and in the ComfyUI server it starts; `test_emulation_is_active`
runs only inside that subprocess and proves the hiding took effect in both places.
"""
import os
import subprocess
import sys

import pytest
import torch

from comfy_support import old_torch
from tests.reference import REPO

pytestmark = pytest.mark.comfy  # runs a real ComfyUI: CI's second lane (.ci/run)

# Server tests on ComfyUI 0.3.75 only: the release of the older-torch era (0.33.0 needs newer torch itself).
UNDER_EMULATION = [
    "tests/test_old_torch.py::test_emulation_is_active[0.3.75]",
    "tests/test_backend_and_compile.py",
    "tests/test_gpu_decisions.py",
    "tests/test_nodes_server.py::test_settings_nodes_feed_the_loader[0.3.75]",
    "tests/test_nodes_server.py::test_round_trip_matches_the_library[0.3.75-wan21]",
    "tests/test_bad_inputs_server.py::test_gpu_only_options_on_a_cpu_machine_warn_and_run[0.3.75]",
    "tests/test_bad_inputs_server.py::test_out_of_memory_mid_decode_retries_smaller_and_keeps_the_result[0.3.75]",
]


@pytest.mark.skipif(old_torch.active(), reason="this is the outer run")
@pytest.mark.heavy(*sorted({test.split('::')[0] for test in UNDER_EMULATION}))  # minutes: tests/heavy.py
def test_suite_runs_on_older_torch():
    env = dict(os.environ, **{old_torch.ENV: "1"})
    # --run-heavy: a heavy test among them has a record of passing on new torch only
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--run-heavy", *UNDER_EMULATION]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    summary = (result.stdout.strip().splitlines() or [""])[-1]
    assert result.returncode == 0, f"{summary}\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    assert "skipped" not in summary or "passed" in summary, summary


@pytest.mark.skipif(not old_torch.active(), reason="runs inside test_suite_runs_on_older_torch")
def test_emulation_is_active(comfy_server):
    assert not hasattr(torch.backends.cudnn, "conv") and not hasattr(torch.backends.cuda.matmul, "fp32_precision")
    assert "StreamVAE tests: emulating torch 2.4, hidden: torch.backends.cudnn.CudnnModule.conv" in comfy_server.log
