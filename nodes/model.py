"""The STREAMVAE object that flows from Load VAE to Encode/Decode: the library model, the devices and
dtypes it runs with, the two settings nodes' choices, and the ComfyUI ModelPatcher that lets
ComfyUI's memory manager load it, evict it, and evict other models for it.
"""
import logging
from dataclasses import dataclass, fields

import torch
import torch.nn as nn

from .. import vae
from ..optimizations import BackendFlags, CompileSettings, Optimizations, compile_blocks
from ..optimizations import backend

try:  # ComfyUI services; the pack imports without them (e.g. in tools), it just cannot be managed
    import comfy.model_management as mm
    import comfy.model_patcher as model_patcher
except ImportError:
    mm = model_patcher = None

log = logging.getLogger("streamvae")

DTYPE_CHOICES = ("auto", "fp32", "bf16", "fp16")
DEVICE_CHOICES = ("auto", "gpu", "cpu")
OFFLOAD_CHOICES = ("auto", "cpu", "none")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


@dataclass(frozen=True)
class GpuOptions:
    """The GPU Optimizations node's choices: process-wide backend flags plus model-level switches."""

    flags: BackendFlags
    channels_last_3d: bool = False
    fused_norm_silu: bool = True
    cuda_graphs: bool = False


class PatchedVAE(nn.Module):
    """What ComfyUI's ModelPatcher manages: the VideoVAE, plus the writable `device` attribute the
    patcher keeps up to date (VideoVAE.device is a read-only property derived from the weights)."""

    def __init__(self, model: nn.Module, device: torch.device):
        super().__init__()
        self.vae = model
        self.device = device


# --- devices and dtypes ----------------------------------------------------------------------------

def resolve_device(choice: str) -> torch.device:
    if choice == "cpu":
        return torch.device("cpu")
    if mm is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return mm.get_torch_device() if choice == "gpu" else mm.vae_device()


def resolve_offload(choice: str, load_device: torch.device) -> torch.device:
    if choice == "none":
        return load_device
    if choice == "cpu" or mm is None:
        return torch.device("cpu")
    return mm.vae_offload_device()


def resolve_dtype(choice: str, device: torch.device, half: str) -> torch.dtype:
    """"auto": decode in bf16 where the device supports it (near-lossless), encode in fp32 (bf16
    encode hurts image-to-video); ComfyUI's --fp32-vae/--bf16-vae/--fp16-vae flags win over both."""
    if choice != "auto":
        return _DTYPES[choice]
    if mm is None:
        return torch.float32
    allowed = [torch.bfloat16, torch.float32] if half == "decode" else [torch.float32]
    return mm.vae_dtype(device, allowed)


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


# --- the handle ------------------------------------------------------------------------------------

