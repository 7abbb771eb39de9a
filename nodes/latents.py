"""LATENT: core's convention (what core's VAE Encode makes and VAE Decode takes), the layouts Decode
reads, and the clip metadata StreamVAE adds.

LATENT: {"samples": B,C,T',h,w} exactly as core's VAE Encode makes them (Wan raw, SeedVR2 scaled by
0.9152, core's intermediate dtype; `VideoVAE.to_comfy_latent`). StreamVAE adds `streamvae_frames`
(true pixel frames of each of the B clips), `streamvae_size` ([H, W] in pixels) so Decode trims
the padding Encode added, and `streamvae_fps` where the frames came from a video file. Other nodes
(KSampler) copy the dict, so the keys survive sampling; Decode ignores them when they no longer fit
the latent. Core's VAE Decode ignores them always.

WanVideoWrapper's sampler hands out Wan latents in its normalized space, (raw - mean) / std per
channel (what the Wan DiT sees; `VideoVAE.to_model_space`), in a LATENT with keys of its own
(`WRAPPER_KEYS`); its WanVideoLatentReScale node converts them to core's raw latents and keeps the
keys. `read_latent` tells the two apart (`latent_source`).
"""
from dataclasses import dataclass, field

import torch

from ..vae import families
from .core_api import advanced

FRAMES_KEY = "streamvae_frames"
SIZE_KEY = "streamvae_size"
FPS_KEY = "streamvae_fps"

# The layouts a LATENT can arrive in, as Decode reports them.
CORE_LAYOUT = "B,C,T,H,W"
FOLDED_LAYOUT = "B,C*T,H,W (frames folded into channels)"
CHANNELS_LAST_LAYOUT = "B,T,H,W,C (channels last)"
IMAGE_LAYOUT = "B,C,H,W (one frame)"

# Channel counts of image models' latents that reach video nodes by mistake, and whose they are.
IMAGE_MODEL_LATENTS = {4: "SD 1.x / SD 2.x / SDXL"}

# Where a Wan LATENT comes from (Decode's `latent_source` input): "auto" reads the keys and statistics.
LATENT_SOURCES = ("auto", "core", "WanVideoWrapper")
# Keys WanVideoWrapper's samplers put into their LATENTs (its WanVideoSampler's return value); core's
# nodes and StreamVAE never write them.
WRAPPER_KEYS = ("looped", "has_ref", "drop_last")
WRAPPER_FIX = ("set StreamVAE Decode's latent_source to WanVideoWrapper (straight from its sampler) or core (after "
               "WanVideoLatentReScale wrapper_to_comfy)")


def make_latent(samples: torch.Tensor, frames: list[int], size: tuple[int, int], fps: float | None = None) -> dict:
    latent = {"samples": samples, FRAMES_KEY: list(frames), SIZE_KEY: [int(size[0]), int(size[1])]}
    if fps is not None:
        latent[FPS_KEY] = float(fps)
    return latent


def latent_layout(z: torch.Tensor, family: str, channels: int) -> tuple[torch.Tensor, str]:
    """`z` as B,C,T,h,w (a view) and the layout it was read as.

    The rule, in this order: 5-D with `channels` on dim 1 is core's layout (it wins when the last dim
    has that size too); 5-D with `channels` last is channels-last B,T,H,W,C; 4-D with `channels` on
    dim 1 is one frame; 4-D with a multiple of `channels` on dim 1, for a family whose core LATENT folds
    its frames so (`ComfyLatent.folded_frames`: SeedVR2), is core's folded B,C*T,H,W (channel-major, as
    core's SeedVR2 VAE reads it). Anything else keeps its shape and fails the channel check of `read_latent`.
    """
    if z.dim() == 5 and z.shape[1] != channels and z.shape[-1] == channels:
        return z.permute(0, 4, 1, 2, 3), CHANNELS_LAST_LAYOUT
    if z.dim() == 4 and z.shape[1] == channels:
        return z.unsqueeze(2), IMAGE_LAYOUT
    if z.dim() == 4 and families.spec(family).latent.folded_frames and z.shape[1] % channels == 0:
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
    fps: float | None = None  # the source video's frame rate, when the frames came from a file
    notes: list[str] = field(default_factory=list)  # how the LATENT was read, for the run report


