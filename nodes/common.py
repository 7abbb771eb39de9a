"""Shared pieces of the node layer: IMAGE <-> video layout, clip splitting, LATENT metadata, and the
tiling inputs (definitions and queue-time validation) that Encode, Decode and the core-VAE adapter
share. Pure torch; the ComfyUI schema objects are built in `tiling_inputs()` only.

Layouts (ComfyUI conventions, docs/comfyui.md section 10):
- IMAGE: N,H,W,3 in 0..1, video frames along N; float32, or float16 under core's --fp16-intermediates.
- LATENT: {"samples": B,C,T',h,w} exactly as core's VAE Encode makes them (Wan raw, SeedVR2 scaled by
  0.9152, core's intermediate dtype; see `MODEL_SPACE_FAMILIES`). StreamVAE adds `streamvae_frames`
  (true pixel frames of each of the B clips) and `streamvae_size` ([H, W] in pixels) so Decode trims
  the padding Encode added. Other nodes (KSampler) copy the dict, so the keys survive sampling; Decode
  ignores them when they no longer fit the latent. Core's VAE Decode ignores them always.
"""
from dataclasses import dataclass

import torch

from ..vae.geometry import (SMALLEST_SPATIAL_FACTOR, TILING_MODES, is_4n1, latent_frames, min_tile, pixel_frames,
                            tiling_error)

FRAMES_KEY = "streamvae_frames"
SIZE_KEY = "streamvae_size"

MAX_TILE = 8192
MAX_OVERLAP = 4096
MAX_CHUNK = 4096  # latent frames
MAX_BUDGET_GB = 1024.0
MAX_FRAMES = 16385
# The smallest tile any family accepts (`vae.geometry`); the node checks the family's own when it runs.
MIN_TILE = min_tile(SMALLEST_SPATIAL_FACTOR)


# --- IMAGE <-> video -----------------------------------------------------------------------------

def _frame_list(mask: torch.Tensor) -> str:
    frames = mask.nonzero().flatten().tolist()
    return ", ".join(map(str, frames[:10])) + (f", ... ({len(frames)} frames)" if len(frames) > 10 else "")


def check_image(image) -> tuple[torch.Tensor, list[str]]:
    """An IMAGE made ready for encoding: N,H,W,3 floats, plus notes on what was adapted.

    Alpha (RGBA, or gray + alpha) is dropped and grayscale copied to R, G and B, each with a note;
    8-bit (uint8) frames are scaled to 0..1. Anything that would silently give a wrong latent (no
    frames, another layout, integer or NaN/Inf values, values far outside 0..1) raises ValueError
    saying what to do.
    """
    if not isinstance(image, torch.Tensor):
        raise ValueError(f"the IMAGE input is a {type(image).__name__}, not an image tensor; connect an IMAGE output")
    if image.dim() != 4:
        raise ValueError(f"an IMAGE must be 4-D frames,height,width,channels; got shape {tuple(image.shape)}. "
                         "Connect an IMAGE output (a MASK needs Convert Mask to Image first).")
    n, h, w, c = image.shape
    if n == 0 or h == 0 or w == 0:
        raise ValueError(f"the IMAGE is empty (shape {tuple(image.shape)}): it has no frames or no pixels; "
                         "check the node that made it (a load that matched no files, a crop to zero size)")
    notes = []
    if image.dtype == torch.uint8:
        image = image.float() / 255
        notes.append("8-bit IMAGE: values divided by 255")
    elif image.dtype == torch.bool:
        image = image.float()
    elif not image.dtype.is_floating_point:
        raise ValueError(f"IMAGE values are {str(image.dtype).removeprefix('torch.')}; StreamVAE needs floats in 0..1 "
                         "(ComfyUI's IMAGE convention): convert with values / max value first")
    if c in (2, 4):
        notes.append(f"IMAGE has an alpha channel ({c} channels): alpha dropped, the VAE encodes colour only; "
                     "composite over a background first if transparency matters")
        image = image[..., :c - 1]
    if image.shape[-1] not in (1, 3):
        raise ValueError(f"an IMAGE needs 1, 3 or 4 channels on its last axis (N,H,W,C); got shape {tuple(image.shape)}"
                         + (" - it looks channels-first (N,C,H,W): permute it to N,H,W,C" if h in (1, 3, 4) else ""))
    low, high = image.reshape(n, -1).aminmax(dim=1)  # per frame, one pass; NaN propagates, Inf stays Inf
    bad = ~(torch.isfinite(low) & torch.isfinite(high))
    if bool(bad.any()):
        raise ValueError(f"the IMAGE has NaN or Inf values in frame(s) {_frame_list(bad)} (0-based); fix the node "
                         "that made them (an fp16 overflow upstream is the usual cause)")
    low, high = float(low.min()), float(high.max())
    if low < -0.5 or high > 1.5:
        hint = "divide by 255" if high > 2 else "map -1..1 to 0..1 with (x + 1) / 2" if low < -0.5 else "clamp it to 0..1"
        raise ValueError(f"IMAGE values range from {low:.3g} to {high:.3g}, but an IMAGE holds 0..1: {hint} first")
    if image.shape[-1] == 1:
        notes.append("grayscale IMAGE: copied to R, G and B")
        image = image.expand(n, h, w, 3)
    return image, notes


