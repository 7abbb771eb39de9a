"""StreamVAE as a ComfyUI custom node pack.

ComfyUI imports this folder as a package, serves `web/` to the frontend and calls
`comfy_entrypoint()` for the V3 node list. Nothing here imports ComfyUI at module level, so the
folder can be imported (by pytest, by tools) without it; the `vae` library (its kernels in
`vae.kernels`) never imports ComfyUI at all.
"""
WEB_DIRECTORY = "./web"


async def comfy_entrypoint():
    try:
        from comfy_api.latest import io  # noqa: F401  (the V3 node API every node is written in)
    except ImportError as error:
        raise ImportError("StreamVAE needs ComfyUI's V3 node API (comfy_api.latest, ComfyUI 0.3.64 or newer; "
                          "tested with 0.3.75 and 0.33.0): update ComfyUI") from error
    from .nodes import StreamVAEExtension

    return StreamVAEExtension()
