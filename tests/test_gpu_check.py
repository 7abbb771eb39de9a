"""The GPU check's dry run on the CPU (tiny models), so the script CI cannot run for real does not rot:
every part it can run here runs, each row is complete, and the error columns measure something."""
import json
import subprocess
import sys

import pytest

from bench import gpu_session
from bench.core_vae import TREES
from comfy_support import environment
from tests.reference import REPO


@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_gpu_check_dry_run_writes_complete_rows(tmp_path):
    cmd = [sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--parts", "decode", "encode", "profile",
           "--families", "wan21", "--variants", "reference", "bf16", "bf16-tiles", "--repeats", "1",
           "--out", str(tmp_path), "--scratch", str(tmp_path / "scratch")]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    files = sorted(tmp_path.glob("*.jsonl"))
    assert [f.name.rsplit("-", 1)[1] for f in files] == ["decode.jsonl", "encode.jsonl"]
    for path in files:
        header, *rows = (json.loads(line) for line in path.read_text().splitlines())
        assert header["machine"]["torch"] and header["machine"]["commit"], header
        by_variant = {row["variant"]: row for row in rows}
        assert set(by_variant) == {"reference", "bf16", "bf16-tiles"}
        assert not any("error" in row for row in rows), rows
        assert all(row["finite"] and row["median_s"] > 0 for row in rows)
        # the model-FLOP rate: upstream's FLOPs of this clip over the row's time, against the row's own GEMM
        flops = {row["model_tflop"] for row in rows}
        assert len(flops) == 1 and 1e-5 < flops.pop() < 1, rows  # the tiny model's 5 frames at 64x96
        assert all(row["pct_gemm"] == pytest.approx(100 * row["tflops"] / row["gemm_bf16_tflops"]) for row in rows)
        bf16 = by_variant["bf16"]["max_err"]
        assert 1e-4 < bf16 < 0.2  # bf16 rounding, measured against the fp32 reference
        tiled = by_variant["bf16-tiles"]["max_err"]
        assert abs(tiled - bf16) < 0.5 * bf16  # exact tiles: the untiled bf16 result's error, not a seam's
    assert "| kind | GPU s | share |" in (next(tmp_path.glob("*-profile.txt"))).read_text()


@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_core_033_rows_decode_like_the_fp32_reference(tmp_path):
    """gpu_check's row for ComfyUI 0.33.0's own VAEs (Wan through its WanVAE, SeedVR2 through its native
    VAE, LTX-2 through its LTX VideoVAE, with comfy-kitchen and comfy-aimdo imported), dry-run on the CPU
    with the tiny weights (LTX-2's: a small config, random weights): core's
    decode of the same latent gives our fp32 reference's frames (a wrong weight, latent scale or layout
    is off by O(1)), and the row records core's package versions."""
    tree = TREES["0.33.0"]
    environment.require((tree.path / "comfy").is_dir() and bool(tree.sites()),
                        f"ComfyUI 0.33.0 at {tree.path} with its packages")
    cmd = [sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--parts", "decode", "--workloads",
           "wan21:5x32x32", "seedvr2:5x32x32", "ltx2:17x64x96", "--variants", "reference", "core_0.33.0", "--repeats", "1",
           "--out", str(tmp_path), "--scratch", str(tmp_path / "scratch")]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    _, *rows = (json.loads(line) for line in next(tmp_path.glob("*-decode.jsonl")).read_text().splitlines())
    core = [row for row in rows if row["variant"] == "core_0.33.0"]
    assert [row["family"] for row in core] == ["wan21", "seedvr2", "ltx2"], rows
    for row in core:
        assert "error" not in row and row["finite"], row
        assert row["max_err"] < 1e-4 * max(1.0, row["max_abs"]), row  # fp32 rounding of the same network
        assert set(row["core_packages"]) == {"comfy_kitchen", "comfy_aimdo"}, row


