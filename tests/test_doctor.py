"""`python -m vae doctor` (vae/doctor.py): what it says is what a run does. The layout it names per
dtype is the one a run's convs read; the kernel record it names is the file a measured run writes; the
memory calibration's source is what `memory.coefficients` returns; on a GPU (torch made to report
one, the Triton check's result injected) it names the GPU, its driver and the failed kernel."""
import torch

import vae
from tests.reference import load_tiny
from tests.test_gpu_decisions import pretend_gpu
from tests.test_layout import ConvLayouts
from vae import doctor
from vae.run import memory
from vae.__main__ import main
from vae.kernels import conv, conv_check, kernel_check, kernel_choice

LABELS = ("StreamVAE:", "device:", "versions:", "kernel record:", "convolutions:", "norms in ", "activation layout in ",
          "memory model on ")


def test_the_command_prints_every_section(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_choice.CACHE_ENV, str(tmp_path))
    main(["doctor", "--dtype", "fp32", "--dtype", "bf16"])
    out = capsys.readouterr().out
    assert "paste all of this into a bug report" in out
    assert all(label in out for label in LABELS), out
    assert f"torch {torch.__version__}" in out and "norms in bf16: the pack's torch kernels; Triton" in out


def test_the_layout_and_the_record_it_names_are_the_runs(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_choice.CACHE_ENV, str(tmp_path))
    lines = doctor.report("cpu", [torch.float32, torch.bfloat16])
    model = load_tiny("seedvr2")
    z = torch.randn(1, model.latent_channels, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        with ConvLayouts() as probe:
            vae.decode(model.to(dtype=dtype), z.to(dtype))
        ndhwc = all(inp for inp, _ in probe.seen)
        assert probe.seen and (ndhwc or not any(inp for inp, _ in probe.seen))
        said = next(line for line in lines if line.startswith(f"activation layout in {name}: "))
        assert said.split(": ", 1)[1].startswith("NDHWC" if ndhwc else "NCDHW"), said
    # the CPU's rule is channels-last in every precision, on every CPU class, unless its convs fail there
    assert name == "bf16" and ndhwc == (conv_check.failure("cpu", torch.bfloat16) is None)
    record = next(line for line in lines if line.startswith("kernel record: "))
    assert str(kernel_choice.choices_for("cpu").path) in record
    x = torch.randn(1, 128, 4, 16, 16)
    with torch.inference_mode():  # a Winograd-eligible conv: measured and written to that file
        conv.conv3d(x, torch.randn(128, 128, 3, 3, 3) / 100, None, (1, 1, 1), (0, 1, 1),
                    winograd=conv.FilterCache(1 << 30), kernels="measure")
    assert [str(p) for p in tmp_path.glob("kernels-*.json")] == [str(kernel_choice.choices_for("cpu").path)]
    assert "1 layer shape(s) timed" in doctor.report("cpu", [torch.float32])[3]


def test_the_memory_calibration_source_is_what_the_model_uses():
    table = memory.calibration()
    for device_type in ("cpu", "cuda", "mps"):
        for family, ops in table["cpu"].items():
            for op, modes in ops.items():
                for mode in modes:
                    if mode == "caches":
                        continue
                    got = memory.coefficients(family, op, mode, device_type)
                    cpu = {k: v for k, v in table["cpu"][family][op][mode].items() if k != "source"}
                    source = memory.calibration_source(family, op, mode, device_type)
                    if source == "derived":
                        assert got == {k: v * memory.UNCALIBRATED_MARGIN for k, v in cpu.items()}
                    else:
                        own = table[device_type][family][op][mode]
                        assert got == {k: v for k, v in own.items() if k != "source"}
                        named = {"cpu": "the CPU's", "meta": "meta-device count"}
                        assert source == named.get(own.get("source"), "measured")
    assert "derived" in memory.calibration_summary("mps") and "measured" in memory.calibration_summary("cpu")


def test_on_a_gpu_it_names_the_gpu_the_driver_and_a_failed_kernel(monkeypatch, tmp_path):
    pretend_gpu(monkeypatch, major=9, name="Fake H100")
    monkeypatch.setenv(kernel_choice.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(kernel_choice, "_identity_json", kernel_choice._identity_json.__wrapped__)
    monkeypatch.setattr(kernel_check.backend, "driver_version", lambda: "570.124.06")
    monkeypatch.setattr(kernel_check.backend, "conv3d_regression_affected", lambda: True)
    monkeypatch.setattr(kernel_check, "runs_triton", lambda device: True)
    monkeypatch.setattr(kernel_check, "_check", lambda device, dtype, which:
                        ({("rms_norm", "ndhwc"): "RuntimeError: no kernel image"} if dtype == torch.bfloat16 else {}, set()))
    monkeypatch.setattr(conv_check, "_check", lambda device, dtype:
                        (None if dtype == torch.bfloat16 else "RuntimeError: CUDNN_STATUS_NOT_SUPPORTED", True))
    kernel_check.verdicts.cache_clear()
    conv_check.verdict.cache_clear()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lines = doctor.report("cuda:0", [torch.bfloat16, torch.float32])
    kernel_check.verdicts.cache_clear()
    conv_check.verdict.cache_clear()
    text = "\n".join(lines)
    assert "Fake H100" in text and "GPU driver 570.124.06" in text
    assert "cuDNN through F.conv3d" in text and "regression is present: half precision cuDNN called directly" in text
    norms = {line.split(":", 1)[0]: line for line in lines if line.startswith("norms in ")}
    assert "5 of 6 passed" in norms["norms in bf16"] and "rms_norm NDHWC failed (RuntimeError: no kernel image)" in norms["norms in bf16"]
    assert "6 of 6 passed" in norms["norms in fp32"]
    assert "activation layout in bf16: NDHWC, or NCDHW for a model whose convs run faster so" in text
    assert ("activation layout in fp32: NCDHW (NDHWC convs failed their first-use check here: RuntimeError: "
            "CUDNN_STATUS_NOT_SUPPORTED)") in text
    assert "memory model on cuda: " in text and "measured" in text


def test_a_failing_doctor_costs_the_run_report_its_lines_not_the_run(monkeypatch):
    """What a node's run report carries (`doctor.for_run`): the run's layout and memory mode; a failure
    to gather the lines leaves one line saying why instead of failing the finished run."""
    model = load_tiny("wan21")
    plan = vae.plan(model, "decode", (1, model.latent_channels, 2, 4, 4), vae.Settings(tile_size=16))
    lines = doctor.for_run("cpu", torch.float32, vae.Optimizations(), model, plan)
    assert lines == doctor.report("cpu", [torch.float32], model=model, plan=plan)
    assert lines[-1] == "memory model on cpu: wan21 decode exact: measured"

    def broken(*args, **kwargs):
        raise OSError("cannot read /proc/cpuinfo")

    monkeypatch.setattr(doctor, "report", broken)
    assert doctor.for_run("cpu", torch.float32, vae.Optimizations(), model, plan) == [
        "doctor: unavailable (OSError: cannot read /proc/cpuinfo)"]
