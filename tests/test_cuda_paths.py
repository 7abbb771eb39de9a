"""The CUDA-only branches no other CPU test runs, run on the CPU with stand-ins: torch made to report GPUs
(`pretend_gpu`), a fake allocator, a tensor that says it is on cuda:1. Each asserts what the branch
decides, against what it must decide on a GPU; what only a GPU run shows is in docs/support.md.
"""
from types import SimpleNamespace

import torch

from tests.test_gpu_decisions import pretend_gpu
from vae.kernels import backend, kernel_check, kernel_choice, triton_norm
from vae.run import planning, recovery


def test_a_triton_launch_runs_on_its_tensors_gpu_not_the_current_one():
    """Triton launches on the current CUDA device: a tensor on cuda:1 is launched inside cuda:1's context."""
    on_gpu_1 = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 1))
    context = triton_norm._on_device(on_gpu_1)
    assert isinstance(context, torch.cuda.device) and context.idx == 1  # made, not entered: no CUDA needed
    assert not isinstance(triton_norm._on_device(torch.empty(1)), torch.cuda.device)


def test_an_unindexed_cuda_device_is_the_current_gpu(monkeypatch):
    """"cuda" names the current GPU (cuda:1 in a worker that set it): the same device as cuda:1 for the
    engine's placement, and the verdicts and measured kernels of cuda:1."""
    pretend_gpu(monkeypatch)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert backend.same_device("cuda", "cuda:1") and not backend.same_device("cuda", "cuda:0")
    assert kernel_check.device_name("cuda") == "cuda:1"
    seen = []
    monkeypatch.setattr(kernel_choice, "_choices_for", lambda folder, identity: seen.append(identity))
    monkeypatch.setattr(kernel_choice, "_identity_json", lambda device: device)
    kernel_choice.choices_for("cuda")
    assert seen == ["cuda:1"]


def test_kernels_are_timed_on_a_gpu_after_it_finished_its_work(monkeypatch, tmp_path):
    """A GPU runs kernels asynchronously: after every run of a measured kernel, before the clock is read
    (or the next run starts), the measurement waits for that GPU."""
    pretend_gpu(monkeypatch, name="Fake GPU for timing")
    monkeypatch.setenv(kernel_choice.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(kernel_choice, "_identity_json", kernel_choice._identity_json.__wrapped__)
    monkeypatch.setattr(backend, "driver_version", lambda: "570.0")
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(f"sync {torch.device(device)}"))
    candidates = {name: (lambda name=name: events.append(f"run {name}")) for name in ("a", "b")}
    assert kernel_choice.pick("stand-in conv", "cuda:0", candidates, "a") in candidates
    runs = [i for i, event in enumerate(events) if event.startswith("run")]
    assert len(runs) == 2 * (1 + kernel_choice.TIMED_RUNS) and all(events[i + 1] == "sync cuda:0" for i in runs), events
    kernel_choice._choices_for.cache_clear()


def test_free_gpu_memory_counts_what_torchs_cache_holds(monkeypatch):
    """A fake allocator: 3 GiB free on the device, 5 GiB reserved by torch's cache of which 2 GiB are in use;
    the plan may count on 6 GiB."""
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 * gib, 24 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 5 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * gib)
    assert planning.free_memory("cuda:0") == 6 * gib


def test_after_out_of_memory_the_gpus_cache_is_emptied(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append("cuda"))
    recovery.free_cached_memory(torch.device("cuda", 0))
    recovery.free_cached_memory(torch.device("cpu"))
    assert emptied == ["cuda"]