def test_profile_kinds_name_cudnn_layout_conversions_and_both_norm_kernels():
    """The profile's kinds (read from kernel names) tell the layout conversions NDHWC removes apart
    from the convs around them, and count both layouts' Triton norm kernels as norms."""
    from bench.gpu_profile import kind_of

    assert kind_of("void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16>") == "layout conversion"
    assert kind_of("void cudnn::ops::nhwcToNchwKernel<float>") == "layout conversion"
    assert kind_of("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_ndhwc") == "conv"
    for name in ("_gn_partial_kernel", "_gn_partial_cl_kernel", "_center_scale_act_cl_kernel", "_rms_act_cl_kernel"):
        assert kind_of(name) == "norm", name


@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_hv15_rows_and_the_core_attention_row_decode_like_core(tmp_path):
    """gpu_check's HunyuanVideo 1.5 workload, dry-run on the CPU (its tiny random-weight model): complete
    rows, the row with the attention unmasked (`core_attention`) decodes what ComfyUI 0.33.0's own
    decoder does, and StreamVAE's default (the masked attention the model was trained with) does not."""
    tree = TREES["0.33.0"]
    environment.require((tree.path / "comfy").is_dir() and bool(tree.sites()),
                        f"ComfyUI 0.33.0 at {tree.path} with its packages")
    cmd = [sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--parts", "decode", "--families", "hv15",
           "--variants", "core_0.33.0", "core_attention", "fp32", "bf16", "--reference", "core_0.33.0",
           "--repeats", "1", "--out", str(tmp_path), "--scratch", str(tmp_path / "scratch")]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    _, *rows = (json.loads(line) for line in next(tmp_path.glob("*-decode.jsonl")).read_text().splitlines())
    by_variant = {row["variant"]: row for row in rows}
    assert set(by_variant) == {"core_0.33.0", "core_attention", "fp32", "bf16"} and rows[0]["key"].startswith("hv15-")
    assert not any("error" in row for row in rows) and all(row["finite"] and row["median_s"] > 0 for row in rows), rows
    assert by_variant["core_attention"]["max_err"] < 1e-4, rows  # fp32 rounding of the same network
    assert by_variant["fp32"]["max_err"] > 2 / 255, rows  # the masked attention: visibly not core's output


@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_hv10_rows_and_the_core_frames_row_decode_like_core(tmp_path):
    """gpu_session's HunyuanVideo 1.0 part, dry-run on the CPU (its tiny random-weight model): complete rows,
    the row with core's frames (`core_frames`: norms per chunk, attention unmasked) decodes what ComfyUI
    0.33.0's own VAE does, and the default (the whole-clip network) does not."""
    tree = TREES["0.33.0"]
    environment.require((tree.path / "comfy").is_dir() and bool(tree.sites()),
                        f"ComfyUI 0.33.0 at {tree.path} with its packages")
    part = next(p for p in gpu_session.PARTS if p.name == "decode-hv10-480p")
    variants = part.args[part.args.index("--variants") + 1: part.args.index("--part-budget")]
    cmd = [sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--parts", "decode", "--workloads", "hv10:9x64x96",
           "--variants", "core_0.33.0", "core_frames", "fp32", *variants, "--reference", "core_0.33.0",
           "--repeats", "1", "--out", str(tmp_path), "--scratch", str(tmp_path / "scratch")]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    _, *rows = (json.loads(line) for line in next(tmp_path.glob("*-decode.jsonl")).read_text().splitlines())
    by_variant = {row["variant"]: row for row in rows}
    assert set(by_variant) == {"core_0.33.0", "core_frames", "fp32", *variants}, rows
    assert not any("error" in row for row in rows) and all(row["finite"] and row["median_s"] > 0 for row in rows), rows
    assert by_variant["core_frames"]["max_err"] < 1e-4, rows  # fp32 rounding of the same network
    assert by_variant["fp32"]["max_err"] > 2 / 255, rows  # whole-clip norms, masked attention: not core's frames


def test_a_part_with_a_failed_row_exits_non_zero(tmp_path):
    """A row that fails (here: a budget too short for the second row) leaves the part unrecorded by
    gpu_session, so the next window measures it again: LTX-2's core row failed to import on an H100 once."""
    cmd = [sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--parts", "decode", "--families", "wan21",
           "--variants", "reference", "bf16", "--repeats", "1", "--part-budget", "21", "--out", str(tmp_path),
           "--scratch", str(tmp_path / "scratch")]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1 and "row(s) failed or were skipped" in result.stderr, result.stderr[-2000:]
