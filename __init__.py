"""StreamVAE as a ComfyUI custom node pack.

ComfyUI imports this folder as a package, serves `web/` to the frontend and calls
`comfy_entrypoint()` for the V3 node list. Nothing here imports ComfyUI at module level, so the
folder can be imported (by pytest, by tools) without it; the `vae` and `optimizations` libraries
never import ComfyUI at all.
"""
WEB_DIRECTORY = "./web"


async def comfy_entrypoint():
    from .nodes import StreamVAEExtension

    return StreamVAEExtension()
