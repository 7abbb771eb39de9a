"""What the node layer asks of the running ComfyUI core where core versions differ (0.3.75 and 0.33.0
tested, 0.38.1 read; the whole comparison is in docs/comfyui-compat.md). Each answer comes from the
running core where it has the feature and is core's own older behaviour where it has not; outside
ComfyUI (tools, library-level tests) the answers are ComfyUI's defaults.
"""
import dataclasses
import inspect

import torch

try:
    import comfy.model_management as mm
    from comfy_api.latest import io
except ImportError:
    mm = io = None


def advanced() -> dict:
    """The input keyword that marks an expert input, which frontends from 1.4x keep folded until "show
    advanced inputs" (0.33.0 and newer); nothing where the running core's inputs lack it (0.3.75)."""
    if io is not None and "advanced" in inspect.signature(io.Int.Input.__init__).parameters:
        return {"advanced": True}
    return {}


def schema(search_aliases: list[str], **fields):
    """`io.Schema(**fields)`, with the names the node search also finds it by where the running core
    has them (0.33.0 and newer)."""
    if "search_aliases" in {f.name for f in dataclasses.fields(io.Schema)}:
        fields["search_aliases"] = search_aliases
    return io.Schema(**fields)


def intermediate_device() -> torch.device:
    """Where core keeps IMAGE and LATENT tensors between nodes: the CPU, or the GPU with --gpu-only."""
    return mm.intermediate_device() if mm is not None else torch.device("cpu")


def intermediate_dtype() -> torch.dtype:
    """The dtype of core's VAE outputs (IMAGE and LATENT): float16 under --fp16-intermediates
    (0.33.0 and newer), else float32 (0.3.75 has neither the flag nor the function)."""
    if mm is not None and hasattr(mm, "intermediate_dtype"):
        return mm.intermediate_dtype()
    return torch.float32


def free_memory(patcher, device: torch.device) -> int | None:
    """Bytes core lets a run on `device` use, or None outside ComfyUI.

    Newer cores (0.33.0+) answer per patcher, adding what dynamic VRAM (comfy-aimdo) can take back
    from other models' weights; core's own VAEs size their batches by that. Older ones only have the
    device-wide number."""
    if mm is None:
        return None
    if patcher is not None and hasattr(patcher, "get_free_memory"):
        return int(patcher.get_free_memory(device))
    return int(mm.get_free_memory(device))
