"""StreamVAE Load VAE: a checkpoint from ComfyUI's models/vae folder -> STREAMVAE, and the same model
as a core VAE (the one-node swap: core's VAE Decode, WanImageToVideo, SeedVR2 nodes then run StreamVAE).
"""
import logging

from comfy_api.latest import io

from . import checkpoints
from .model import DEVICE_CHOICES, DTYPE_CHOICES, KERNEL_CHOICES, OFFLOAD_CHOICES, StreamVAEHandle
from .run_settings import RunSettings
from .types import COMPILE, DEVICES, GPU_OPTIONS, STREAMVAE

try:
    import folder_paths
except ImportError:  # outside ComfyUI
    folder_paths = None

log = logging.getLogger("streamvae")


def vae_files() -> list[str]:
    return folder_paths.get_filename_list("vae") if folder_paths is not None else []


def core_vae(handle: StreamVAEHandle):
    """`handle` as a core VAE with automatic tiles, chunks and budget (the weights are the handle's),
    or None where this core's VAE class cannot be adapted (then only the STREAMVAE output works)."""
    try:
        from .core_vae import StreamVAECoreVAE
    except Exception as error:  # core internals differ: the loader itself must keep working
        log.warning("StreamVAE Load VAE: no core VAE output with this ComfyUI (%s); use StreamVAE Decode/Encode", error)
        return None
    return StreamVAECoreVAE(handle, RunSettings.from_inputs())


class LoadVAE(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        dtype_help = ("auto = {auto}; fp32 = exact reference; bf16 = about half the memory and faster where native "
                      "(see auto); fp16 = like bf16, but can overflow to black or NaN frames.")
        return io.Schema(
            node_id="StreamVAELoader",
            display_name="StreamVAE Load VAE",
            category="StreamVAE",
            description="Loads a SeedVR2, Wan2.1 or Wan2.2 video VAE for the StreamVAE Encode/Decode nodes. "
                        "The family is detected from the checkpoint.",
            inputs=[
                io.Combo.Input("vae_name", options=vae_files(), tooltip=(
                    "Checkpoint in ComfyUI's models/vae folder: SeedVR2 (ema_vae_fp16.safetensors), Wan2.1 "
                    "(wan_2.1_vae.safetensors) or Wan2.2 (wan2.2_vae.safetensors). The family is shown after loading.")),
                io.Combo.Input("encode_dtype", options=list(DTYPE_CHOICES), default="auto", tooltip=(
                    "Precision of the encoder weights and compute. " + dtype_help.format(
                        auto="fp32, because bf16 encode visibly hurts image-to-video"))),
                io.Combo.Input("decode_dtype", options=list(DTYPE_CHOICES), default="auto", tooltip=(
                    "Precision of the decoder weights and compute. " + dtype_help.format(
                        auto="bf16 where the device computes it natively (GPUs: NVIDIA Ampere and newer, AMD "
                             "CDNA2+/RDNA3+, Apple on macOS 14+; CPUs with AVX-512 BF16 or AMX), near-lossless "
                             "(46-50 dB PSNR against fp32), else fp32. The node shows which one ran"))),
                io.Combo.Input("device", options=list(DEVICE_CHOICES), default="auto", tooltip=(
                    "Where encode/decode run. auto = ComfyUI's VAE device (honours --cpu-vae); gpu = ComfyUI's "
                    "main device; cpu = system memory (slow).")),
                io.Combo.Input("offload_device", options=list(OFFLOAD_CHOICES), default="auto", tooltip=(
                    "Where the weights wait between runs, so ComfyUI can free the GPU for other models. auto = "
                    "ComfyUI's choice (cpu, or the GPU with --gpu-only); none = stay on the compute device.")),
                io.Combo.Input("kernels", options=list(KERNEL_CHOICES), default="measure", optional=True, tooltip=(
                    "How each layer's exact kernel is picked (all give the same result up to float rounding). "
                    "measure = the fastest on this machine, timed once per new layer shape (about 0.5-3 s each on a "
                    "CPU, then remembered on disk per machine, torch and pack version); defaults = fixed rules, "
                    "the same on every machine (for reproducible timings).")),
                io.Custom(COMPILE).Input("compile", optional=True, tooltip=(
                    "Optional torch.compile settings from a StreamVAE Torch Compile Settings node; without it "
                    "the VAE runs eagerly.")),
                io.Custom(GPU_OPTIONS).Input("gpu_options", optional=True, tooltip=(
                    "Optional backend switches from a StreamVAE GPU Optimizations node; without it that node's "
                    "defaults apply.")),
                io.Custom(DEVICES).Input("devices", optional=True, tooltip=(
                    "Optional: several GPUs from a StreamVAE Multi-GPU node; every Encode/Decode of this VAE is "
                    "then split over them (one worker process per GPU). Unconnected: one device, as set above.")),
            ],
            outputs=[io.Custom(STREAMVAE).Output(display_name="STREAMVAE",
                                                 tooltip="The loaded video VAE, for StreamVAE Encode/Decode."),
                     io.Vae.Output(display_name="VAE", tooltip=(
                         "The same VAE for core nodes (VAE Decode, WanImageToVideo, SeedVR2): they then run StreamVAE, "
                         "with automatic tiles. The weights are loaded once."))],
        )

    @classmethod
    def validate_inputs(cls, vae_name=None):
        if vae_name is None:
            return True
        if folder_paths is not None and vae_name not in vae_files():
            return f"{vae_name!r} is not in models/vae; put the file there and press R to refresh the list."
        path = folder_paths.get_full_path("vae", vae_name) if folder_paths is not None else None
        if path:  # only the header (safetensors) or the structure (pickle) is read, and never any code run
            try:
                checkpoints.inspect_checkpoint(path)
            except ValueError as error:  # CheckpointError, or a config the shapes contradict
                return str(error)
        return True

    @classmethod
    def execute(cls, vae_name, encode_dtype="auto", decode_dtype="auto", device="auto", offload_device="auto",
                kernels="measure", compile=None, gpu_options=None, devices=None) -> io.NodeOutput:
        path = folder_paths.get_full_path_or_raise("vae", vae_name)
        handle = StreamVAEHandle.load(path, vae_name, encode_dtype, decode_dtype, device, offload_device,
                                      kernels=kernels, compile_settings=compile, gpu=gpu_options, devices=devices)
        return io.NodeOutput(handle, core_vae(handle), ui={"streamvae_model": [handle.info()]})
