"""What a checkpoint is without loading it: `inspect_checkpoint` reads only a safetensors header
(names, shapes, config metadata) and builds the model on the meta device, so the loader's validation
and the web extension's plan preview know the family and shapes of a multi-GB checkpoint without
reading its weights.
"""
import os
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..vae import loading


@dataclass
class CheckpointInfo:
    family: str
    latent_channels: int
    spatial_factor: int
    stored_dtype: str
    model: torch.nn.Module  # on the meta device: shapes and config only


def file_identity(path: str) -> tuple[str, int, int, int, int] | None:
    """(absolute path, size, modification time in ns, device, inode): what tells a file replaced under
    the same name from the one seen before, whether written over in place (size or time) or renamed over
    it with the same size and time (a copy that kept them: the inode); Load VAE's fingerprint and the
    look-up cache. None for a missing file."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return os.path.abspath(path), stat.st_size, stat.st_mtime_ns, stat.st_dev, stat.st_ino


def inspect_checkpoint(path: str) -> CheckpointInfo:
    """Family and a meta-device model of a checkpoint without reading its weights: the safetensors
    header, or a pickle's structure (cached by `file_identity`). Raises `vae.CheckpointError` with what
    to do for a file StreamVAE cannot use."""
    identity = file_identity(path)
    if identity is None:
        raise loading.CheckpointError(f"checkpoint not found: {path}")
    return _inspect(*identity)


@lru_cache(maxsize=16)
def _inspect(path: str, size: int, mtime: int, device: int, inode: int) -> CheckpointInfo:
    state, metadata = loading.read_shapes(path)
    model, _ = loading.build_empty(state, metadata)
    stored = "/".join(sorted({str(t.dtype).removeprefix("torch.") for t in state.values()}))
    return CheckpointInfo(model.family, model.latent_channels, model.spatial_factor, stored, model)
