"""Runs StreamVAE's nodes and core's VAE nodes in one ComfyUI process with dynamic VRAM switched on, and
prints what they made as JSON (for test_core_interop_server.py).

Usage, with the ComfyUI tree as working directory and the stand-ins on PYTHONPATH:
    python dynamic_vram_probe.py BASE_DIRECTORY VAE_NAME

A ComfyUI server cannot start with --enable-dynamic-vram on a machine without a GPU: 0.33.0's main.py
starts comfy-aimdo (`comfy_aimdo.control.init`, which works here), then hands the CPU's device index,
None, to `comfy_aimdo.control.init_devices`, which raises. So this does main.py's steps up to that
call, sets the two switches main.py sets once the devices are up (`CoreModelPatcher =
ModelPatcherDynamic`, `aimdo_enabled = True`), loads the pack the way main.py does and calls the
nodes directly.
"""
import asyncio
import json
import sys

base, vae_name = sys.argv[1], sys.argv[2]
sys.argv = [sys.argv[0], "--cpu", "--fp32-vae", "--enable-dynamic-vram", "--base-directory", base]  # fp32: see server.py

import comfy.options  # noqa: E402  (ComfyUI reads its command line when these modules load)

comfy.options.enable_args_parsing()

import comfy.memory_management  # noqa: E402
import comfy.model_patcher  # noqa: E402
import comfy_aimdo.control  # noqa: E402
import torch  # noqa: E402

comfy_aimdo.control.init(simple_vram_headroom=None, nvml_pressure=True)

comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic
comfy.memory_management.aimdo_enabled = True

import nodes  # noqa: E402


def first(output):
    """The first output of a node call: V3 nodes return io.NodeOutput, V1 nodes a tuple."""
    return output.result[0] if hasattr(output, "result") else output[0]


async def main() -> dict:
    if not await nodes.load_custom_node(f"{base}/custom_nodes/StreamVAE"):
        raise SystemExit("custom_nodes/StreamVAE did not load")
    node = nodes.NODE_CLASS_MAPPINGS
    frames = torch.rand(5, 32, 32, 3, generator=torch.Generator().manual_seed(2))
    ours = first(node["StreamVAELoader"].execute(vae_name=vae_name))
    core = first(nodes.VAELoader().load_vae(vae_name))
    adapter = first(node["StreamVAEToCoreVAE"].execute(vae=ours))
    core_latent = first(nodes.VAEEncode().encode(core, frames))
    runs = {
        "ours_enc": first(node["StreamVAEEncode"].execute(vae=ours, image=frames))["samples"],
        "adapter_enc": first(nodes.VAEEncode().encode(adapter, frames))["samples"],
        "core_enc": core_latent["samples"],
        "ours_dec": first(node["StreamVAEDecode"].execute(vae=ours, samples=core_latent)),
        "adapter_dec": first(nodes.VAEDecode().decode(adapter, core_latent)),
        "core_dec": first(nodes.VAEDecode().decode(core, core_latent)),
    }
    return {
        "aimdo_enabled": comfy.memory_management.aimdo_enabled,
        "ours_patcher": type(ours.patcher).__name__, "ours_dynamic": ours.patcher.is_dynamic(),
        "tensors": {key: value.float().tolist() for key, value in runs.items()},
    }


print(json.dumps(asyncio.run(main())))
