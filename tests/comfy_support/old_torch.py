"""Run the pack as on torch 2.4-2.8: hide every torch API it touches that is newer than 2.4.

ComfyUI users run torch 2.4 to the newest, and only the newest CPU wheel exists here, so the suite
proves the older range by hiding what the newer releases added (each entry: where it lives, the
release that added it, and what the pack does without it). With STREAMVAE_EMULATE_OLD_TORCH=1 the
tests' conftest applies this before the pack is imported, and the ComfyUI server the tests start
applies it at interpreter start-up (stubs/sitecustomize.py), so node code runs under it too.
"""
import os

ENV = "STREAMVAE_EMULATE_OLD_TORCH"

# (owner, attribute, torch release that added it, the pack's fallback). Only what torch 2.13 itself
# runs without: torch.OutOfMemoryError (2.5) and SDPBackend.CUDNN_ATTENTION (2.5) are used inside
# torch, so they cannot be hidden here; the pack reaches them through getattr with a fallback
# (vae/kernels/backend.OOM, vae/kernels/attention._kernel_context).
HIDDEN = [
    ("torch.backends.cudnn.CudnnModule", "conv", "2.9", "TF32 through the legacy allow_tf32 flags"),
    ("torch.backends.cuda.cuBLASModule", "fp32_precision", "2.9", "TF32 through the legacy allow_tf32 flags"),
    ("torch.serialization", "get_unsafe_globals_in_checkpoint", "2.5",
     "pickled checkpoints are loaded with weights_only=True only (the refusal names no imports)"),
]


def active() -> bool:
    return os.environ.get(ENV) == "1"


def hide_newer_torch() -> list[str]:
    """Remove the HIDDEN attributes from this process's torch; returns what was hidden."""
    import importlib

    import torch  # noqa: F401  (the owners below are reached through it)

    hidden = []
    for owner_path, name, added, _ in HIDDEN:
        try:
            owner = importlib.import_module(owner_path)
        except ImportError:  # a class inside a module
            module_path, _, cls_name = owner_path.rpartition(".")
            owner = getattr(importlib.import_module(module_path), cls_name)
        if name == "fp32_precision":  # answered by cuBLASModule.__getattr__, not an attribute
            _refuse_in_getattr(owner, name)
            hidden.append(f"{owner_path}.{name} ({added})")
        elif hasattr(owner, name):
            delattr(owner, name)
            hidden.append(f"{owner_path}.{name} ({added})")
    return hidden


def _refuse_in_getattr(cls, name: str) -> None:
    original = cls.__getattr__

    def __getattr__(self, attr):
        if attr == name:
            raise AttributeError(f"{attr} (hidden: emulating torch before 2.9)")
        return original(self, attr)

    cls.__getattr__ = __getattr__
