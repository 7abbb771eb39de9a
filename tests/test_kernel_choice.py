"""Kernel choice by measurement: the choice logic with candidates whose speed the test controls, the
on-disk cache and what invalidates it, failing candidates, and every candidate kernel exact against
the straightforward conv."""
import json
import logging
import time

import pytest
import torch
import torch.nn.functional as F

import vae
import vae.kernels.conv as conv
import vae.kernels.kernel_choice as kernel_choice
from vae.kernels import Optimizations
from vae.kernels.kernel_choice import KernelChoices
from vae.kernels.activation_layout import FORMATS, layout_of
from vae.kernels.filter_cache import FilterCache, filter_cache
from tests.reference import assert_exact, load_tiny

MACHINE = {"cpu": "test CPU", "flags": ["avx2"], "torch": "2.13.0", "pack": "0.1.0+abc"}


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    """An empty kernel cache for this test, and identities computed afresh (torch.__version__ may be patched)."""
    monkeypatch.setenv(kernel_choice.CACHE_ENV, str(tmp_path))
    kernel_choice._identity_json.cache_clear()
    yield tmp_path
    kernel_choice._identity_json.cache_clear()


def sleeper(seconds: float, calls: list, name: str):
    def run():
        calls.append(name)
        time.sleep(seconds)
    return run


def test_the_slower_candidate_is_not_chosen(tmp_path):
    calls = []
    choices = KernelChoices(tmp_path / "k.json", MACHINE)
    fast_other = {"default": sleeper(0.03, calls, "default"), "other": sleeper(0.0, calls, "other")}
    assert choices.choose("a", fast_other, "default") == "other"
    slow_other = {"default": sleeper(0.0, calls, "default"), "other": sleeper(0.03, calls, "other")}
    assert choices.choose("b", slow_other, "default") == "default"
    # each candidate: one warm-up run and the timed runs
    assert calls.count("other") == 2 * (1 + kernel_choice.TIMED_RUNS)


def test_a_tie_keeps_the_default(tmp_path):
    choices = KernelChoices(tmp_path / "k.json", MACHINE)
    same = {"default": sleeper(0.01, [], "default"), "other": sleeper(0.0099, [], "other")}
    assert choices.choose("a", same, "default") == "default"


def test_a_cached_choice_is_reused_without_measuring(tmp_path):
    path = tmp_path / "k.json"
    first = KernelChoices(path, MACHINE)
    assert first.choose("a", {"default": sleeper(0.03, [], "d"), "other": sleeper(0.0, [], "o")}, "default") == "other"
    stored = json.loads(path.read_text())
    assert stored["machine"] == MACHINE and stored["choices"]["a"]["choice"] == "other"

    calls = []
    again = KernelChoices(path, MACHINE)  # a new process on the same machine
    assert again.choose("a", {"default": sleeper(0, calls, "d"), "other": sleeper(0, calls, "o")}, "default") == "other"
    assert calls == [] and again.summary()["reused"] == 1 and again.summary()["measured"] == 0


def test_a_choice_another_live_process_measured_is_used(tmp_path):
    """A ComfyUI server and a script share the file, both already running: what the server measures
    after the script read the file is used by the script, not measured again (and maybe chosen
    otherwise under load, which would make the two runs' results differ by rounding)."""
    path = tmp_path / "k.json"
    script, server = KernelChoices(path, MACHINE), KernelChoices(path, MACHINE)
    assert server.choose("a", {"default": sleeper(0.03, [], "d"), "other": sleeper(0.0, [], "o")}, "default") == "other"
    calls = []
    assert script.choose("a", {"default": sleeper(0, calls, "d"), "other": sleeper(0.03, calls, "o")}, "default") == "other"
    assert calls == [] and script.summary()["reused"] == 1


def test_another_machine_identity_ignores_the_file(tmp_path):
    path = tmp_path / "k.json"
    KernelChoices(path, MACHINE).choose("a", {"default": sleeper(0.03, [], "d"), "other": sleeper(0, [], "o")}, "default")
    calls = []
    other = KernelChoices(path, {**MACHINE, "torch": "2.14.0"})
    other.choose("a", {"default": sleeper(0, calls, "d"), "other": sleeper(0.03, calls, "o")}, "default")
    assert "d" in calls and "o" in calls


