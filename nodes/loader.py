"""StreamVAE Load VAE: a checkpoint from ComfyUI's models/vae folder, or a full model checkpoint from
models/checkpoints whose VAE is inside it (LTX-2's, under `vae.`; only those tensors are read) ->
STREAMVAE, and the same model as a core VAE (the one-node swap: core's VAE Decode, WanImageToVideo,
LTXVImgToVideo, HunyuanVideo15ImageToVideo, SeedVR2 nodes then run StreamVAE).

Choices a family declares for its loading (`FamilySpec.load_choices`, no weight says them) are advanced
inputs, one per choice of the registered families: a list for a `LoadChoice` (`clip_attention` is HunyuanVideo
1.5's mid-block attention: the trained frame-causal mask, or the unmasked attention core computes), a number
for a `LoadInteger` (`decode_seed` is the LTX-2.5 diffusion decoder's noise seed).
"""
import logging

from comfy_api.latest import io

from ..vae import families
from . import checkpoints, core_api
from .model import DEVICE_CHOICES, DTYPE_CHOICES, KERNEL_CHOICES, OFFLOAD_CHOICES, StreamVAEHandle
from .run_settings import settings_from_inputs
from .types import COMPILE, DEVICES, GPU_OPTIONS, STREAMVAE

try:
    import folder_paths
except ImportError:  # outside ComfyUI
    folder_paths = None

log = logging.getLogger("streamvae")


# The folders a VAE is listed from, in the order a name found in both is resolved.
FOLDERS = ("vae", "checkpoints")
# The node's inputs for the load choices the families declare (`FamilySpec.load_choices`): input -> choice.
CHOICE_INPUTS = {choice.input: choice for choice in families.load_choices()}
# How users name the models the registered families are the VAEs of (search words and the node's texts).
MODEL_NAMES = tuple(name for spec in families.SPECS for name in (spec.display_name, *spec.also))
FAMILIES_TEXT = ", ".join(spec.display_name for spec in families.SPECS[:-1]) + " or " + families.SPECS[-1].display_name


def vae_files() -> list[str]:
    """The names of models/vae, then those of models/checkpoints not already listed."""
    if folder_paths is None:
        return []
    names = {}
    for folder in FOLDERS:
        names.update((name, None) for name in folder_paths.get_filename_list(folder) if name not in names)
    return list(names)


def vae_path(name: str) -> str | None:
    """The file behind a listed name: models/vae first, then models/checkpoints (None: in neither)."""
    return next((path for folder in FOLDERS if (path := folder_paths.get_full_path(folder, name))), None)


def choice_input(name: str, choice):
    """The advanced input `name` for a family's load choice: a list of its values, or a number within its bounds."""
    tooltip = f"{choice.help} Other families: no effect."
    if isinstance(choice, families.LoadChoice):
        return io.Combo.Input(name, options=list(choice.values), default=choice.default, optional=True,
                              **core_api.advanced(), tooltip=tooltip)
    return io.Int.Input(name, default=choice.default, min=choice.minimum, max=choice.maximum, optional=True,
                        **core_api.advanced(), tooltip=tooltip)


def load_config(path: str, chosen: dict[str, str | int]) -> tuple[dict, list[str]]:
    """The config (field -> value) of the node's choice inputs (`chosen`: input -> value) that the file's
    family declares, and a warning for each other one set away from its default (no effect there)."""
    info = checkpoints.inspect_checkpoint(path)
    declared = families.spec(info.family).load_choices
    config, ignored = {}, []
    for name, value in chosen.items():
        choice = CHOICE_INPUTS[name]
        if choice in declared:
            config[choice.field] = value
        elif value != choice.default:
            ignored.append(f"{name} {value}: no effect on {info.family} (it has no such choice)")
    return config, ignored


def core_vae(handle: StreamVAEHandle):
    """`handle` as a core VAE with automatic tiles, chunks and budget (the weights are the handle's),
    or None where this core's VAE class cannot be adapted (then only the STREAMVAE output works)."""
    try:
        from .core_vae import StreamVAECoreVAE
    except Exception as error:  # core internals differ: the loader itself must keep working
        log.warning("StreamVAE Load VAE: no core VAE output with this ComfyUI (%s); use StreamVAE Decode/Encode", error)
        return None
    return StreamVAECoreVAE(handle, settings_from_inputs())


