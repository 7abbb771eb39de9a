"""HTTP routes for the web extension (served under / and /api by ComfyUI's PromptServer).

- GET /streamvae/checkpoint?vae_name=NAME: family, latent channels and spatial factor of a checkpoint in
  models/vae or models/checkpoints (the one Load VAE lists), from its safetensors header only.
- GET /streamvae/plan?vae_name=NAME&op=encode|decode&width=W&height=H&frames=T&tile_size=..&tile_overlap=..
  &temporal_chunk=..&tiling=..&memory_budget_gb=..&device=..&encode_dtype=..&decode_dtype=..: the tile grid
  (rows x cols x temporal chunks) and predicted peak memory for one clip of W x H x T pixels (at most
  MAX_SIZE pixels a side and MAX_FRAMES frames, what the nodes take).

Both only read (a header, a plan), and answer ComfyUI's own page and programs (a script, curl), never a
page of another site a browser has open (docs/nodes.md, "The web extension"): the work runs off the
server's event loop, one request at a time per route with one more waiting, and the others are told
to try again (503), so no flood of requests stalls the server.

Errors answer HTTP 4xx/503 with {"error": message}, never 500: 400 for a request or a checkpoint
StreamVAE cannot use (the same message the nodes give), 403 for a foreign page, 503 while busy, 422 for
a failure it did not foresee (its traceback goes to the server log).
"""
import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import torch

from .. import vae
from ..vae import TILING_MODES, input_shape
from . import checkpoints
from .execution import plan_placement
from .images import MAX_FRAMES, MAX_SIZE
from .loader import vae_path
from .model import DEVICE_CHOICES, DTYPE_CHOICES, KERNEL_CHOICES, resolve_device, resolve_dtype
from .run_settings import check_tiling, settings_from_inputs

try:
    from comfy.cli_args import args as comfy_args
except ImportError:  # outside ComfyUI
    comfy_args = None

log = logging.getLogger("streamvae")
_registered = False
WAITING = 1  # requests a route holds while it works on one; more are answered 503
# A browser's word for where a request comes from (Fetch Metadata); without it (a program, an old
# browser), the Origin header against the Host, where there is one.
OWN_PAGE = {"same-origin", "none"}  # ComfyUI's page itself; "none": typed into the address bar


class BadRequest(ValueError):
    pass


def _int(query, name: str, default: int, low: int = 0, high: int = 1 << 20) -> int:
    try:
        value = int(float(query.get(name, default)))
    except ValueError:
        raise BadRequest(f"{name} must be a number, got {query.get(name)!r}") from None
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low} and {high}, got {value}")
    return value


def _choice(query, name: str, choices, default: str) -> str:
    value = query.get(name, default)
    if value not in choices:
        raise BadRequest(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def _checkpoint(query) -> checkpoints.CheckpointInfo:
    name = query.get("vae_name")
    if not name:
        raise BadRequest("vae_name is required")
    path = vae_path(name)
    if path is None:
        raise BadRequest(f"{name!r} is in neither models/vae nor models/checkpoints")
    try:
        return checkpoints.inspect_checkpoint(path)
    except (ValueError, OSError) as error:  # CheckpointError, or a file that went away meanwhile
        raise BadRequest(str(error)) from None


def checkpoint_info(query) -> dict:
    info = _checkpoint(query)
    return {"family": info.family, "latent_channels": info.latent_channels, "spatial_factor": info.spatial_factor,
            "stored_dtype": info.stored_dtype}


def plan_info(query) -> dict:
    info = _checkpoint(query)
    op = _choice(query, "op", ("encode", "decode"), "decode")
    width, height = _int(query, "width", 512, 1, MAX_SIZE), _int(query, "height", 512, 1, MAX_SIZE)
    frames = _int(query, "frames", 1, 1, MAX_FRAMES)
    tile_size, tile_overlap = _int(query, "tile_size", 0), _int(query, "tile_overlap", 64)
    temporal_chunk = _int(query, "temporal_chunk", 0)
    try:
        budget = float(query.get("memory_budget_gb", 0))
    except ValueError:
        raise BadRequest("memory_budget_gb must be a number") from None
    tiling = _choice(query, "tiling", TILING_MODES, "exact")
    error = check_tiling(tile_size, tile_overlap, temporal_chunk, budget, tiling)
    if error:
        raise BadRequest(error)
    settings = settings_from_inputs(tile_size, tile_overlap, temporal_chunk, tiling, budget)
    device = resolve_device(_choice(query, "device", DEVICE_CHOICES, "auto"))
    model = info.model  # meta device: only shapes, dtypes and config matter to the plan
    model.set_dtypes(encode=resolve_dtype(_choice(query, "encode_dtype", DTYPE_CHOICES, "auto"), device, "encode"),
                     decode=resolve_dtype(_choice(query, "decode_dtype", DTYPE_CHOICES, "auto"), device, "decode"))
    shape = input_shape(op, frames, height, width, model.latent_channels, model.spatial_factor, model.temporal_factor)
    opts = vae.Optimizations(kernel_choice=_choice(query, "kernels", KERNEL_CHOICES, "measure"))
    plan = vae.plan(model, op, shape, settings, opts=opts, **plan_placement(device))
    return {"family": info.family, "device": str(device), "plan": plan.as_dict(), "summary": plan.summary()}


def foreign(headers) -> str | None:
    """Why a request comes from a page of another site (which a browser lets send a GET, though not
    read the answer), or None: StreamVAE's routes answer ComfyUI's own page and programs only, unless
    ComfyUI runs with --enable-cors-header (then it allows other origins itself)."""
    if comfy_args is not None and comfy_args.enable_cors_header:
        return None
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site not in OWN_PAGE:
        return f"a {site} page"
    origin = headers.get("Origin")
    if origin and site is None and urlsplit(origin).netloc.lower() != headers.get("Host", "").lower():
        return f"a page of {origin}"
    return None


def _compute(compute, query) -> dict:
    with torch.inference_mode():  # per thread: set in the worker thread that runs `compute`
        return compute(query)


def register() -> None:
    """Add the routes to ComfyUI's server (once; a no-op outside a running server)."""
    global _registered
    if _registered:
        return
    try:
        from aiohttp import web
        from server import PromptServer
    except ImportError:
        return
    if getattr(PromptServer, "instance", None) is None:
        return

    def handler(compute):
        worker, busy = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamvae-route"), [0]

        async def handle(request):
            from_page = foreign(request.headers)
            if from_page is not None:
                return web.json_response({"error": f"StreamVAE's routes answer ComfyUI's own page, not {from_page} "
                                                   "(start ComfyUI with --enable-cors-header to allow one)"}, status=403)
            if busy[0] > WAITING:
                return web.json_response({"error": "busy with earlier requests: try again in a moment"}, status=503)
            busy[0] += 1
            try:
                answer = await asyncio.get_running_loop().run_in_executor(worker, _compute, compute,
                                                                          request.rel_url.query)
                return web.json_response(answer)
            except ValueError as error:  # BadRequest, or the library refusing this request (a plan it cannot make)
                return web.json_response({"error": str(error)}, status=400)
            except Exception as error:  # a route must answer, with the message; the traceback goes to the log
                log.exception("StreamVAE route %s failed", request.path)
                return web.json_response({"error": f"{type(error).__name__}: {error}"}, status=422)
            finally:
                busy[0] -= 1
        return handle

    routes = PromptServer.instance.routes
    routes.get("/streamvae/checkpoint")(handler(checkpoint_info))
    routes.get("/streamvae/plan")(handler(plan_info))
    _registered = True
