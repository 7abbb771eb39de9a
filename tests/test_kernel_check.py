"""The first-use check of the Triton norm kernels (vae/kernels/kernel_check.py).

In Triton's interpreter on the CPU (a subprocess: the interpreter is chosen when Triton is first
imported), where the check runs on CPU tensors as it runs on a GPU: every kernel in both layouts and
two dtypes agrees with torch, on the small inputs and on an input with the production tiles (512
channels); the verdicts are kept in the kernel record and read back without running a kernel. Injected
failures (a kernel that raises, a kernel that returns wrong values, a C compiler that is missing) fail
that kernel's check only, with one warning naming the kernels, the device and the error, and the
norms then compute that step with torch, the other kernels still with Triton. Without a GPU or the
interpreter nothing is checked; the keying by GPU driver and Triton version is tested by making torch
report a GPU.
"""
import json
import logging
import time
import warnings

import pytest
import torch

from tests.test_gpu_decisions import pretend_gpu
from vae.kernels import kernel_check, kernel_choice, norm_act, triton_norm

triton = pytest.importorskip("triton", reason="Triton is not installed (requirements-dev.txt installs it)")
from tests.test_triton_kernels import interpreted  # noqa: E402 (needs Triton)

# The @triton.jit kernels behind each (kernel, layout) of kernel_check.KERNELS.
JIT = {("group_norm_stats", "ncdhw"): "_gn_partial_kernel", ("group_norm_stats", "ndhwc"): "_gn_partial_cl_kernel",
       ("group_norm_apply", "ncdhw"): "_center_scale_act_kernel",
       ("group_norm_apply", "ndhwc"): "_center_scale_act_cl_kernel",
       ("rms_norm", "ncdhw"): "_rms_act_kernel", ("rms_norm", "ndhwc"): "_rms_act_cl_kernel"}

COMMON = f"""
    import json, os, tempfile, warnings
    import torch
    from vae.kernels import kernel_check, kernel_choice, norm_act, triton_norm

    JIT = {JIT!r}

    class Launch:
        '''Stands in for a @triton.jit kernel (kernel[grid](*args, **meta)): calls `before` first, then the
        real kernel with `meta` overriding its compile-time arguments.'''

        def __init__(self, real, before=None, **meta):
            self.real, self.before, self.meta, self.calls = real, before, meta, 0

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                self.calls += 1
                if self.before is not None:
                    self.before()
                return self.real[grid](*args, **{{**kwargs, **self.meta}})
            return launch

    def fresh_record():
        '''A new process as far as verdicts go: an empty kernel record, nothing decided.'''
        os.environ["STREAMVAE_KERNEL_CACHE"] = tempfile.mkdtemp()
        kernel_check.verdicts.cache_clear()

    def checked(dtype):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = kernel_check.verdicts("cpu", dtype)
        return ({{f"{{k}} {{l}}": v.error for (k, l), v in found.items()}}, sorted({{v.how for v in found.values()}}),
                [str(w.message) for w in caught])
"""

# Production tiles in the interpreter: 512 channels make the channels-last tiles 8 pixels x 512 channels
# (statistics: 128 of them per program), and 1040 pixels make two statistics blocks per frame, the second
# partial; the grid is smaller than a 1080p frame's (test_the_large_input_launches_a_1080p_grid).
ALL_PASS = COMMON + """
    kernel_check.LARGE = ((1, 512, 1, 8, 130), 32)
    fresh_record()
    result = {str(dtype): checked(dtype) for dtype in (torch.float32, torch.bfloat16)}
    kernel_check.verdicts.cache_clear()  # a new process on the same machine: every kernel would raise now
    for name in set(JIT.values()):
        setattr(triton_norm, name, Launch(getattr(triton_norm, name), before=lambda: 1 / 0))
    result["again"] = checked(torch.float32)
    print(json.dumps(result))
"""


@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_every_kernel_passes_in_both_layouts_and_dtypes_and_is_checked_once():
    result = json.loads(interpreted(ALL_PASS))
    for dtype in ("torch.float32", "torch.bfloat16"):
        errors, how, warned = result[dtype]
        assert set(errors) == {f"{k} {l}" for k, l in JIT} and not any(errors.values()), errors
        assert how[0].startswith("checked in") and not warned
    errors, how, warned = result["again"]
    assert not any(errors.values()) and how == ["on record"] and not warned