class LoadVAE(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return core_api.schema(
            node_id="StreamVAELoader",
            display_name="StreamVAE Load VAE",
            category="StreamVAE",
            search_aliases=["Load VAE", "VAE Loader", *MODEL_NAMES, "video VAE"],
            description=f"Loads the video VAE of {FAMILIES_TEXT} (the family is detected from the file), also the "
                        "VAE inside a full model checkpoint (stored under `vae.`). STREAMVAE feeds the StreamVAE "
                        "nodes; VAE replaces core's Load VAE for VAE Decode and the video models' core nodes, which "
                        "then run StreamVAE.",
            inputs=[
                io.Combo.Input("vae_name", options=vae_files(), tooltip=(
                    "A video VAE in models/vae, or a full checkpoint in models/checkpoints (only its VAE is "
                    "read); the family is detected.")),
                io.Combo.Input("encode_dtype", options=list(DTYPE_CHOICES), default="auto", **core_api.advanced(),
                               tooltip="Encoder precision. auto = fp32 (bf16 encode hurts image-to-video); bf16 and "
                                       "fp16 halve the memory."),
                io.Combo.Input("decode_dtype", options=list(DTYPE_CHOICES), default="auto", tooltip=(
                    "Decoder precision. auto = bf16 where the device computes it natively (near-lossless), else "
                    "fp32. fp16 can overflow.")),
                io.Combo.Input("device", options=list(DEVICE_CHOICES), default="auto", **core_api.advanced(), tooltip=(
                    "Where encode/decode run. auto = ComfyUI's VAE device (honours --cpu-vae); gpu = ComfyUI's main "
                    "device; cpu = slow.")),
                io.Combo.Input("offload_device", options=list(OFFLOAD_CHOICES), default="auto", **core_api.advanced(),
                               tooltip="Where the weights wait between runs. auto = ComfyUI's choice; none = stay on "
                                       "the compute device."),
                io.Combo.Input("kernels", options=list(KERNEL_CHOICES), default="measure", optional=True,
                               **core_api.advanced(), tooltip=(
                    "measure = the fastest exact kernels on this machine, timed once per layer shape and remembered; "
                    "defaults = fixed rules, for reproducible timings.")),
                *(choice_input(name, choice) for name, choice in CHOICE_INPUTS.items()),
                io.Custom(COMPILE).Input("compile", optional=True, tooltip=(
                    "Optional torch.compile settings from StreamVAE Torch Compile Settings; unconnected: eager.")),
                io.Custom(GPU_OPTIONS).Input("gpu_options", optional=True, tooltip=(
                    "Optional switches from StreamVAE GPU Optimizations; unconnected: that node's defaults.")),
                io.Custom(DEVICES).Input("devices", optional=True, tooltip=(
                    "Optional: several GPUs from StreamVAE Multi-GPU; unconnected: one device.")),
            ],
            outputs=[io.Custom(STREAMVAE).Output(display_name="STREAMVAE",
                                                 tooltip="The loaded video VAE, for the StreamVAE nodes."),
                     io.Vae.Output(display_name="VAE", tooltip=(
                         "The same VAE for core nodes (VAE Decode, WanImageToVideo, LTXVImgToVideo, "
                         "HunyuanVideo15ImageToVideo, SeedVR2): they then run StreamVAE, with automatic tiles. The "
                         "weights are loaded once."))],
        )

    @classmethod
    def validate_inputs(cls, vae_name=None):
        if vae_name is None:
            return True
        if folder_paths is not None and vae_name not in vae_files():
            return (f"{vae_name!r} is in neither models/vae nor models/checkpoints; put the file there and press R to "
                    "refresh the list.")
        path = vae_path(vae_name) if folder_paths is not None else None
        if path:  # only the header (safetensors) or the structure (pickle) is read, and never any code run
            try:
                checkpoints.inspect_checkpoint(path)
            except ValueError as error:  # CheckpointError, or a config the shapes contradict
                return str(error)
        return True

    @classmethod
    def fingerprint_inputs(cls, vae_name=None, **others):
        """The identity of the file the name stands for, in models/vae or models/checkpoints
        (`checkpoints.file_identity`): a checkpoint replaced under the same name is loaded again (ComfyUI
        reuses this node's output while the fingerprint stays the same), as the web extension's look-ups
        of it are (`checkpoints.inspect_checkpoint`)."""
        path = vae_path(vae_name) if folder_paths is not None and vae_name else None
        return checkpoints.file_identity(path) if path else None

    @classmethod
    def execute(cls, vae_name, encode_dtype="auto", decode_dtype="auto", device="auto", offload_device="auto",
                kernels="measure", compile=None, gpu_options=None, devices=None, **chosen) -> io.NodeOutput:
        """`chosen`: the load-choice inputs (`CHOICE_INPUTS`) set on the node."""
        path = vae_path(vae_name)
        if path is None:
            raise FileNotFoundError(f"{vae_name!r} is in neither models/vae nor models/checkpoints; put the file there "
                                    "and press R to refresh the list.")
        config, ignored = load_config(path, chosen)
        handle = StreamVAEHandle.load(path, vae_name, encode_dtype, decode_dtype, device, offload_device,
                                      kernels=kernels, compile_settings=compile, gpu=gpu_options, devices=devices,
                                      config=config)
        for warning in ignored:
            handle.warn(warning)
        return io.NodeOutput(handle, core_vae(handle), ui={"streamvae_model": [handle.info()]})