@pytest.mark.parametrize("change", ["torch", "pack"])
def test_a_torch_or_pack_version_change_invalidates_the_cache(cache_folder, monkeypatch, change):
    """The file a machine's choices live in is named by its identity: a new torch or pack measures afresh."""
    before = kernel_choice.choices_for("cpu")
    before.choose("k", {"default": sleeper(0.03, [], "d"), "other": sleeper(0, [], "o")}, "default")
    assert kernel_choice.choices_for("cpu").cached("k") == "other"
    if change == "torch":
        monkeypatch.setattr(torch, "__version__", torch.__version__ + ".patched")
    else:
        monkeypatch.setattr(kernel_choice, "pack_version", lambda: "99.0+0000000000")
    kernel_choice._identity_json.cache_clear()
    after = kernel_choice.choices_for("cpu")
    assert after is not before and after.path != before.path and after.cached("k") is None
    assert len(list(cache_folder.glob("kernels-*.json"))) == 1  # the new identity has stored nothing yet


def test_machine_identity_names_the_cpu_torch_and_pack():
    identity = kernel_choice.machine_identity("cpu")
    assert identity["torch"] == torch.__version__ and identity["pack"].startswith(kernel_choice.pack_version().split("+")[0])
    assert identity["cpu"] and identity["capability"] == torch.backends.cpu.get_cpu_capability()


def test_a_failing_candidate_is_skipped(tmp_path, caplog):
    def broken():
        raise RuntimeError("no such kernel here")

    choices = KernelChoices(tmp_path / "k.json", MACHINE)
    with caplog.at_level(logging.WARNING, logger="streamvae"):
        assert choices.choose("a", {"default": sleeper(0.02, [], "d"), "broken": broken}, "default") == "default"
    assert "kernel broken failed" in caplog.text and "no such kernel here" in caplog.text
    # the default itself failing: the fastest that works; nothing works: the default (it will raise itself)
    assert choices.choose("b", {"default": broken, "other": sleeper(0.02, [], "o")}, "default") == "other"
    assert choices.choose("c", {"default": broken, "other": broken}, "default") == "default"


