"""What ran in one encode or decode: which implementation each conv and norm call took, counted.

A run report must say what that run did, not what the process measured at some point (a run whose
layer shapes were all on record read "nothing run yet"). The caller of `vae.encode` / `vae.decode`
passes a `KernelLog` (`kernel_log=`); the engine gives it to the run's `RunContext`, whose convs
(`conv.conv3d`) and norms (norm_act.py) each add one call with the implementation they ran; the
caller then reads `describe`. Calls inside a block torch.compile traces are not counted (inductor
generates its own kernels there; the run report says whether blocks were compiled).
"""
from collections import Counter

import torch

from .activation_layout import layout_of

# How the report names each op.
OPS = {"conv3d": "conv3d", "group_norm_stats": "group norm statistics", "group_norm_apply": "group norm apply",
       "rms_norm": "RMS norm"}


class KernelLog:
    """The calls of one run, by (op, implementation, layout); `choices` (a kernel_choice.KernelChoices,
    optional) lets `describe` say how many layer shapes the run measured."""

    def __init__(self, choices=None):
        self.calls: Counter = Counter()
        self._choices = choices
        self._before = choices.summary() if choices is not None else None

    def add(self, op: str, implementation: str, x: torch.Tensor) -> None:
        """One call of `op` (a key of OPS) by `implementation` ("onednn", "triton", ...) on x."""
        if not torch.compiler.is_compiling():
            self.calls[op, implementation, layout_of(x)] += 1

    def ran(self) -> str:
        """e.g. "conv3d onednn 96, winograd_mkl 24; group norm statistics triton 24 (NDHWC)": calls per op
        and implementation, with the layout once where every call had the same one."""
        if not self.calls:
            return "no conv or norm ran through the pack's kernels"
        layouts = {layout for _, _, layout in self.calls}
        by_op: dict[str, list[str]] = {}
        for (op, implementation, layout), count in sorted(self.calls.items(), key=lambda item: list(OPS).index(item[0][0])):
            name = implementation if len(layouts) == 1 else f"{implementation} {layout.upper()}"
            by_op.setdefault(OPS[op], []).append(f"{name} {count}")
        text = "; ".join(f"{op} {', '.join(parts)}" for op, parts in by_op.items())
        return f"{text} ({next(iter(layouts)).upper()})" if len(layouts) == 1 else text

    def describe(self, mode: str) -> str:
        """The run report's line for the `kernel_choice` `mode`, e.g. "kernels: measured per layer shape (2
        measured in this run, 1.3 s): conv3d onednn 96; RMS norm torch 40 (NCDHW)"."""
        if mode == "defaults":
            return f"kernels: defaults (fixed by the kernel_choice setting): {self.ran()}"
        tuned = ""
        if self._choices is not None:
            after = self._choices.summary()
            new = after["measured"] - self._before["measured"]
            if new:
                tuned = f" ({new} measured in this run, {after['tuning_s'] - self._before['tuning_s']:.1f} s)"
        return f"kernels: measured per layer shape{tuned}: {self.ran()}"
