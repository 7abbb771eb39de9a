"""The tiling and memory inputs that Encode, Decode, the video file nodes and the core-VAE adapter
share: their definitions (`tiling_inputs`), their validation (`check_tile_size` when a prompt is
queued, `check_tiling` when the node runs) and the `vae.Settings` a node's run is planned with
(`settings_from_inputs`). Pure torch; the ComfyUI schema objects are built in `tiling_inputs()` only.
"""
import math

from ..vae.geometry import TILING_MODES, tiling_error
from ..vae.planning import Settings
from .core_api import advanced

MAX_TILE = 8192
MAX_OVERLAP = 4096
MAX_CHUNK = 4096  # latent frames
MAX_BUDGET_GB = 1024.0


def settings_from_inputs(tile_size=0, tile_overlap=64, temporal_chunk=0, tiling="exact",
                         memory_budget_gb=0.0) -> Settings:
    """A node's tiling and memory inputs (0 = automatic) as the `vae.Settings` its run is planned with. A
    budget of a few bytes stays a budget (refused by the plan, with the GiB it needs), never 0."""
    budget = "auto" if not memory_budget_gb else max(1, math.ceil(memory_budget_gb * 2**30))
    return Settings(temporal_chunk or None, tile_size or None, tile_overlap, tiling, budget)


def _number(name: str, value, whole: bool) -> str | None:
    """Why `value` is not a number for input `name` (a value of another type reached the node: API JSON,
    or a link from a node that gives another type), or None."""
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        what = "a whole number" if whole else "a number"
        return f"{name} must be {what}; got {value!r} ({type(value).__name__})."
    return None


def check_tile_size(tile_size=None) -> str | None:
    """The one tiling rule ComfyUI cannot check per input by itself (the smallest tile; 0 = automatic),
    for the nodes' `validate_inputs`: an error there is shown on every input the function takes, so it
    takes this one only, and ComfyUI checks the others' types and ranges on their own widgets."""
    if tile_size is None:
        return None
    return _number("tile_size", tile_size, True) or check_tiling(tile_size=tile_size)


def check_tiling(tile_size=None, tile_overlap=None, temporal_chunk=None, memory_budget_gb=None,
                 tiling="exact") -> str | None:
    """Every rule of the tiling inputs, checked when a node runs (values that came through links, or
    that only ComfyUI's per-widget checks saw at queue time); the message says what to do, or None."""
    for name, value, whole in (("tile_size", tile_size, True), ("tile_overlap", tile_overlap, True),
                               ("temporal_chunk", temporal_chunk, True), ("memory_budget_gb", memory_budget_gb, False)):
        if value is not None and (error := _number(name, value, whole)):
            return error
    if tile_size is not None and not 0 <= tile_size <= MAX_TILE:
        return f"tile_size must be between 0 (automatic) and {MAX_TILE} pixels; got {tile_size}."
    if tile_overlap is not None and not 0 <= tile_overlap <= MAX_OVERLAP:
        return f"tile_overlap must be between 0 and {MAX_OVERLAP} pixels; got {tile_overlap}."
    if tile_size and (error := tiling_error(tile_size, tile_overlap or 0, tiling)):  # the library's one rule
        return error
    if temporal_chunk is not None and not 0 <= temporal_chunk <= MAX_CHUNK:
        return (f"temporal_chunk must be 0 (automatic) or 1 to {MAX_CHUNK} latent frames per step; "
                f"got {temporal_chunk}.")
    if memory_budget_gb is not None and not 0 <= memory_budget_gb <= MAX_BUDGET_GB:  # also rejects NaN
        return (f"memory_budget_gb must be 0 (automatic) or a positive number of GiB up to {MAX_BUDGET_GB:g}; "
                f"got {memory_budget_gb}.")
    return None


def tiling_inputs(io) -> list:
    """The tiling inputs shared by Encode, Decode and the core-VAE adapter (`io` is comfy_api's io);
    docs/nodes.md has the long text."""
    return [
        io.Int.Input("tile_size", default=0, min=0, max=MAX_TILE, step=8, tooltip=(
            "Tile edge in video pixels. 0 = automatic: untiled if it fits the memory budget, else the largest tile "
            "that fits.")),
        io.Int.Input("tile_overlap", default=64, min=0, max=MAX_OVERLAP, step=8, **advanced(), tooltip=(
            "Overlap of neighbouring tiles in pixels, below tile_size. Fast tiling blends over it; exact tiling does "
            "not use it.")),
        io.Int.Input("temporal_chunk", default=0, min=0, max=MAX_CHUNK, step=1, **advanced(), tooltip=(
            "Latent frames per step (one latent frame = 4 video frames). 0 = automatic. Every value gives the same "
            "result.")),
        io.Float.Input("memory_budget_gb", default=0.0, min=0.0, max=MAX_BUDGET_GB, step=0.25, tooltip=(
            "GiB the VAE may use on its device; tiles and chunks shrink to fit. 0 = automatic: what is free after "
            "ComfyUI unloads other models.")),
        io.Combo.Input("tiling", options=list(TILING_MODES), default="exact", **advanced(), tooltip=(
            "exact: tiles add up to the untiled result (seamless). fast: independent blended tiles, less memory "
            "and time, faint seams possible.")),
    ]


def streamed_tiling_inputs(io) -> list:
    """The tiling inputs of the video file nodes, which tile exactly only: a fast tile spans the whole
    clip, so it cannot stream to or from a file."""
    return [spec for spec in tiling_inputs(io) if spec.id != "tiling"]
