"""Out-of-memory faults injected into StreamVAE runs, for the tests and the soak run (bench/soak.py).

Test-only: production code knows nothing of it. A ComfyUI server started by the test harness with
STREAMVAE_FAULTS set gets it from stubs/sitecustomize.py, which calls `install()`: the library's
engine module is then wrapped as it is imported, so every `encode`/`decode` runs under `injected`.

STREAMVAE_FAULTS names a JSON file, e.g. {"op": "decode", "oom_at_call": 40, "times": 1}. At the start
of the next encode/decode of that op the file is read and deleted (one shot), and the run raises
`torch.OutOfMemoryError` at the `oom_at_call`-th forward call of a leaf module of the model, then at
each of the following calls until it has raised `times` times, so the engine's out-of-memory
recovery runs on a machine that has memory to spare. The test writes the file before it queues the
prompt.
"""
import contextlib
import functools
import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys

import torch

ENV = "STREAMVAE_FAULTS"
log = logging.getLogger("streamvae")


def _take(op: str) -> dict | None:
    """The pending fault spec for `op`, removed from disk; None when there is none."""
    path = os.environ.get(ENV)
    if not path or not os.path.isfile(path):
        return None
    with open(path) as file:
        spec = json.load(file)
    if spec.get("op", op) != op:
        return None
    os.remove(path)
    return spec


@contextlib.contextmanager
def injected(model: torch.nn.Module, op: str):
    """Raise the pending out-of-memory fault for `op` inside `model`'s forward calls, if any."""
    spec = _take(op)
    if spec is None:
        yield
        return
    at, times = int(spec.get("oom_at_call", 1)), int(spec.get("times", 1))
    state = {"calls": 0, "raised": 0}

    def hook(module, args):
        state["calls"] += 1
        if state["calls"] >= at and state["raised"] < times:
            state["raised"] += 1
            log.warning("StreamVAE: injected out-of-memory error %d of %d (%s)", state["raised"], times, ENV)
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected by {ENV} for testing)")

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if next(m.children(), None) is None]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def wrap_engine(engine) -> None:
    """Run the engine module's `encode` and `decode` under `injected`."""
    for op in ("encode", "decode"):
        run = getattr(engine, op)

        @functools.wraps(run)
        def with_faults(model, *args, _run=run, _op=op, **kwargs):
            with injected(model, _op):
                return _run(model, *args, **kwargs)

        setattr(engine, op, with_faults)


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        wrap_engine(module)


class _EngineFinder(importlib.abc.MetaPathFinder):
    """Finds the library's engine (`vae.run.engine`, or `<pack>.vae.run.engine` inside ComfyUI) as the path
    finder would and wraps it once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "vae.run.engine" and not name.endswith(".vae.run.engine"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    sys.meta_path.insert(0, _EngineFinder())
