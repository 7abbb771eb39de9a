"""Checkpoint reading, family detection and strict loading.

Checkpoints are read with safetensors, or with `torch.load(weights_only=True)` for .pth/.ckpt files,
so no code stored in a checkpoint ever runs. The family is detected from the key names alone; the
model is built on the meta device from a config derived from the tensor shapes (plus overrides from
the caller or from the file's `streamvae_config` metadata) and the weights are then assigned
strictly: a missing, unexpected or mis-shaped key is an error that names it.
"""
import json
import os
import pickle
from collections.abc import Mapping

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .model import VideoVAE
from .seedvr2 import SeedVR2VAE
from .wan21 import Wan21VAE
from .wan22 import Wan22VAE

FAMILIES: list[type[VideoVAE]] = [SeedVR2VAE, Wan21VAE, Wan22VAE]

CONFIG_METADATA_KEY = "streamvae_config"
SAFETENSORS_SUFFIXES = (".safetensors", ".sft")
PICKLE_SUFFIXES = (".pth", ".pt", ".ckpt", ".bin")
# Wrappers some trainers put around a state dict, and key prefixes some exporters add.
_NESTED_KEYS = ("state_dict", "model", "module", "ema")
_KEY_PREFIXES = ("first_stage_model.", "vae.", "model.", "module.")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message says why and what to do."""


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and safetensors metadata of a checkpoint file, on the CPU, in their stored dtype."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.lower().endswith(PICKLE_SUFFIXES):
        return _read_pickle(path), {}
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as err:
        if path.lower().endswith(SAFETENSORS_SUFFIXES):
            raise CheckpointError(
                f"{path} is not a readable safetensors file ({err}); it may be truncated or corrupt: "
                "download it again") from err
        return _read_pickle(path), {}


def _read_pickle(path: str) -> dict[str, torch.Tensor]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"{path} holds Python objects besides tensors, and StreamVAE never unpickles code from a "
            f"checkpoint ({err}). Convert it to .safetensors with a tool you trust.") from err
    except (RuntimeError, EOFError) as err:
        raise CheckpointError(f"{path} could not be read as a PyTorch checkpoint ({err}); it may be truncated or corrupt") from err
    while isinstance(obj, Mapping) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
        inner = next((obj[k] for k in _NESTED_KEYS if isinstance(obj.get(k), Mapping)), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{path} does not contain a state dict (found {type(obj).__name__})")
    return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def save_checkpoint(state_dict: Mapping[str, torch.Tensor], path: str | os.PathLike, config: Mapping | None = None) -> None:
    """Write a safetensors checkpoint; `config` (e.g. {"norm_num_groups": 8}) goes into its metadata."""
    metadata = {CONFIG_METADATA_KEY: json.dumps(dict(config))} if config else None
    save_file({k: v.contiguous() for k, v in state_dict.items()}, os.fspath(path), metadata=metadata)


def _strip_prefix(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    for prefix in _KEY_PREFIXES:
        if sd and all(k.startswith(prefix) for k in sd):
            return {k[len(prefix):]: v for k, v in sd.items()}
    return sd


def detect_family(state_dict: Mapping[str, torch.Tensor]) -> tuple[type[VideoVAE], dict[str, torch.Tensor]]:
    """The family class whose layout the keys match, and the state dict in that family's key names."""
    sd = _strip_prefix(dict(state_dict))
    for cls in FAMILIES:
        native = cls.native_state_dict(sd)
        if native is not None:
            return cls, native
    tried = "; ".join(f"{cls.family}: missing {', '.join(k for k in cls.probe_keys if k not in sd)}" for cls in FAMILIES)
    sample = ", ".join(sorted(sd)[:5])
    raise CheckpointError(
        f"not a video VAE checkpoint StreamVAE knows ({len(sd)} tensors, e.g. {sample}). Families tried: {tried}. "
        "Pick a SeedVR2 (ema_vae_fp16.safetensors), Wan2.1 (wan_2.1_vae.safetensors) or Wan2.2 (wan2.2_vae.safetensors) VAE file.")


def _check_layout(expected: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor], family: str) -> None:
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    mismatched = [f"{k} {tuple(given[k].shape)} (expected {tuple(expected[k].shape)})"
                  for k in sorted(set(expected) & set(given)) if tuple(expected[k].shape) != tuple(given[k].shape)]
    problems = []
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched)):
        if keys:
            shown = ", ".join(keys[:8]) + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")
            problems.append(f"{label}: {shown}")
    if problems:
        raise CheckpointError(f"checkpoint does not match the {family} VAE layout; " + "; ".join(problems))


def load(
    source: str | os.PathLike | Mapping[str, torch.Tensor],
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    encode_dtype: torch.dtype | None = None,
    decode_dtype: torch.dtype | None = None,
    config: Mapping | None = None,
) -> VideoVAE:
    """Build the VAE a checkpoint (path or state dict) describes, with its weights, ready for inference.

    `dtype` is the compute dtype of the weights, whatever the file stores (fp32, bf16, fp16 or fp8);
    `encode_dtype` / `decode_dtype` override it for one half. `config` overrides config fields that
    the tensor shapes cannot tell (SeedVR2's `norm_num_groups`).
    """
    if isinstance(source, Mapping):
        state_dict, metadata = dict(source), {}
    else:
        state_dict, metadata = read_checkpoint(source)
    overrides = json.loads(metadata[CONFIG_METADATA_KEY]) if CONFIG_METADATA_KEY in metadata else {}
    overrides.update(config or {})
    cls, state_dict = detect_family(state_dict)
    cfg = cls.config_from_state_dict(state_dict, overrides)
    with torch.device("meta"):
        model = cls(cfg)
    _check_layout(model.state_dict(), state_dict, cls.family)
    model.load_state_dict({k: v.to(dtype) for k, v in state_dict.items()}, strict=True, assign=True)
    model.set_dtypes(encode=encode_dtype, decode=decode_dtype)
    return model.to(device).eval().requires_grad_(False)
