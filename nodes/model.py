"""The STREAMVAE object that flows from Load VAE to Encode/Decode: the library model, the devices and
dtypes it runs with, the two settings nodes' choices, and the ComfyUI ModelPatcher that lets
ComfyUI's memory manager load it, evict it, and evict other models for it.
"""
import logging
from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import vae
from ..vae import CompileSettings, compile_blocks, families
from ..vae.kernels import BackendFlags, Optimizations, attention, backend, kernel_choice
from ..vae.kernels.backend import DTYPES, dtype_name

try:  # ComfyUI services; the pack imports without them (e.g. in tools), it just cannot be managed
    import comfy.model_management as mm
    import comfy.model_patcher as model_patcher
except ImportError:
    mm = model_patcher = None

log = logging.getLogger("streamvae")

DTYPE_CHOICES = ("auto", *DTYPES)
DEVICE_CHOICES = ("auto", "gpu", "cpu")
OFFLOAD_CHOICES = ("auto", "cpu", "none")
KERNEL_CHOICES = kernel_choice.MODES  # Optimizations.kernel_choice


@dataclass(frozen=True)
class GpuOptions:
    """The GPU Optimizations node's choices, whose input defaults are these defaults: Load VAE without
    the node runs with `GpuOptions()`. `cudnn_benchmark` and `tf32` are process-wide torch switches
    (set around each run, then restored); the others are per model or per run."""

    cudnn_benchmark: bool = False
    tf32: bool = True
    channels_last_3d: bool = False
    fused_norm_silu: bool = True
    attention: str = "auto"
    conv3d_workaround: bool = True

    @property
    def flags(self) -> BackendFlags:
        return BackendFlags(cudnn_benchmark=self.cudnn_benchmark, tf32=self.tf32)


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
    """"auto": `vae.kernels.backend.auto_dtype` (decode in bf16 where the device computes it natively, which
    is near-lossless; encode in fp32, as bf16 encode hurts image-to-video). ComfyUI's
    --fp32-vae/--bf16-vae/--fp16-vae flags win over both."""
    if choice != "auto":
        return DTYPES[choice]
    forced = _comfy_vae_dtype_flag()
    return forced if forced is not None else backend.auto_dtype(device, half)


def _comfy_vae_dtype_flag() -> torch.dtype | None:
    """The VAE precision forced on ComfyUI's command line, if any."""
    args = getattr(mm, "args", None)
    for flag, dtype in (("fp16_vae", torch.float16), ("bf16_vae", torch.bfloat16), ("fp32_vae", torch.float32)):
        if getattr(args, flag, False):
            return dtype
    return None


# --- the handle ------------------------------------------------------------------------------------

