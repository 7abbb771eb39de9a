"""Qwen-Image 2.1 VAE (ComfyUI `qwen_image_2.1_vae_bf16.safetensors`, diffusers `AutoencoderKLQwenImage21`).

The Wan2.2 layout (`wan22.py`: residual stage blocks with `WanAvgDown3D` / `WanDupUp3D` shortcuts, a
separate decoder width) generalised: five stages (`dim_mult` (1, 2, 4, 8, 8)), no patchify, 16x
spatial compression, 64 latent channels, encoder width 96 and decoder width 144, RGBA in and out.
Its convs are one frame deep (temporal kernel 1: diffusers stores them as 2-D convs), so it is an
image network: upstream and ComfyUI encode and decode one image at a time, as a clip's first frame
(the shortcuts average it with a zero frame, `time_conv` never runs). The nominal temporal
downsampling (False, True, True, True) of its config never acts on a single frame.

Here every frame of a clip is such an image: temporal factor 1 (T frames <-> T latent frames, each
independent), frames folded into the batch inside a chunk, no causal state between chunks.
Layout B,C,T,H,W; pixels in [-1, 1].
"""
from dataclasses import dataclass
from functools import partial

import torch

from . import wan_layout
from .execution import RunState
from .video_vae import Stage, run_stages
from .wan22 import Wan22Config, Wan22VAE

# Per-channel latent statistics of the released model (diffusers `AutoencoderKLQwenImage21` config);
# not stored in the checkpoint. Model space = (raw - mean) / std.
QWEN21_LATENT_MEAN = (
    0.5126, 0.7721, -0.0631, 1.3506, -0.7855, -2.1025, -0.3458, 1.3722, 1.8873, -1.7177, -0.6510, 0.2732,
    0.7562, -0.6163, -1.0277, 3.8363, 2.0210, 0.0472, 0.9320, 2.0087, 2.4954, -0.1391, -1.4249, 1.8464,
    -0.5236, 1.2826, 3.7046, -1.3035, 2.7286, -1.4518, -1.9036, -1.9955, -0.0342, -1.0265, -0.7636, 3.0555,
    0.0746, -3.0751, -0.1076, 1.7376, -1.0914, -1.9435, -0.2784, -1.3680, 0.4809, -0.4433, 0.3764, 0.5729,
    -2.0595, 1.0960, -1.3260, -2.0211, -5.0179, 0.5275, 4.0162, 1.8505, 0.3026, 1.9373, 1.4937, 0.2632,
    0.5547, -1.7121, -0.1562, 0.0304)
QWEN21_LATENT_STD = (
    3.2001, 3.2936, 3.4321, 3.0091, 3.1061, 4.0379, 4.0705, 3.7910, 3.0785, 3.6500, 3.9308, 3.0904,
    2.8778, 3.7675, 3.7320, 5.0756, 3.2864, 4.0397, 3.1317, 4.0443, 2.9249, 3.9454, 3.0988, 4.2489,
    3.4896, 3.8513, 3.9323, 3.4719, 3.7498, 4.2830, 3.5694, 4.2467, 3.9037, 3.2947, 5.0770, 3.5075,
    3.2700, 3.4767, 2.8063, 5.1125, 3.5327, 4.7833, 3.1286, 4.1819, 3.8527, 3.8312, 3.5605, 4.3875,
    3.9624, 4.0168, 3.5643, 4.0550, 5.5614, 4.2963, 4.4080, 3.4959, 3.8747, 3.7608, 3.5735, 3.1490,
    3.7662, 3.6746, 3.4563, 3.8161)


@dataclass(frozen=True)
class Qwen21Config(Wan22Config):
    """Released config (diffusers `AutoencoderKLQwenImage21()` defaults)."""

    dim: int = 96
    dec_dim: int = 144
    z_dim: int = 64
    dim_mult: tuple[int, ...] = (1, 2, 4, 8, 8)
    temperal_downsample: tuple[bool, ...] = (False, True, True, True)
    patch_size: int = 1
    in_channels: int = 4
    temporal_kernel: int = 1


def _frames_as_images(x: torch.Tensor) -> torch.Tensor:
    """B,C,T,H,W -> B*T,C,1,H,W: every frame a one-frame clip."""
    b, c, t, h, w = x.shape
    return x.transpose(1, 2).reshape(b * t, c, 1, h, w)


def _images_as_frames(x: torch.Tensor, b: int) -> torch.Tensor:
    """B*T,C,1,H,W -> B,C,T,H,W (the inverse of `_frames_as_images`)."""
    bt, c, _, h, w = x.shape
    return x.reshape(b, bt // b, c, h, w).transpose(1, 2)


class Qwen21VAE(Wan22VAE):
    """The Qwen-Image 2.1 VAE: raw mu out, raw latent in; 64 channels, 16x spatial, every frame its own image."""

    family = "qwen21"
    spatial_factor = 16
    temporal_factor = 1
    latent_channels = 64
    latents_mean, latents_std = QWEN21_LATENT_MEAN, QWEN21_LATENT_STD
    config_class = Qwen21Config
    temporal_kernels = (1,)
    frames_are_images = True

    @classmethod
    def native_state_dict(cls, state_dict):
        """The Wan2.2 key layout (upstream or diffusers names) with one-frame convs, as 5-D weights."""
        native = super().native_state_dict(state_dict)
        if native is None or wan_layout.temporal_kernel(native) != 1:
            return None
        return wan_layout.with_frame_axis(native)

    def __init__(self, cfg: Qwen21Config = Qwen21Config()):
        super().__init__(cfg)
        self.temporal_factor = 1  # an image network, whatever its nominal temporal downsampling

    @staticmethod
    def _per_image(stages: list[Stage], x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        """`stages` on the frames of x (B,C,T,H,W) as images (each a first chunk: `frames_are_images`),
        then back to B,C',T,H',W'."""
        return _images_as_frames(run_stages(stages, _frames_as_images(x), ctx), x.shape[0])

    def encode_stages(self) -> list[Stage]:
        """One stage: every frame through the Wan2.2-layout encoder as an image."""
        return [partial(self._per_image, super().encode_stages())]

    def decode_stages(self) -> list[Stage]:
        return [partial(self._per_image, super().decode_stages())]