def read_latent(latent: dict, model, source: str = "auto") -> LatentClips:
    """Validate a LATENT against the loaded VAE (`model`: the library's VideoVAE), bring it to the
    library's raw B,C,T',h,w and recover its clip metadata.

    Takes core's LATENTs (`VideoVAE.from_comfy_latent`) in any layout `latent_layout` reads, and Wan
    LATENTs from WanVideoWrapper (`source`, see `wan_source`). Raises ValueError with what to do when
    the channel count does not match the VAE.
    """
    family, channels = model.family, model.latent_channels
    spatial = model.spatial_factor
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
        image_model = IMAGE_MODEL_LATENTS.get(z.shape[1])
        if image_model and z.shape[2] == 1:
            raise ValueError(
                f"this LATENT has {z.shape[1]} channels and one frame: an image model's latent ({image_model}), not a "
                f"video VAE's. Decode it with core's VAE Decode and that model's VAE; the loaded {family} VAE decodes "
                f"{channels}-channel video latents.")
        raise ValueError(f"this LATENT has {z.shape[1]} channels but the loaded {family} VAE decodes {channels}-channel"
                         f" latents. Load the VAE that made it: {_whose_latents()}.")
    b, _, t, h, w = z.shape
    if min(b, t, h, w) == 0:
        raise ValueError(f"this LATENT is empty (shape {tuple(z.shape)}: batch, channels, frames, height, width); "
                         "check the node that made it")
    full = model.frames_made("decode", t)  # the network's frame rule (4n+1 unless it has its own)
    frames = latent.get(FRAMES_KEY)
    if not (isinstance(frames, (list, tuple)) and len(frames) == b
            and all(isinstance(f, int) and f > 0 and model.frames_made("encode", f) == t for f in frames)):
        frames = [full] * b
    size = latent.get(SIZE_KEY)
    if not (isinstance(size, (list, tuple)) and len(size) == 2
            and -(-size[0] // spatial) == h and -(-size[1] // spatial) == w):
        size = None
    # float32 before unscaling, as core's SeedVR2 VAE divides in its float32 compute dtype on the CPU
    samples = model.from_comfy_latent(z.to(torch.float32).contiguous())
    notes = []
    wrapper = families.spec(family).latent.wrapper_normalized
    if wrapper and wan_source(latent, samples, model, source) == "WanVideoWrapper":
        samples = model.from_model_space(samples)
        notes.append("LATENT in WanVideoWrapper's normalized space: converted to core's raw Wan latent")
    fps = latent.get(FPS_KEY)
    fps = float(fps) if isinstance(fps, (int, float)) and fps > 0 else None
    return LatentClips(samples, list(frames), None if size is None else (int(size[0]), int(size[1])), layout,
                       fps, notes)


def _whose_latents() -> str:
    """The registered families by latent channels: "16 channels = SeedVR2 / Wan2.1 / ..., 32 channels = ..."."""
    by_channels: dict[int, list[str]] = {}
    for spec in families.SPECS:
        by_channels.setdefault(spec.latent_channels, []).extend((spec.display_name, *spec.also))
    return ", ".join(f"{c} channels = {' / '.join(names)}" for c, names in sorted(by_channels.items()))


def latent_source_input(io):
    """Decode's `latent_source` input (`io` is comfy_api's io); optional, so older prompts still run."""
    return io.Combo.Input("latent_source", options=list(LATENT_SOURCES), default="auto", optional=True,
                          **advanced(), tooltip=(
        "Which convention a Wan LATENT follows. auto: core's, or WanVideoWrapper's normalized one when its sampler's "
        "keys are present. Set it after Save/Load Latent."))


def _distance_from_unit_normal(z: torch.Tensor) -> float:
    """How far the channels of `z` (B,C,T,h,w) are from mean 0 and standard deviation 1: the mean over
    channels of mean^2 + log(std)^2 (0 for normalized latents)."""
    channels = z.transpose(0, 1).reshape(z.shape[1], -1)  # C, B*T*h*w
    std, mean = torch.std_mean(channels, dim=1)
    return float((mean.square() + std.clamp_min(1e-6).log().square()).mean())


def wan_source(latent: dict, z: torch.Tensor, model, source: str = "auto") -> str:
    """"core" or "WanVideoWrapper": which space the Wan latent `z` (B,C,T,h,w, float32, as the LATENT
    holds it) is in. `source` other than "auto" is the answer. Auto: a LATENT without the wrapper's
    keys is core's; with them it is the wrapper sampler's, normalized (channels near mean 0, std 1)
    or already rescaled to core's (channels near Wan's own means and stds, which spread over 1.1-3.3
    for Wan2.1 and 0.35-1.7 for Wan2.2): the nearer one wins by a factor of 2, else ValueError names
    the fix. Statistics alone never decide: noise and empty latents look normalized too."""
    if source != "auto":
        return source
    if not any(key in latent for key in WRAPPER_KEYS):
        return "core"
    as_normalized = _distance_from_unit_normal(z)
    as_core = _distance_from_unit_normal(model.to_model_space(z))
    if as_normalized * 2 < as_core:
        return "WanVideoWrapper"
    if as_core * 2 < as_normalized:
        return "core"
    raise ValueError(f"this LATENT comes from WanVideoWrapper, and its values fit neither its normalized space nor "
                     f"core's raw Wan latents clearly (distance {as_normalized:.2f} vs {as_core:.2f}): {WRAPPER_FIX}")
