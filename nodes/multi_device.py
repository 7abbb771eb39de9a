"""Several local devices for one StreamVAE Encode/Decode: the StreamVAE Multi-GPU settings node, and
the worker processes (`vae.distributed.workers.RankWorkers`, one per device) a STREAMVAE handle runs them on.

The workers start at the first Encode/Decode that needs them and stay (with their copy of the weights)
for the next runs; a failure, an out-of-memory error or Cancel stops all of them (the error names the
rank that failed) and the next run starts new ones. What can be known before starting them is checked
first: the devices when the prompt is queued (CUDA devices that exist, once each; no more CPU ranks than
cores), the machine's free memory and the frame's latent rows (one per rank at least) when a run starts.
"""
import logging
from dataclasses import dataclass

import torch
from comfy_api.latest import io

from ..vae import RankWorkers
from . import core_api
from .types import DEVICES

log = logging.getLogger("streamvae")


@dataclass(frozen=True)
class DeviceSet:
    """The devices one Encode/Decode is split over (at least two), and the collective timeout."""

    devices: tuple[str, ...]
    timeout_s: int = 120


def cuda_devices(count: int) -> str:
    """What CUDA devices this machine has, in words."""
    if count == 0:
        return "this machine has no CUDA device (a CPU-only torch, or no NVIDIA driver)"
    names = ", ".join(f"cuda:{i}" for i in range(count))
    return f"this machine has {count} CUDA device{'s' if count > 1 else ''} ({names})"


def parse_devices(text: str) -> tuple[str, ...]:
    """"cuda:0, cuda:1" / "0,1" (CUDA indices) / "cpu,cpu" -> device names; ValueError says what is wrong."""
    names = [part.strip() for part in text.replace(";", ",").split(",") if part.strip()]
    devices: list[str] = []
    for name in names:
        try:
            device = torch.device(f"cuda:{name}" if name.isdigit() else name)
        except RuntimeError:
            raise ValueError(f"{name!r} is not a device; write e.g. cuda:0, cuda:1 (or 0, 1)") from None
        if device.type == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if device.index is None or device.index >= count:
                raise ValueError(f"{name!r}: {cuda_devices(count)}")
        elif device.type != "cpu":
            raise ValueError(f"{name!r}: only CUDA GPUs (NCCL) and CPUs (gloo, for testing) can be combined")
        if device.type == "cuda" and str(device) in devices:
            raise ValueError(f"{device} is given twice: each GPU runs one worker (NCCL refuses two on one GPU)")
        devices.append(str(device))
    if len(devices) < 2:
        raise ValueError(f"give at least two devices, e.g. cuda:0, cuda:1 (got {text!r}); for one device leave "
                         "Load VAE's devices input unconnected")
    RankWorkers.check_machine(devices, weight_bytes=0)  # the weights are known when a run starts (checked again)
    return tuple(devices)


def workers(handle, latent_rows: int) -> RankWorkers | None:
    """The handle's worker processes (started now if none are running) for a run whose frames are
    `latent_rows` latent rows tall, or None when it runs on one device. A frame too short for the
    ranks, or a machine short of cores or memory for them, is refused before any worker starts."""
    if handle.devices is None:
        return None
    model = handle.model
    if (model.in_channels, model.out_channels, model.decode_upscale, model.temporal_factor) != (3, 3, 1, 4):
        log.warning("StreamVAE Multi-GPU: the %s VAE (%d image channels, %dx decoder) runs on one device: the row "
                    "bands split RGB video VAEs only", model.family, model.out_channels, model.decode_upscale)
        return None
    RankWorkers.check_split(len(handle.devices.devices), latent_rows)
    if handle.workers is None or not handle.workers.alive:
        handle.workers = RankWorkers(handle.model, handle.devices.devices, opts=handle.opts,
                                     timeout=handle.devices.timeout_s)
    return handle.workers


class MultiDevice(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return core_api.schema(
            node_id="StreamVAEMultiDevice",
            display_name="StreamVAE Multi-GPU",
            category="StreamVAE",
            search_aliases=["multi GPU", "several GPUs", "distributed"],
            description="Splits every StreamVAE Encode/Decode of the connected Load VAE over several local GPUs, one "
                        "worker process each, with the one-GPU result. Helps at high resolution with fast links; "
                        "docs/multi-gpu.md says when.",
            inputs=[
                io.String.Input("devices", default="cuda:0, cuda:1", tooltip=(
                    "GPUs to split over, comma-separated: cuda:0, cuda:1 (or 0, 1). Each holds a copy of the weights.")),
                io.Int.Input("timeout_s", default=120, min=10, max=3600, step=10, tooltip=(
                    "Seconds a worker waits for the others at one exchange before the run fails (a hung GPU).")),
            ],
            outputs=[io.Custom(DEVICES).Output(display_name="DEVICES",
                                               tooltip="Connect to StreamVAE Load VAE's devices input.")],
        )

    @classmethod
    def validate_inputs(cls, devices=None):
        if devices is None:
            return True
        try:
            parse_devices(devices)
        except ValueError as error:
            return str(error)
        return True

    @classmethod
    def execute(cls, devices="cuda:0, cuda:1", timeout_s=120) -> io.NodeOutput:
        return io.NodeOutput(DeviceSet(parse_devices(devices), timeout_s))