@dataclass
class Clips:
    """An IMAGE split into clips: clip i is frames `spans[i]` of the batch, `length` frames long
    after padding (the last clip repeats its last frame when it is short)."""

    spans: list[tuple[int, int]]
    length: int

    @property
    def frames(self) -> list[int]:
        return [stop - start for start, stop in self.spans]


def split_clips(num_frames: int, batch_size: int) -> Clips:
    """How `num_frames` IMAGE frames become clips: 0 = one clip, k = clips of k frames."""
    if num_frames < 1:
        raise ValueError("the IMAGE batch is empty")
    size = num_frames if batch_size == 0 else batch_size
    spans = [(start, min(start + size, num_frames)) for start in range(0, num_frames, size)]
    return Clips(spans, size if batch_size else num_frames)


def clip_video(image: torch.Tensor, span: tuple[int, int], length: int) -> torch.Tensor:
    """Frames `span` of IMAGE (N,H,W,3, 0..1, see `check_image`) as a video 1,3,length,H,W in [-1, 1]
    (a new tensor), padded to `length` frames by repeating the last frame."""
    start, stop = span
    index = torch.arange(start, start + length).clamp_(max=stop - 1)
    frames = image.index_select(0, index.to(image.device))
    # Contiguous B,C,T,H,W: a channels-last view would make every conv and norm take slow paths.
    return frames.permute(3, 0, 1, 2).unsqueeze(0).float().contiguous().mul_(2).sub_(1)


