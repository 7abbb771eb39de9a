"""A run's kernel log (vae/kernels/kernel_log.py) says what that run ran: every conv it counts is
one the dispatcher saw (an independent observer: a TorchDispatchMode), every norm one the layers
called; a second run with every shape on record still reports its own calls; a layer shape measured
during the run is said. (With the Triton kernels, in the interpreter: tests/test_kernel_check.py.)"""
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vae
import vae.model.layers
from bench.models import random_state_dict
from tests.reference import load_tiny
from tests.test_kernel_choice import layer
from tests.test_layout import CONVS
from vae.kernels import KernelLog, conv, conv_check, kernel_choice
from vae.kernels.filter_cache import filter_cache


class ConvCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.convs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.convs += func._schema.name in CONVS
        return func(*args, **(kwargs or {}))


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_choice.CACHE_ENV, str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("layout_name", ["ncdhw", "ndhwc"])
def test_each_run_reports_the_convs_and_norms_it_ran(cache_folder, monkeypatch, layout_name):
    model = load_tiny("wan21")
    z = torch.randn(1, model.latent_channels, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    norms = []
    rms_norm_act = vae.model.layers.rms_norm_act
    monkeypatch.setattr(vae.model.layers, "rms_norm_act", lambda *a, **k: norms.append(1) or rms_norm_act(*a, **k))
    opts = vae.Optimizations(activation_layout=layout_name)  # measured kernels (none to measure here)
    settings = vae.Settings(temporal_chunk=1, tile_size=2 * model.spatial_factor)
    conv_check.failure("cpu", torch.float32)  # the NDHWC convs' first-use check, decided before convs are counted
    logs = []
    for _ in range(2):  # the second run: every layer shape on record, nothing measured
        log = KernelLog(kernel_choice.choices_for("cpu"))
        with ConvCount() as seen:
            vae.decode(model, z, settings, opts=opts, kernel_log=log)
        logs.append(log)
        calls = {(op, impl): n for (op, impl, layout), n in log.calls.items() if layout == layout_name}
        assert sum(log.calls.values()) == sum(calls.values())  # every call in the run's layout
        assert calls.get(("conv3d", "onednn")) == seen.convs > 20  # tiles: many convs per chunk
        assert calls.get(("rms_norm", "torch")) == len(norms) > 0
        norms.clear()
    assert logs[0].calls == logs[1].calls  # the second run counted its own calls only
    text = logs[1].describe("measure")
    assert text == (f"kernels: measured per layer shape: conv3d onednn {seen.convs}; "
                    f"RMS norm torch {logs[1].calls['rms_norm', 'torch', layout_name]} ({layout_name.upper()})")


def test_the_log_names_the_kernel_each_conv_took_and_what_the_run_measured(cache_folder):
    """A Winograd-eligible conv: measured in this run (its candidates timed once), named by its choice."""
    x, weight, bias = layer(128, 128, 3, 4, 16, 16)
    log = KernelLog(kernel_choice.choices_for("cpu"))
    with torch.inference_mode():
        conv.conv3d(x, weight, bias, (1, 1, 1), (0, 1, 1), winograd=filter_cache(), kernels="measure", log=log)
        conv.conv3d(x, weight, bias, (1, 1, 1), (0, 1, 1), winograd=filter_cache(), kernels="defaults", log=log)
    (measured_key,) = kernel_choice.choices_for("cpu")._choices
    chosen = kernel_choice.choices_for("cpu").cached(measured_key)
    assert log.calls == ({("conv3d", chosen, "ncdhw"): 1, ("conv3d", "winograd_mkl", "ncdhw"): 1}
                         if chosen != "winograd_mkl" else {("conv3d", chosen, "ncdhw"): 2})
    assert "(1 measured in this run, " in log.describe("measure")
    assert log.describe("defaults").startswith("kernels: defaults (fixed by the kernel_choice setting): conv3d ")


def test_an_empty_log_says_so():
    assert KernelLog().ran() == "no conv or norm ran through the pack's kernels"


def planned_and_ran(device: str, dtype: torch.dtype, opts: vae.Optimizations):
    """(plan, {op: kernels the run's log names}) of a decode of 2 latent frames of 8x8 by a Wan2.1 of 96
    channels (its decoder's 3x3x3 convs Winograd-eligible) with random weights."""
    config = vae.Wan21Config(dim=96, dim_mult=(1, 1), num_res_blocks=1, temperal_downsample=(False,))
    with torch.device("meta"):
        meta = vae.Wan21VAE(config)
    model = vae.load(random_state_dict(meta), config=dataclasses.asdict(config), device=device, dtype=dtype)
    z = torch.randn(1, 16, 2, 8, 8, generator=torch.Generator().manual_seed(0)).to(device)
    plan = vae.plan(model, "decode", z.shape, opts=opts)
    log = KernelLog()
    vae.decode(model, z, plan, opts=opts, kernel_log=log)
    return plan, {op: {impl for (logged, impl, _) in log.calls if logged == op} for op, _, _ in log.calls}


def test_the_plan_names_every_kernel_its_run_takes(cache_folder):
    """`Plan.kernels` (decided before the run, `run.kernel_plan`) against the run's log (what ran): every
    conv and norm kernel a decode took is one its plan named, with Winograd on and off and with measured
    kernels; and a plan that names Winograd is not an empty claim (a conv of 96 channels on 8x8 latent
    frames takes it)."""
    taken = {}
    for name, opts in {"defaults": vae.Optimizations(kernel_choice="defaults"),
                       "no winograd": vae.Optimizations(kernel_choice="defaults", winograd_conv=False),
                       "measure": vae.Optimizations()}.items():
        plan, ran = planned_and_ran("cpu", torch.float32, opts)
        assert ran["conv3d"] <= set(plan.kernels.conv), (name, ran, plan.kernels)
        assert ran["rms_norm"] <= set(plan.kernels.norm), (name, ran, plan.kernels)
        assert plan.kernels.attention == ((96, "auto"),)  # the mid-block's one head; PyTorch's pick on a CPU
        taken[name] = (plan.kernels.conv, ran["conv3d"])
    assert taken["defaults"] == (("onednn", "winograd_mkl"), {"onednn", "winograd_mkl"})
    assert taken["no winograd"] == (("onednn",), {"onednn"})
    assert len(taken["measure"][0]) > 2  # every GEMM route a candidate


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kernels", ["defaults", "measure"])
def test_on_the_gpu_the_plan_names_every_kernel_its_run_takes(cache_folder, kernels):
    """The same on CUDA in bf16, both layouts: cuDNN as torch calls it or directly, the Triton norms."""
    for layout in ("ncdhw", "ndhwc"):
        plan, ran = planned_and_ran("cuda", torch.bfloat16, vae.Optimizations(kernel_choice=kernels, activation_layout=layout))
        assert ran["conv3d"] <= set(plan.kernels.conv) and ran["rms_norm"] <= set(plan.kernels.norm), (ran, plan.kernels)
