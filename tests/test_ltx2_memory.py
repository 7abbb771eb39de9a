"""LTX-2's memory (issue 38): the plans the planner picks for the issue's targets on the CUDA memory model
(bf16 decode and fp32 encode weights on the card, frames to host memory; LTX-2's CUDA coefficients are
derived, the CPU's times `memory.UNCALIBRATED_MARGIN`, until a GPU measures them), and a
real full-width decode on the CPU under a RAM budget of the resident memory plus under a quarter of the
untiled decode's activations: measured peak RSS within it, the frames equal to the untiled decode's.
The full-width decode runs in a fresh process (bench.memory_worker; about a minute)."""
import pytest
import torch

import vae
from bench import models
from bench.common import run_worker
from vae.run import memory

GIB = 2**30
# (frames, height, width, budget GiB): the targets
TARGETS = [(241, 720, 1280, 6), (241, 1088, 1920, 8), (121, 2176, 3840, 12)]
PLACEMENT = dict(device="cuda", io_on_device=(False, False), opts=vae.Optimizations(kernel_choice="defaults"))


def _released(encode=torch.float32, decode=torch.bfloat16):
    model = models.meta_model("ltx2")
    return model.set_dtypes(encode=encode, decode=decode)


@pytest.mark.parametrize("frames,height,width,budget", TARGETS, ids=lambda v: str(v))
def test_the_planner_fits_the_targets_on_the_cuda_model(frames, height, width, budget):
    """Exact (never fast tiles) and predicted within the target; the whole clip at once untiled would not be."""
    model = _released()
    shape = vae.run.geometry.input_shape("decode", frames, height, width, 128, 32, 8)
    plan = vae.plan(model, "decode", shape, vae.Settings(memory_budget=budget * GIB), **PLACEMENT)
    assert plan.fits and plan.tiling == "exact" and plan.peak_bytes <= budget * GIB, plan.describe()
    whole = vae.plan(model, "decode", shape, vae.Settings(temporal_chunk=shape[2]), **PLACEMENT)
    assert whole.peak_bytes > budget * GIB, whole.describe()


def test_the_cuda_coefficients_are_the_cpus_with_the_margin():
    """No GPU has measured LTX-2: its CUDA plans rest on the CPU's coefficients times the margin."""
    assert "ltx2" not in memory._calibration().get("cuda", {})
    for mode in ("untiled", "exact", "streamed"):
        cpu = memory.coefficients("ltx2", "decode", mode, "cpu")
        assert memory.coefficients("ltx2", "decode", mode, "cuda") == {
            k: v * memory.UNCALIBRATED_MARGIN for k, v in cpu.items()}


@pytest.mark.skipif(not memory.CALIBRATION.is_file(), reason="no memory calibration")
def test_full_ltx2_decode_within_a_quarter_of_the_untiled_activations(tmp_path, monkeypatch):
    """The released decoder (fp32, random weights) on 17x256x384 frames, given the resident memory (weights,
    Winograd filter transforms) plus under a quarter of what the untiled decode's activations take
    (predicted): the planner's plan keeps the measured peak RSS within that budget, and the frames
    equal the untiled decode's (one latent frame per chunk, untiled) within 1e-5 of their range."""
    monkeypatch.setenv("STREAMVAE_KERNEL_CACHE", str(tmp_path))
    spec = dict(family="ltx2", op="decode", frames=17, height=256, width=384, kernel_choice="defaults")
    model = models.meta_model("ltx2")
    shape = tuple(models.make_input("ltx2", spec).shape)
    opts = vae.Optimizations(kernel_choice="defaults")
    untiled = vae.plan(model, "decode", shape, vae.Settings(temporal_chunk=shape[2]), device="cpu", opts=opts)
    resident = untiled.peak_bytes - untiled.work_bytes + memory.resident_cache_bytes(model, "decode", "cpu", opts)
    activations = untiled.peak_bytes - resident
    budget = int(resident + 0.24 * activations)
    result = run_worker("bench.memory_worker", dict(spec, memory_budget=budget, compare_untiled=True), timeout=900)
    assert result["fits"] and result["max_err"] <= 1e-5 * max(1.0, result["max_abs"]), result
    assert result["peak_bytes"] <= budget, (result, budget)