class StreamVAEHandle:
    """A loaded StreamVAE model and how to run it (the STREAMVAE value of the node graph)."""

    def __init__(self, model, name: str, load_device: torch.device, offload_device: torch.device,
                 compile_settings: CompileSettings | None = None, gpu: GpuOptions | None = None, devices=None,
                 kernels: str = "measure"):
        self.model = model
        self.devices = devices  # a multi_device.DeviceSet: run on worker processes, one per device
        self.workers = None  # their vae.distributed.workers.RankWorkers, started by the first run
        self.name = name
        self.load_device = torch.device(load_device)
        self.offload_device = torch.device(offload_device)
        self.compile_settings = compile_settings
        self.gpu = gpu if gpu is not None else GpuOptions()  # the node's defaults when it is unconnected
        # The kernels every run of this handle uses (GPU Optimizations may change them).
        self.opts = Optimizations(kernel_choice=kernels)
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
             offload_device="auto", kernels="measure", compile_settings=None, gpu=None,
             devices=None, config: dict | None = None) -> "StreamVAEHandle":
        """`config`: the family's load choices (`FamilySpec.load_choices`), e.g. {"attention": "full"} or
        {"noise_seed": 7}; a choice away from its default is shown on the node."""
        load_device = resolve_device(device)
        offload = resolve_offload(offload_device, load_device)
        enc, dec = resolve_dtype(encode_dtype, load_device, "encode"), resolve_dtype(decode_dtype, load_device, "decode")
        # ComfyUI runs nodes under torch.inference_mode(); weights made there would be inference
        # tensors, which have no version counter for the library's weight-derived caches.
        with torch.inference_mode(False):
            model = vae.load(path, device=offload, dtype=dec, encode_dtype=enc, decode_dtype=dec, config=config or None)
        handle = cls(model, name, load_device, offload, compile_settings, gpu, devices, kernels)
        defaults = {choice.field: choice.default for choice in families.spec(model.family).load_choices}
        for field, value in (config or {}).items():
            if value != defaults[field]:
                handle.note(f"{field} {value} (chosen at load; the default is {defaults[field]})")
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
    def backend_flags(self) -> BackendFlags:
        return self.gpu.flags

    def describe(self) -> str:
        parts = [f"{self.name}: {self.family}", f"{self.latent_channels} latent channels",
                 f"encode {dtype_name(self.model.encode_dtype)} / decode {dtype_name(self.model.decode_dtype)}",
                 f"on {', '.join(self.devices.devices) if self.devices else self.load_device} "
                 f"(offload {self.offload_device})", f"compile: {self.compile_status}", f"kernels: {self.opts.kernel_choice}"]
        return ", ".join(parts + self.notes)

    def info(self) -> dict:
        """JSON-ready summary for the node's UI message."""
        return {"name": self.name, "family": self.family, "latent_channels": self.latent_channels,
                "spatial_factor": self.spatial_factor, "encode_dtype": dtype_name(self.model.encode_dtype),
                "decode_dtype": dtype_name(self.model.decode_dtype), "device": str(self.load_device),
                "offload_device": str(self.offload_device), "compile": self.compile_status,
                "kernels": self.opts.kernel_choice, "notes": self.notes,
                "devices": list(self.devices.devices) if self.devices else None}

    # -- settings nodes ----------------------------------------------------------------------------
    def warn(self, note: str) -> None:
        """A setting that could not be honoured: shown on the node and logged; the run goes on."""
        self.notes.append(note)
        log.warning("StreamVAE %s: %s", self.name, note)

    def note(self, text: str) -> None:
        """Information for the node (not a problem): shown on the node and logged at info level."""
        self.notes.append(text)
        log.info("StreamVAE %s: %s", self.name, text)

    def _apply_gpu_options(self) -> None:
        """Apply the GPU Optimizations node's choices (its defaults when unconnected); each one asked for
        that does nothing on this device says so."""
        gpu = self.gpu
        device = self.load_device
        cuda = device.type == "cuda"
        self.opts = self.opts.with_(fused_norm_act=gpu.fused_norm_silu, attention=gpu.attention,
                                    conv3d_workaround=gpu.conv3d_workaround)
        if gpu.channels_last_3d:
            self.opts = self.opts.with_(activation_layout="ndhwc")
        if gpu.cudnn_benchmark and not cuda:
            self.warn(f"cudnn_benchmark: a cuDNN setting, no effect on {device.type}")
        if gpu.attention != "auto":
            for head in self.model.attention_widths():
                kernel, why = attention.choose(gpu.attention, head, self.model.decode_dtype, device)
                if why is not None:
                    self.warn(why)
        if cuda and backend.conv3d_regression_affected():  # once per load, on the node and in the log
            found = f"PyTorch 2.9 cuDNN conv3d regression detected ({backend.describe()})"
            if gpu.conv3d_workaround:
                self.note(f"{found}: workaround on, half-precision conv3d calls cuDNN directly")
            else:
                self.warn(f"{found}: workaround off (GPU Optimizations), half-precision conv3d needs ~3x the memory")

    # -- memory ----------------------------------------------------------------------------------
    def prepare(self, memory_required: int) -> None:
        """Put the weights on the compute device, asking ComfyUI to free `memory_required` bytes for
        the work itself (it unloads other models first, and may unload this one later)."""
        with torch.inference_mode(False):  # moved weights stay normal tensors (see `load`)
            if self.patcher is not None and mm is not None:
                mm.load_models_gpu([self.patcher], memory_required=max(0, int(memory_required)), force_full_load=True)
            else:
                self.model.to(self.load_device)
