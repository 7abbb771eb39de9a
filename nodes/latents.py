"""LATENT: core's convention (what core's VAE Encode makes and VAE Decode takes), the layouts Decode
reads, and the clip metadata StreamVAE adds.

LATENT: {"samples": B,C,T',h,w} exactly as core's VAE Encode makes them (Wan raw, SeedVR2 scaled by
0.9152, core's intermediate dtype; see `MODEL_SPACE_FAMILIES`). StreamVAE adds `streamvae_frames`
(true pixel frames of each of the B clips) and `streamvae_size` ([H, W] in pixels) so Decode trims
the padding Encode added. Other nodes (KSampler) copy the dict, so the keys survive sampling; Decode
ignores them when they no longer fit the latent. Core's VAE Decode ignores them always.
"""
from dataclasses import dataclass

import torch

from ..vae.geometry import latent_frames, pixel_frames

FRAMES_KEY = "streamvae_frames"
SIZE_KEY = "streamvae_size"

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