def test_the_large_input_launches_a_1080p_grid():
    """The GPU check's large input: the channels-last tiles of 8 pixels x 512 channels and more than 65535
    pixel blocks on grid axis 0 (axis 1 would refuse them), as a 1080p frame at 512 channels launches."""
    (b, c, t, h, w), groups = kernel_check.LARGE
    grid, pixels, channels = triton_norm.channels_last_launch((b, c, t, h, w))
    assert (pixels, channels) == (8, 512) and grid[0] > 65535 and grid[1] == b * t
    assert grid[0] * pixels >= h * w and c % groups == 0


INJECTED = COMMON + """
    import uuid
    import triton.runtime.build as build

    kernel_check.LARGE = ((1, 512, 1, 2, 20), 32)
    real = {name: getattr(triton_norm, name) for name in set(JIT.values())}

    def raises():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def missing_compiler():  # what a GPU launch meets when it builds its launcher (the same call, a source
        # never built before): no CC, no gcc or clang
        find = getattr(build, "_find_compiler", None)  # Triton 3.5+ remembers the compiler it found
        if find is not None:
            find.cache_clear()
        build.compile_module_from_src(f"/* {uuid.uuid4()} */ int launcher;", "launcher")

    scenarios = {
        "raises": {JIT["rms_norm", "ndhwc"]: Launch(real[JIT["rms_norm", "ndhwc"]], raises)},
        "wrong": {JIT["group_norm_apply", "ncdhw"]: Launch(real[JIT["group_norm_apply", "ncdhw"]], ACT=False)},
        "no_compiler": {name: Launch(kernel, missing_compiler) for name, kernel in real.items()},
    }
    result = {}
    path = os.environ["PATH"]
    for scenario, kernels in scenarios.items():
        fresh_record()
        for name, kernel in {**real, **kernels}.items():
            setattr(triton_norm, name, kernel)
        if scenario == "no_compiler":
            os.environ.pop("CC", None)
            os.environ["PATH"] = tempfile.mkdtemp()
        result[scenario] = checked(torch.float32)
        os.environ["PATH"] = path
        record = kernel_choice.choices_for("cpu")
        result[scenario] += (sum(1 for k in JIT if record.check(kernel_check._record_key(*k, torch.float32))),)

    # After "no_compiler" every kernel failed: the norms run torch's ops. Now only the channels-last RMS
    # kernel raises: NDHWC RMS norms take torch's op, NCDHW ones and both GroupNorm steps the kernels.
    fresh_record()
    counted = {name: Launch(kernel) for name, kernel in real.items()}
    for name, kernel in {**counted, JIT["rms_norm", "ndhwc"]: Launch(real[JIT["rms_norm", "ndhwc"]], raises)}.items():
        setattr(triton_norm, name, kernel)
    checked(torch.float32)
    for kernel in counted.values():
        kernel.calls = 0
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    for fmt in (torch.contiguous_format, torch.channels_last_3d):
        x = (torch.randn(1, 16, 2, 5, 6, generator=g) * 2 + 1).contiguous(memory_format=fmt)
        gamma, weight, bias = torch.rand(16, 1, 1, 1, generator=g) + 0.5, torch.randn(16, generator=g), torch.randn(16, generator=g)
        worst = max(worst, (norm_act.rms_norm_act(x, gamma, triton=True) - norm_act.rms_norm_act(x, gamma)).abs().max().item(),
                    (norm_act.group_norm_act(x, 4, weight, bias, 1e-6, triton=True)
                     - norm_act.group_norm_act(x, 4, weight, bias, 1e-6)).abs().max().item())
    result["calls"] = {name: kernel.calls for name, kernel in counted.items()}
    result["worst"] = worst
    print(json.dumps(result))
"""