def test_an_unwritable_cache_keeps_choices_in_memory(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    choices = KernelChoices(blocker / "k.json", MACHINE)  # a folder that cannot be created
    with caplog.at_level(logging.WARNING, logger="streamvae"):
        assert choices.choose("a", {"default": sleeper(0.02, [], "d"), "other": sleeper(0, [], "o")}, "default") == "other"
    assert "cannot store kernel choices" in caplog.text and choices.path is None and choices.cached("a") == "other"


def test_the_setting_is_checked(cache_folder):
    with pytest.raises(ValueError, match="kernel_choice"):
        Optimizations(kernel_choice="fastest")
    assert Optimizations().kernel_choice == "measure"
    assert Optimizations.straightforward().kernel_choice == "defaults"


def test_the_plan_says_how_kernels_are_chosen(cache_folder):
    """The plan carries the setting and, when measuring, how many layer shapes this machine has on record."""
    model = load_tiny("wan21")
    shape = (1, model.latent_channels, 2, 8, 8)
    before = vae.plan(model, "decode", shape)
    assert before.kernel_choice == "measure" and before.kernels_on_record == 0
    kernel_choice.choices_for("cpu").choose("k", {"onednn": sleeper(0, [], "o")}, "onednn")
    after = vae.plan(model, "decode", shape)
    assert after.kernels_on_record == 1 and "1 shape(s) on record" in after.describe()
    fixed = vae.plan(model, "decode", shape, opts=Optimizations(kernel_choice="defaults"))
    assert fixed.kernels_on_record is None and "fixed default kernels" in fixed.describe()


# --- the candidates are exact --------------------------------------------------------------------

def layer(cin, cout, kt, t, h, w, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, cin, t, h, w, generator=g)
    weight = torch.randn(cout, cin, kt, 3, 3, generator=g) / (cin * kt * 9) ** 0.5
    return x, weight, torch.randn(cout, generator=g)


@pytest.mark.parametrize("shape, padding", [((128, 128, 3, 4, 18, 20), (0, 1, 1)), ((96, 160, 3, 3, 17, 9), (0, 0, 0)),
                                            ((128, 144, 1, 2, 16, 16), (0, 1, 1))], ids=["same", "valid", "kt1"])
@pytest.mark.parametrize("layout", ["ncdhw", "ndhwc"])
def test_every_cpu_candidate_equals_the_straightforward_conv(shape, padding, layout):
    """oneDNN direct, Winograd with the MKL and the oneDNN GEMM route, in either activation layout: each
    within the Winograd tests' tolerance of F.conv3d (float32 rounding of 96-160 channel sums), in the
    layout of its input."""
    x, weight, bias = layer(*shape)
    expected = F.conv3d(x, weight, bias, 1, padding)
    x = x.contiguous(memory_format=FORMATS[layout])
    with torch.inference_mode():
        candidates, default = conv.conv_candidates(x, weight, bias, (1, 1, 1), padding, winograd=filter_cache())
        assert set(candidates) == {"onednn", "winograd_mkl", "winograd_onednn"} and default == "winograd_mkl"
        for name, run in candidates.items():
            out = run(x)
            assert layout_of(out) == layout, name
            assert_exact(out, expected, atol=5e-5, rtol=0, msg=name)


@pytest.mark.parametrize("layout", ["ncdhw", "ndhwc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_large_cpu_weight_runs_in_slices_of_output_channels_with_the_whole_result(monkeypatch, layout, dtype):
    """A weight above conv.CPU_WEIGHT_SLICE_BYTES (here lowered to 16 output channels' worth) runs as
    slices of output channels (oneDNN's per-call weight copy is then a slice's size): three calls for
    40 channels, the output in the input's layout, equal to the whole conv (each channel is the same
    sum)."""
    x, weight, bias = (t.to(dtype) for t in layer(64, 40, 3, 4, 9, 7))
    x = x.contiguous(memory_format=FORMATS[layout])
    with torch.inference_mode():
        whole = conv._cpu_direct(x, weight, bias, (1, 1, 1), (0, 1, 1))
        monkeypatch.setattr(conv, "CPU_WEIGHT_SLICE_BYTES", weight[0].numel() * 4 * 16)
        calls = []
        run_whole = conv._cpu_direct_whole
        monkeypatch.setattr(conv, "_cpu_direct_whole", lambda *args: calls.append(args[1].shape[0]) or run_whole(*args))
        sliced = conv._cpu_direct(x, weight, bias, (1, 1, 1), (0, 1, 1))
    assert calls == [16, 16, 8] and layout_of(sliced) == layout
    assert_exact(sliced, whole, atol=1e-6 if dtype == torch.float32 else 1e-2)


def test_ineligible_convs_have_one_candidate_and_are_never_measured(cache_folder):
    x, weight, bias = layer(32, 32, 3, 4, 16, 16)  # too few channels for Winograd
    candidates, default = conv.conv_candidates(x, weight, bias, (1, 1, 1), (0, 1, 1), winograd=filter_cache())
    assert list(candidates) == ["onednn"] and default == "onednn"
    with torch.inference_mode():
        conv.conv3d(x, weight, bias, (1, 1, 1), (0, 1, 1), winograd=filter_cache(), kernels="measure")
    assert kernel_choice.choices_for("cpu").summary()["shapes"] == 0


def test_measured_dispatch_runs_the_choice_once_measured(cache_folder, monkeypatch):
    """conv3d with kernels="measure" asks once per layer shape (not per frame count) and runs the
    candidate the cache names."""
    x, weight, bias = layer(128, 128, 3, 5, 16, 16)
    asked = []
    real_pick = kernel_choice.pick

    def pick(key, device, candidates, default):
        asked.append(key)
        return real_pick(key, device, candidates, default)

    monkeypatch.setattr(kernel_choice, "pick", pick)
    with torch.inference_mode():
        out = conv.conv3d(x, weight, bias, (1, 1, 1), (0, 1, 1), winograd=filter_cache(), kernels="measure")
        conv.conv3d(x[:, :, :3], weight, bias, (1, 1, 1), (0, 1, 1), winograd=filter_cache(), kernels="measure")
        choice = kernel_choice.choices_for("cpu").cached(asked[0])
        candidates, _ = conv.conv_candidates(x, weight, bias, (1, 1, 1), (0, 1, 1), winograd=filter_cache())
        assert torch.equal(out, candidates[choice](x))
    assert len(set(asked)) == 1 and kernel_choice.choices_for("cpu").summary()["measured"] == 1


@pytest.mark.parametrize("winner", ["winograd", "direct"])
def test_a_measured_loser_s_filter_transform_is_not_kept(cache_folder, monkeypatch, winner):
    """Measuring computes the Winograd filter transform; it stays in the cache only where Winograd won
    (what vae.run.memory counts as resident follows the same record)."""
    x, weight, bias = layer(128, 128, 3, 5, 16, 16)
    real_pick = kernel_choice.pick

    def pick(key, device, candidates, default):
        real_pick(key, device, candidates, default)  # every candidate ran: the transform was computed
        choice = next(name for name in candidates if name.startswith("winograd") == (winner == "winograd"))
        kernel_choice.choices_for(device)._choices[key]["choice"] = choice
        return choice

    monkeypatch.setattr(kernel_choice, "pick", pick)
    cache = FilterCache(1 << 30)
    with torch.inference_mode():
        conv.conv3d(x, weight, bias, (1, 1, 1), (0, 1, 1), winograd=cache, kernels="measure")
    assert cache.holds(weight) == (winner == "winograd")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU candidates run on CUDA only")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_gpu_candidate_equals_the_default(dtype):
    x, weight, bias = (t.cuda().to(dtype) for t in layer(64, 64, 3, 4, 32, 32))
    candidates, default = conv.conv_candidates(x, weight, bias, (1, 1, 1), (0, 1, 1), winograd=filter_cache())
    assert default == "torch" and "channels_last_3d" in candidates
    expected = F.conv3d(x.double(), weight.double(), bias.double(), 1, (0, 1, 1))
    for name, run in candidates.items():
        assert_exact(run(x).double(), expected, atol=2e-2, rtol=2e-2, msg=name)


@pytest.mark.parametrize("triton_delay, torch_delay, expected", [(0.03, 0.0, "torch"), (0.0, 0.03, "triton")])
def test_the_norm_takes_triton_only_where_it_measured_faster(cache_folder, monkeypatch, triton_delay, torch_delay,
                                                              expected):
    """The Triton-or-torch decision of the fused norms, on the CPU: a stand-in for the Triton kernel
    (the known result after a controlled delay) with `_use_triton` answering yes, and the torch path
    slowed by a controlled delay; the real kernels are compared with torch's in tests/test_triton_kernels.py."""
    from vae.kernels import norm_act

    triton_calls = []
    x, gamma = torch.randn(1, 8, 3, 4, 4), torch.rand(8, 1, 1, 1) + 0.5
    results = {n: norm_act.rms_norm_act(x[:, :, :n], gamma) for n in (1, 3)}

    def fake_triton_rms(x, gamma, eps, act, out):
        triton_calls.append(1)
        time.sleep(triton_delay)
        return out.copy_(results[x.shape[2]])

    vector_norm = torch.linalg.vector_norm

    def slow_vector_norm(*args, **kwargs):
        time.sleep(torch_delay)
        return vector_norm(*args, **kwargs)

    monkeypatch.setattr(norm_act, "_use_triton", lambda x, enabled, kernel: enabled)
    monkeypatch.setattr(norm_act.triton_norm, "rms_norm_act", fake_triton_rms)
    monkeypatch.setattr(torch.linalg, "vector_norm", slow_vector_norm)
    out = norm_act.rms_norm_act(x, gamma, triton=True, kernels="measure")
    assert_exact(out, results[3], atol=1e-6, rtol=1e-6)
    key, = kernel_choice.choices_for("cpu")._choices
    assert kernel_choice.choices_for("cpu").cached(key) == expected and "(1, 8, 4, 4)" in key
    measured = len(triton_calls)
    norm_act.rms_norm_act(x[:, :, :1], gamma, triton=True, kernels="measure")  # another frame count: same choice
    assert len(triton_calls) == measured + (expected == "triton")