class StreamVAEHandle:
    """A loaded StreamVAE model and how to run it (the STREAMVAE value of the node graph)."""

    def __init__(self, model, name: str, load_device: torch.device, offload_device: torch.device,
                 compile_settings: CompileSettings | None = None, gpu: GpuOptions | None = None):
        self.model = model
        self.name = name
        self.load_device = torch.device(load_device)
        self.offload_device = torch.device(offload_device)
        self.compile_settings = compile_settings
        self.gpu = gpu
        self.notes: list[str] = []
        self._apply_gpu_options()
        self.compile_report = None
        if compile_settings is not None:
            self.compile_report = compile_blocks(model, compile_settings, device=self.load_device)
        self.patcher = None
        if model_patcher is not None:
            self.patcher = model_patcher.ModelPatcher(PatchedVAE(model, self.offload_device),
                                                      load_device=self.load_device, offload_device=self.offload_device)

    @classmethod
    def load(cls, path: str, name: str, encode_dtype="auto", decode_dtype="auto", device="auto",
             offload_device="auto", compile_settings=None, gpu=None) -> "StreamVAEHandle":
        load_device = resolve_device(device)
        offload = resolve_offload(offload_device, load_device)
        enc, dec = resolve_dtype(encode_dtype, load_device, "encode"), resolve_dtype(decode_dtype, load_device, "decode")
        # ComfyUI runs nodes under torch.inference_mode(); weights made there would be inference
        # tensors, which have no version counter for the library's weight-derived caches.
        with torch.inference_mode(False):
            model = vae.load(path, device=offload, dtype=dec, encode_dtype=enc, decode_dtype=dec)
        handle = cls(model, name, load_device, offload, compile_settings, gpu)
        if device == "gpu" and load_device.type == "cpu":
            handle.warn("device gpu: ComfyUI has no GPU here (CPU-only machine or --cpu), running on the CPU")
        log.info("StreamVAE: loaded %s", handle.describe())
        return handle

    # -- what it is ------------------------------------------------------------------------------
    @property
    def family(self) -> str:
        return self.model.family

    @property
    def latent_channels(self) -> int:
        return self.model.latent_channels

    @property
    def spatial_factor(self) -> int:
        return self.model.spatial_factor

    @property
    def temporal_factor(self) -> int:
        return self.model.temporal_factor

    @property
    def compile_status(self) -> str:
        """"eager", "compiled N blocks" or "eager (fallback: why)"; a fallback can happen at the first run."""
        return self.compile_report.status if self.compile_report is not None else "eager"

    @property
    def backend_flags(self) -> BackendFlags | None:
        return self.gpu.flags if self.gpu is not None else None

    def describe(self) -> str:
        parts = [f"{self.name}: {self.family}", f"{self.latent_channels} latent channels",
                 f"encode {dtype_name(self.model.encode_dtype)} / decode {dtype_name(self.model.decode_dtype)}",
                 f"on {self.load_device} (offload {self.offload_device})", f"compile: {self.compile_status}"]
        return ", ".join(parts + self.notes)

    def info(self) -> dict:
        """JSON-ready summary for the node's UI message."""
        return {"name": self.name, "family": self.family, "latent_channels": self.latent_channels,
                "spatial_factor": self.spatial_factor, "encode_dtype": dtype_name(self.model.encode_dtype),
                "decode_dtype": dtype_name(self.model.decode_dtype), "device": str(self.load_device),
                "offload_device": str(self.offload_device), "compile": self.compile_status, "notes": self.notes}

    # -- settings nodes ----------------------------------------------------------------------------
    def warn(self, note: str) -> None:
        """A setting that could not be honoured: shown on the node and logged; the run goes on."""
        self.notes.append(note)
        log.warning("StreamVAE %s: %s", self.name, note)

    def _apply_gpu_options(self) -> None:
        gpu = self.gpu
        if gpu is None:
            return
        cuda = self.load_device.type == "cuda"
        switches = {f.name for f in fields(Optimizations)}
        changes = {"fused_norm_act": gpu.fused_norm_silu}
        if "cuda_graphs" in switches:
            changes["cuda_graphs"] = gpu.cuda_graphs and cuda
        elif gpu.cuda_graphs:
            self.warn("CUDA graphs: not available in this StreamVAE build")
        if gpu.cuda_graphs and not cuda and "cuda_graphs" in switches:
            self.warn(f"cuda_graphs: CUDA only, not applied on {self.load_device.type}")
        self.model.opts = self.model.opts.with_(**changes)
        if gpu.channels_last_3d and cuda:
            backend.to_channels_last_3d(self.model)
        elif gpu.channels_last_3d:
            self.warn(f"channels_last_3d: CUDA only, not applied on {self.load_device.type}")
        flags = gpu.flags
        if not cuda and (flags.cudnn_benchmark or flags.attention not in ("auto", "math")):
            self.warn(f"cudnn_benchmark / attention_backend: GPU switches, no effect on {self.load_device.type}")
        if gpu.flags.conv3d_workaround and backend.conv3d_regression_affected():
            self.notes.append("PyTorch 2.9 cuDNN conv3d regression detected: workaround on")  # info, not a warning

    # -- memory ----------------------------------------------------------------------------------
    def prepare(self, memory_required: int) -> None:
        """Put the weights on the compute device, asking ComfyUI to free `memory_required` bytes for
        the work itself (it unloads other models first, and may unload this one later)."""
        with torch.inference_mode(False):  # moved weights stay normal tensors (see `load`)
            if self.patcher is not None and mm is not None:
                mm.load_models_gpu([self.patcher], memory_required=max(0, int(memory_required)), force_full_load=True)
            else:
                self.model.to(self.load_device)
