"""Fault injection for tests and the soak run (bench/soak.py); inert unless STREAMVAE_FAULTS is set.

STREAMVAE_FAULTS names a JSON file, e.g. {"op": "decode", "oom_at_call": 40, "times": 1}. At the start
of the next encode/decode of that op the file is read and deleted (one shot), and the run raises
`torch.OutOfMemoryError` at the `oom_at_call`-th forward call of a leaf module of the model, then at
each of the following calls until it has raised `times` times, so the engine's out-of-memory
recovery runs on a machine that has memory to spare. The server process must be started with the
variable set; the file is written by the test before it queues the prompt.
"""
import contextlib
import json
import logging
import os

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