@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_injected_failures_fall_back_for_that_kernel_only_with_one_warning():
    result = json.loads(interpreted(INJECTED))

    errors, _, warned, kept = result["raises"]
    assert [k for k, e in errors.items() if e] == ["rms_norm ndhwc"] and "illegal memory access" in errors["rms_norm ndhwc"]
    assert len(warned) == 1 and all(s in warned[0] for s in ("rms_norm NDHWC", "on cpu", "illegal memory access"))
    assert kept == 6  # the failure is on record too: the next process does not run the kernel again

    errors, _, warned, _ = result["wrong"]
    assert [k for k, e in errors.items() if e] == ["group_norm_apply ncdhw"] and "disagree" in errors["group_norm_apply ncdhw"]
    assert len(warned) == 1 and "group_norm_apply NCDHW" in warned[0]

    errors, _, warned, _ = result["no_compiler"]
    assert all(e and "Failed to find C compiler" in e for e in errors.values()), errors
    assert len(warned) == 1 and all(f"{k} {l.upper()}" in warned[0] for k, l in JIT), warned  # one warning, every kernel

    calls = result["calls"]
    assert calls[JIT["rms_norm", "ndhwc"]] == 0 and calls[JIT["rms_norm", "ncdhw"]] == 1
    assert all(calls[JIT[step, layout]] == 1 for step in ("group_norm_stats", "group_norm_apply") for layout in ("ncdhw", "ndhwc"))
    assert result["worst"] < 1e-4  # kernels and torch's ops: the same norms


def test_nothing_is_checked_without_a_gpu_or_the_interpreter(monkeypatch):
    monkeypatch.setattr(kernel_check, "_check", lambda *args: pytest.fail("checked on a CPU"))
    x = torch.randn(1, 8, 2, 4, 4)
    assert not kernel_check.usable(x, "rms_norm") and not kernel_check.runs_triton("cpu")
    torch.testing.assert_close(norm_act.rms_norm_act(x, torch.ones(8, 1, 1, 1), triton=True),
                               norm_act.rms_norm_act(x, torch.ones(8, 1, 1, 1)))
    assert kernel_check.summary("cpu", torch.float32).startswith("Triton norm kernels: not used on cpu")