def image_view(image: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """IMAGE frames [start, stop) as a 1,3,T,H,W view, for the decoder to write into directly."""
    return image[start:stop].permute(3, 0, 1, 2).unsqueeze(0)


def finish_image(image: torch.Tensor) -> torch.Tensor:
    """Decoder output in [-1, 1] (not clamped) -> IMAGE values 0..1, in place."""
    return image.add_(1).mul_(0.5).clamp_(0, 1)


# --- LATENT ----------------------------------------------------------------------------------------

# Core's VAE nodes keep a SeedVR2 LATENT in its diffusion model's space (raw * 0.9152: core's SeedVR2
# VAE scales after encoding and unscales before decoding) and Wan LATENTs raw (Wan's latent format
# normalises inside the diffusion model). StreamVAE's LATENTs follow core, so either side's nodes and
# samplers take the other's; the library (`vae`) stays raw.
MODEL_SPACE_FAMILIES = ("seedvr2",)

# The layouts a LATENT can arrive in, as Decode reports them.
CORE_LAYOUT = "B,C,T,H,W"
FOLDED_LAYOUT = "B,C*T,H,W (frames folded into channels)"
CHANNELS_LAST_LAYOUT = "B,T,H,W,C (channels last)"
IMAGE_LAYOUT = "B,C,H,W (one frame)"


def to_core_latent(model, z: torch.Tensor) -> torch.Tensor:
    """The library's raw latent -> what core's VAE Encode makes for `model`'s family."""
    return model.to_model_space(z) if model.family in MODEL_SPACE_FAMILIES else z


def from_core_latent(model, z: torch.Tensor) -> torch.Tensor:
    """What core's VAE Decode takes for `model`'s family -> the library's raw latent."""
    return model.from_model_space(z) if model.family in MODEL_SPACE_FAMILIES else z


def make_latent(samples: torch.Tensor, frames: list[int], size: tuple[int, int]) -> dict:
    return {"samples": samples, FRAMES_KEY: list(frames), SIZE_KEY: [int(size[0]), int(size[1])]}


def latent_layout(z: torch.Tensor, family: str, channels: int) -> tuple[torch.Tensor, str]:
    """`z` as B,C,T,h,w (a view) and the layout it was read as.

    The rule, in this order: 5-D with `channels` on dim 1 is core's layout (it wins when the last dim
    has that size too); 5-D with `channels` last is channels-last B,T,H,W,C; 4-D with `channels` on
    dim 1 is one frame; 4-D SeedVR2 with a multiple of 16 on dim 1 is core's folded B,16*T,H,W
    (channel-major, as core's SeedVR2 VAE reads it). Anything else keeps its shape and fails the
    channel check of `read_latent`.
    """
    if z.dim() == 5 and z.shape[1] != channels and z.shape[-1] == channels:
        return z.permute(0, 4, 1, 2, 3), CHANNELS_LAST_LAYOUT
    if z.dim() == 4 and z.shape[1] == channels:
        return z.unsqueeze(2), IMAGE_LAYOUT
    if z.dim() == 4 and family == "seedvr2" and z.shape[1] % channels == 0:
        return z.reshape(z.shape[0], channels, z.shape[1] // channels, *z.shape[2:]), FOLDED_LAYOUT
    if z.dim() == 4:
        return z.unsqueeze(2), IMAGE_LAYOUT
    return z, CORE_LAYOUT


@dataclass
class LatentClips:
    """A LATENT made ready for decoding: raw `samples` B,C,T',h,w, true `frames` per clip, the pixel
    `size` to trim to (None: decode everything) and the `layout` the samples were read as."""

    samples: torch.Tensor
    frames: list[int]
    size: tuple[int, int] | None
    layout: str = CORE_LAYOUT


def read_latent(latent: dict, model) -> LatentClips:
    """Validate a LATENT against the loaded VAE (`model`: the library's VideoVAE), bring it to the
    library's raw B,C,T',h,w and recover its clip metadata.

    Takes core's LATENTs (see `MODEL_SPACE_FAMILIES`) in any layout `latent_layout` reads. Raises
    ValueError with what to do when the channel count does not match the VAE.
    """
    family, channels = model.family, model.latent_channels
    spatial, temporal = model.spatial_factor, model.temporal_factor
    z = latent.get("samples") if isinstance(latent, dict) else None
    if not isinstance(z, torch.Tensor):
        raise ValueError("this LATENT has no 'samples' tensor; connect a LATENT output (a sampler, Empty Latent, "
                         "Load Latent or StreamVAE Encode)")
    if not z.dtype.is_floating_point:
        raise ValueError(f"LATENT samples are {str(z.dtype).removeprefix('torch.')}, not floats; the node that made "
                         "them is broken or the latent file is not a latent")
    if z.dim() not in (4, 5):
        raise ValueError(f"a video LATENT must be 5-D (B,C,T,H,W) or 4-D (B,C,H,W); got shape {tuple(z.shape)}")
    z, layout = latent_layout(z, family, channels)
    if z.shape[1] != channels:
        raise ValueError(
            f"this LATENT has {z.shape[1]} channels but the loaded {family} VAE decodes {channels}-channel latents. "
            f"Load the VAE that made it: 16 channels = Wan2.1 / Wan2.2-A14B / SeedVR2, 48 channels = Wan2.2-TI2V-5B.")
    b, _, t, h, w = z.shape
    if min(b, t, h, w) == 0:
        raise ValueError(f"this LATENT is empty (shape {tuple(z.shape)}: batch, channels, frames, height, width); "
                         "check the node that made it")
    full = pixel_frames(t, temporal)
    frames = latent.get(FRAMES_KEY)
    if not (isinstance(frames, (list, tuple)) and len(frames) == b
            and all(isinstance(f, int) and latent_frames(f, temporal) == t for f in frames)):
        frames = [full] * b
    size = latent.get(SIZE_KEY)
    if not (isinstance(size, (list, tuple)) and len(size) == 2
            and -(-size[0] // spatial) == h and -(-size[1] // spatial) == w):
        size = None
    # float32 before unscaling, as core's SeedVR2 VAE divides in its float32 compute dtype on the CPU
    samples = from_core_latent(model, z.to(torch.float32).contiguous())
    return LatentClips(samples, list(frames), None if size is None else (int(size[0]), int(size[1])), layout)


# --- tiling settings -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tiling:
    """The tiling inputs of a node, in engine units (None = automatic)."""

    tile_size: int | None
    tile_overlap: int
    temporal_chunk: int | None
    tiling: str
    memory_budget: int | str | None  # bytes, or "auto"

    @classmethod
    def from_inputs(cls, tile_size=0, tile_overlap=64, temporal_chunk=0, tiling="exact", memory_budget_gb=0.0):
        budget = "auto" if not memory_budget_gb else int(memory_budget_gb * 2**30)
        return cls(tile_size or None, tile_overlap, temporal_chunk or None, tiling, budget)

    def settings(self) -> dict:
        """These inputs as the settings `vae.plan` takes."""
        return {"tile_size": self.tile_size, "tile_overlap": self.tile_overlap, "temporal_chunk": self.temporal_chunk,
                "tiling": self.tiling, "memory_budget": self.memory_budget}


def check_tiling(tile_size=None, tile_overlap=None, temporal_chunk=None, memory_budget_gb=None) -> str | None:
    """Queue-time validation of the tiling inputs; the error message says what to do, or None.

    ComfyUI skips its own min/max checks for inputs a node validates itself, so the limits of
    `tiling_inputs` are enforced here. Inputs that arrive through a link are None here and are checked
    again when the node runs.
    """
    if tile_size is not None and not 0 <= tile_size <= MAX_TILE:
        return f"tile_size must be between 0 (automatic) and {MAX_TILE} pixels; got {tile_size}."
    if tile_overlap is not None and not 0 <= tile_overlap <= MAX_OVERLAP:
        return f"tile_overlap must be between 0 and {MAX_OVERLAP} pixels; got {tile_overlap}."
    if tile_size and (error := tiling_error(tile_size, tile_overlap or 0)):  # the library's one rule
        return error
    if temporal_chunk is not None and not 0 <= temporal_chunk <= MAX_CHUNK:
        return (f"temporal_chunk must be 0 (automatic) or 1 to {MAX_CHUNK} latent frames per step; "
                f"got {temporal_chunk}.")
    if memory_budget_gb is not None and not 0 <= memory_budget_gb <= MAX_BUDGET_GB:  # also rejects NaN
        return (f"memory_budget_gb must be 0 (automatic) or a positive number of GiB up to {MAX_BUDGET_GB:g}; "
                f"got {memory_budget_gb}.")
    return None


def check_batch_size(batch_size=None) -> str | None:
    """0 (one clip), 1 (independent images) or 4n+1 frames per clip (the SeedVR2 rule)."""
    if batch_size is None:
        return None
    if batch_size < 0 or batch_size > MAX_FRAMES:
        return f"batch_size must be between 0 and {MAX_FRAMES}; got {batch_size}."
    if batch_size and not is_4n1(batch_size):
        lower, upper = batch_size - (batch_size - 1) % 4, batch_size - (batch_size - 1) % 4 + 4
        return (f"batch_size must be 0 (the whole batch is one clip), 1 (every frame is its own image) or 4n+1 "
                f"frames per clip (5, 9, 13, ...); got {batch_size}: use {lower} or {upper}.")
    return None


def tiling_inputs(io) -> list:
    """The tiling inputs shared by Encode, Decode and the core-VAE adapter (`io` is comfy_api's io)."""
    return [
        io.Int.Input("tile_size", default=0, min=0, max=MAX_TILE, step=8, tooltip=(
            "Spatial tile edge in pixels of the video. 0 = automatic: untiled when it fits the memory budget, "
            f"otherwise the largest tile that fits. Else at least {MIN_TILE} px; 256-512 px is typical.")),
        io.Int.Input("tile_overlap", default=64, min=0, max=MAX_OVERLAP, step=8, tooltip=(
            "Overlap between neighbouring tiles in pixels; must be smaller than tile_size. Exact tiling is seamless "
            "without it; fast tiling blends over it (64-128 px hides seams). Ignored when untiled.")),
        io.Int.Input("temporal_chunk", default=0, min=0, max=MAX_CHUNK, step=1, tooltip=(
            "Latent frames per step (1 latent frame = 4 video frames). 0 = automatic: the most that fit the memory "
            "budget. Every value gives the same result (the causal cache is carried); smaller uses less memory.")),
        io.Float.Input("memory_budget_gb", default=0.0, min=0.0, max=MAX_BUDGET_GB, step=0.25, tooltip=(
            "GiB the VAE may use on its device. 0 = automatic: the free memory after ComfyUI "
            "unloads other models, minus a safety margin. Tiles and chunks shrink to fit.")),
        io.Combo.Input("tiling", options=list(TILING_MODES), default="exact", tooltip=(
            "exact: tiles add up to exactly the untiled result (seamless; slower). fast: independent tiles blended "
            "with cosine ramps over the overlap (less memory and time; faint seams are possible).")),
    ]


def streamed_tiling_inputs(io) -> list:
    """The tiling inputs of the video file nodes, which tile exactly only: a fast tile spans the whole
    clip, so it cannot stream to or from a file."""
    return [spec for spec in tiling_inputs(io) if spec.id != "tiling"]
