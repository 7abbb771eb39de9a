"""The ComfyUI node layer of StreamVAE (V3 schema). Imported by the pack's `comfy_entrypoint()` only,
inside a running ComfyUI; the library (`vae`, with its kernels in `vae.kernels`) never imports it.

One file per node (loader, encode, decode, settings, core_vae, test_pattern, video_output = Decode to
Video, video_input = Encode from Video); shared pieces live in
`images` (IMAGE <-> video, clips), `latents` (core's LATENT convention, layouts, clip metadata),
`run_settings` (the tiling and memory inputs and their value), `model` (the STREAMVAE handle and ComfyUI
memory management), `execution` (the run's one plan, progress and interrupts around the engine),
`checkpoints` (a checkpoint's family and shapes from its header) and `routes` (plans and
checkpoint facts for the web extension).
"""
import logging

from comfy_api.latest import ComfyExtension, io

from . import routes
from .decode import Decode
from .encode import Encode
from .loader import LoadVAE
from .multi_device import MultiDevice
from .settings import GPUOptimizations, TorchCompileSettings
from .test_pattern import TestPattern

log = logging.getLogger("streamvae")


def node_list() -> list[type[io.ComfyNode]]:
    nodes = [LoadVAE, Encode, Decode, TorchCompileSettings, GPUOptimizations, MultiDevice, TestPattern]
    try:  # the video file nodes need PyAV (ComfyUI depends on it) and core's VIDEO type
        if not hasattr(io, "Video"):
            raise ImportError("this ComfyUI has no VIDEO type")
        from .video_input import EncodeFromVideo
        from .video_output import DecodeToVideo
    except ImportError as error:
        log.warning("StreamVAE: 'Decode to Video' and 'Encode from Video' are unavailable (%s); update ComfyUI "
                    "or install PyAV (pip install av)", error)
    else:
        nodes += [DecodeToVideo, EncodeFromVideo]
    try:  # the adapter subclasses core's VAE class; without it the other nodes still work
        from .core_vae import ToCoreVAE
    except Exception as error:  # any import failure in core internals must not take the pack down
        log.warning("StreamVAE: 'StreamVAE to core VAE' is unavailable with this ComfyUI (%s)", error)
    else:
        nodes.append(ToCoreVAE)
    return nodes


class StreamVAEExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        routes.register()
        return node_list()