def test_a_verdict_is_kept_per_gpu_driver_and_triton_version(monkeypatch, tmp_path, caplog):
    """On record per machine identity (GPU, driver, CUDA, cuDNN, torch, pack) and, in the key, Triton's
    version: an upgrade of either checks again; a failure on record is warned about once per process."""
    pretend_gpu(monkeypatch, major=9, name="Fake H100")
    monkeypatch.setenv(kernel_choice.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(kernel_choice, "_identity_json", kernel_choice._identity_json.__wrapped__)
    checks = []

    def check(device, dtype, which):
        checks.append((str(device), list(which)))
        return {("rms_norm", "ndhwc"): "RuntimeError: no kernel image is available"}, set()

    monkeypatch.setattr(kernel_check, "_check", check)
    driver = {"version": "570.124.06"}
    monkeypatch.setattr(kernel_check.backend, "driver_version", lambda: driver["version"])
    monkeypatch.setattr(kernel_check.backend, "triton_version", lambda: "3.6.0")

    def decide():
        kernel_check.verdicts.cache_clear()
        kernel_choice._choices_for.cache_clear()
        return kernel_check.verdicts("cuda:0", torch.bfloat16)

    with caplog.at_level(logging.WARNING, logger="streamvae"), pytest.warns(RuntimeWarning, match="rms_norm NDHWC"):
        found = decide()
    assert checks == [("cuda:0", list(JIT))] and not found["rms_norm", "ndhwc"].passed
    assert sum(v.passed for v in found.values()) == 5
    assert kernel_choice.machine_identity("cuda:0")["driver"] == "570.124.06"
    with pytest.warns(RuntimeWarning, match="no kernel image"):
        again = decide()  # the same machine: read back, warned again in this new "process"
    assert len(checks) == 1 and {v.how for v in again.values()} == {"on record"}
    assert kernel_check.verdicts("cuda:0", torch.bfloat16) is again  # decided once per process
    driver["version"] = "580.65.06"
    with pytest.warns(RuntimeWarning):
        decide()
    assert len(checks) == 2  # a new driver: checked again
    monkeypatch.setattr(kernel_check.backend, "triton_version", lambda: "3.7.0")
    with pytest.warns(RuntimeWarning):
        decide()
    assert len(checks) == 3  # a new Triton: checked again
    kernel_check.verdicts.cache_clear()
    kernel_choice._choices_for.cache_clear()


# A Wan2.1 decode on the CPU with the Triton kernels (interpreted) while the channels-last RMS kernel
# raises: the NCDHW run takes the kernel, the NDHWC run torch's op for that step; both give torch's
# decode, and the run's kernel log says which ran.
MODEL_RUN = COMMON + """
    import vae
    from vae.kernels import KernelLog
    from tests.reference import load_tiny

    kernel_check.LARGE = ((1, 512, 1, 2, 20), 32)
    fresh_record()
    name = JIT["rms_norm", "ndhwc"]
    setattr(triton_norm, name, Launch(getattr(triton_norm, name), before=lambda: 1 / 0))
    model = load_tiny("wan21")
    z = torch.randn(1, model.latent_channels, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    result = {}
    for layout in ("ncdhw", "ndhwc"):
        log = KernelLog()
        opts = vae.Optimizations(kernel_choice="defaults", activation_layout=layout)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = vae.decode(model, z, opts=opts, kernel_log=log)
        reference = vae.decode(model, z, opts=opts.with_(triton_norm=False))
        result[layout] = [(y - reference).abs().max().item(), log.describe("defaults"), [str(w.message) for w in caught]]
    print(json.dumps(result))
"""


@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_a_model_runs_the_kernels_that_passed_and_torch_for_the_one_that_failed():
    result = json.loads(interpreted(MODEL_RUN))
    worst, ran, warned = result["ncdhw"]
    assert worst < 1e-4 and "RMS norm triton" in ran and ran.endswith("(NCDHW)")
    assert len(warned) == 1 and "rms_norm NDHWC" in warned[0] and "ZeroDivisionError" in warned[0]
    worst, ran, warned = result["ndhwc"]
    assert worst < 1e-4 and "RMS norm torch" in ran and "triton" not in ran and ran.endswith("(NDHWC)")
    assert not warned  # warned once, when the device was checked


@pytest.mark.parametrize("where", ["large", "small"])
def test_a_check_that_does_not_fit_in_memory_is_not_kept(monkeypatch, tmp_path, where):
    """Out of memory on the large input: the verdict rests on the small ones (passed) and is not kept;
    on a small one: the kernel is not used in this process, and that is not kept either."""
    monkeypatch.setenv(kernel_choice.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(kernel_check, "LARGE", ((1, 16, 1, 3, 4), 4))
    large = kernel_check.LARGE[0]

    def check(x, groups, out, generator):
        if (tuple(x.shape) == large) == (where == "large"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return 0.0

    monkeypatch.setattr(kernel_check, "CHECKS", {kernel: check for kernel in kernel_check.KERNELS})
    kernel_check.verdicts.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the small inputs' failure is warned about
        found = kernel_check.verdicts("cpu", torch.float32)
    kernel_check.verdicts.cache_clear()
    assert all(v.passed == (where == "large") and "out of memory" in v.how for v in found.values())
    record = kernel_choice.choices_for("cpu")
    assert not any(record.check(kernel_check._record_key(k, l, torch.float32)) for k, l in JIT)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_every_kernel_passes_its_check_on_cuda_at_production_size(monkeypatch, tmp_path):
    """The check as a first decode runs it: the production LARGE input (>65535 pixel blocks on axis 0),
    fp32 and bf16, both layouts; then from the record. The time is printed (unmeasured elsewhere)."""
    monkeypatch.setenv(kernel_choice.CACHE_ENV, str(tmp_path))
    kernel_check.verdicts.cache_clear()
    device = kernel_check.device_name("cuda")
    for dtype in (torch.float32, torch.bfloat16):
        start = time.perf_counter()
        found = kernel_check.verdicts(device, dtype)
        spent = time.perf_counter() - start
        print(f"first-use check on {device} in {dtype}: {spent:.2f} s (compiles included)")
        failed = {v.name(): (v.error, v.how) for v in found.values() if not v.passed or "out of memory" in v.how}
        assert not failed, failed
    kernel_check.verdicts.cache_clear()
    assert {v.how for v in kernel_check.verdicts(device, torch.bfloat16).values()} == {"on record"}
    kernel_check.verdicts.cache_clear()
