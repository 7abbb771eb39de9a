"""The LTX-2.5 diffusion-decoder VAE's config (`LTX25Config`, core's `LTX_24_VAE_CONFIG` as its defaults) and
its decoder's blocks (`network.LTX25Decoder` puts them together), with the checkpoint's module names. Tokens are channels last: B,T,H,W,C over a 3-D grid of the stage (frames, rows, columns).

- `LTX25Attention`: fused qkv, per-head RMS norm of q and k, rotary positions per axis (absolute, the
  positions in the stage's whole grid), neighbourhood attention (`kernels.neighborhood`), output proj.
- `LTX25NABlock` (stages 1-4): pre-norm attention and SwiGLU MLP, plain residual adds.
- `LTX25DiffusionBlock` (stage 5): the stage-4 context added through `context_proj`, then attention and
  MLP with AdaLN-Zero scale and shift (their gates are folded into the weights upstream: ungated).
- `LTX25Upsample`: a linear to stride-volume times the output channels, pixel-shuffled channels last.

A block may compute part of its grid (`GridPart`): its input holds the tokens of a box of the whole grid,
and it gives the sub-box whose windows that input holds. Positions and window shifts are the whole
grid's, so the part equals the whole grid's tokens there.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...kernels import neighborhood
from ..ltx2.blocks import LTX2Config, LTXBlock

Axes = tuple[int, int, int]
NORM_EPS = 1e-6
ROPE_BASE = 10000.0
OUTPUT_TYPES = ("x0", "v")  # what the decoder predicts
MAX_SEED = 2 ** 64 - 1  # the largest seed of a torch generator (`noise_seed`; core's seed inputs go as far)


def swiglu_hidden(width: int) -> int:
    """The released SwiGLU's hidden width for a block of `width` channels (4x, rounded up to 16)."""
    return (int(width * 4.0) + 15) // 16 * 16


def _released_encoder() -> LTX2Config:
    """LTX-2's conv encoder as LTX-2.4/2.5 ship it (core's `LTX_24_VAE_CONFIG["encoder"]`)."""
    names = [("res_x", dict(num_layers=4)), ("compress_space_res", dict(multiplier=2)), ("res_x", dict(num_layers=6)),
             ("compress_time_res", dict(multiplier=2)), ("res_x", dict(num_layers=4)),
             ("compress_all_res", dict(multiplier=2)), ("res_x", dict(num_layers=2)),
             ("compress_all_res", dict(multiplier=1)), ("res_x", dict(num_layers=2))]
    return LTX2Config(encoder_blocks=tuple(LTXBlock(n, **p) for n, p in names), encoder_channels=128,
                      latent_log_var="constant", encoder_padding="zeros")


@dataclass(frozen=True)
class LTX25Config:
    """The released LTX-2.5 diffusion-decoder VAE (core's "LTX 2.4 diffusion VAE").

    Decoder stages 1-4 (`stage_*[i]`, i < 4): `stage_depths[i]` NA blocks of `stage_channels[i]` channels
    with windows `stage_kernels[i]`, then a linear pixel-shuffle upsample by `upsample_strides[i]` (t, h, w)
    to `stage_channels[i + 1]` channels. Stage 5: `stage_depths[-1]` diffusion NA blocks of
    `stage_channels[-1]` channels, windows `stage5_kernel`, on the `patch_size` x `patch_size` patchified
    pixels. `mlp_hidden[i]`: stage i's SwiGLU width. The encoder is LTX-2's (`encoder`, an LTX2Config of
    which only the encoder fields are used). `noise_seed`: the seed of the decoder's noise (core's is 0)."""

    encoder: LTX2Config = field(default_factory=_released_encoder)
    latent_channels: int = 128
    out_channels: int = 3
    patch_size: int = 4
    head_dim: int = 64
    stage_channels: tuple[int, ...] = (2048, 1024, 512, 512, 256)
    stage_depths: tuple[int, ...] = (4, 6, 4, 2, 8)
    stage_kernels: tuple[Axes, ...] = ((3, 7, 7), (3, 7, 7), (3, 5, 5), (3, 5, 5))
    upsample_strides: tuple[Axes, ...] = ((1, 2, 2), (2, 1, 1), (2, 2, 2), (2, 2, 2))
    stage5_kernel: Axes = (11, 11, 11)
    mlp_hidden: tuple[int, ...] = tuple(swiglu_hidden(c) for c in (2048, 1024, 512, 512, 256))
    t_emb_dim: int = 384
    timestep_channels: int = 256  # the sinusoidal embedding the timestep MLP reads
    num_inference_steps: int = 1
    timestep_scale_multiplier: float = 1000.0
    model_output_type: str = "x0"
    noise_seed: int = 0

    def __post_init__(self):
        if not 0 <= self.noise_seed <= MAX_SEED:  # its kind checked where a config is read (`vae.loading`)
            raise ValueError(f"ltx25 noise_seed must be an integer from 0 to {MAX_SEED} (a torch generator's seed; 0 "
                             f"gives core's frames), got {self.noise_seed!r}")

    @property
    def spatial_factor(self) -> int:
        return self.patch_size * math.prod(s[1] for s in self.upsample_strides)

    @property
    def temporal_factor(self) -> int:
        return math.prod(s[0] for s in self.upsample_strides)

    @property
    def trailing_frames(self) -> int:
        """Copies of the last latent frame appended before stage 1 and cropped after stage 4 (core's
        `trailing_pad_latent_frames`): the windows' border shift then falls on frames that are dropped."""
        return self.stage_kernels[0][0] // 2 * 2

    def stage_frames(self, latent_frames: int) -> list[int]:
        """Frames of each stage's grid for a clip of `latent_frames`: stages 1-4 (with the trailing copies),
        then stage 5 (the pixel frames). A temporal stride-2 upsample drops its duplicate leading frame."""
        frames = [latent_frames + self.trailing_frames]
        for stride in self.upsample_strides:
            frames.append(frames[-1] * stride[0] - (1 if stride[0] == 2 else 0))
        frames[-1] -= self.trailing_frames * self.temporal_factor
        return frames


@dataclass(frozen=True)
class GridPart:
    """A block's input x (B,t,h,w,C) holds the tokens [origin, origin + x's size) of its stage's grid
    `grid` (T,H,W); the block computes the box [keep, keep + size) of x."""

    grid: Axes
    origin: Axes
    keep: Axes
    size: Axes

    @staticmethod
    def whole(x: torch.Tensor) -> "GridPart":
        shape = tuple(x.shape[1:4])
        return GridPart(shape, (0, 0, 0), (0, 0, 0), shape)

    def kept(self, x: torch.Tensor) -> torch.Tensor:
        """The computed box of a tensor laid out like the block's input (B,t,h,w,...)."""
        return x[:, self.keep[0]:self.keep[0] + self.size[0], self.keep[1]:self.keep[1] + self.size[1],
                 self.keep[2]:self.keep[2] + self.size[2]]


def draw_noise(shape, seed: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Core's x_t: standard normal values of `shape` from a generator on `device` seeded with `seed` (on the
    meta device, which has no generator, a tensor of that shape: the benchmarks count memory there)."""
    if torch.device(device).type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return torch.randn(shape, dtype=dtype, device=device, generator=generator)


def sampling_step(x_t: torch.Tensor, out: torch.Tensor, timesteps: torch.Tensor, step: int, x0: bool) -> torch.Tensor:
    """After pass `step` (of `timesteps`, from 1 down) of the noised pixels x_t (B,3,T,H,W), whose prediction
    is `out` (x0 with `x0`, else v): an Euler step along the straight path to the next pass's x_t, or after
    the last pass the output pixels, in x_t's dtype (upstream's sampling loop)."""
    t = timesteps[step]
    if step + 1 < len(timesteps):
        velocity = (x_t.float() - out.float()) / t if x0 else out.float()
        return (x_t.float() - (t - timesteps[step + 1]) * velocity).to(x_t.dtype)
    return out if x0 else (x_t.float() - t * out.float()).to(x_t.dtype)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """B,C,T,H,W pixels -> B,T,H/p,W/p,C*p*p tokens, channel order (C, column offset, row offset) (upstream's)."""
    b, c, t, h, w = x.shape
    x = x.reshape(b, c, t, h // p, p, w // p, p)  # B,C,T,h,q,w,r
    return x.permute(0, 2, 3, 5, 1, 6, 4).reshape(b, t, h // p, w // p, c * p * p)  # B,T,h,w,C,r,q -> B,T,h,w,C*p*p


def unpatchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """Inverse of `patchify`: B,T,h,w,C*p*p -> B,C,T,h*p,w*p."""
    b, t, h, w, cpp = x.shape
    x = x.view(b, t, h, w, cpp // (p * p), p, p)  # B,T,h,w,C,r,q
    return x.permute(0, 4, 1, 2, 6, 3, 5).reshape(b, cpp // (p * p), t, h * p, w * p)  # B,C,T,h,q,w,r -> B,C,T,H,W


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMS norm over the last axis, in x's dtype (core's `rms_norm`)."""
    return F.rms_norm(x, (x.shape[-1],), weight=weight.to(x.dtype), eps=NORM_EPS)


class LTX25RMSNorm(nn.Module):
    """A learned per-channel gain after the RMS norm (keys `<name>.weight`)."""

    def __init__(self, channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight)


def rope_split(head_dim: int) -> Axes:
    """How many of a head's channels rotate with t, h and w (whole pairs, a quarter to t), as upstream."""
    d_t = head_dim // 4 // 2 * 2
    d_hw = (head_dim - d_t) // 2
    if d_hw % 2:
        d_t -= 2
        d_hw = (head_dim - d_t) // 2
    return d_t, d_hw, d_hw


def rope_angles(head_dim: int, origin: Axes, size: Axes, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each t,h,w,head_dim/2 float32: the rotation of every channel pair of the tokens
    [origin, origin + size) of the grid; pairs [0, d_t/2) turn with t, then h, then w."""
    parts = []
    for axis, (dim, start, n) in enumerate(zip(rope_split(head_dim), origin, size)):
        exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        inverse = (1.0 / torch.pow(torch.tensor(ROPE_BASE, dtype=torch.float64), exponents)).float().to(device)
        angles = torch.arange(start, start + n, dtype=torch.float32, device=device)[:, None] * inverse  # n, dim/2
        shape = [1, 1, 1, dim // 2]
        shape[axis] = n
        parts.append(angles.view(shape).expand(*size, dim // 2))
    angles = torch.cat(parts, dim=-1)  # t,h,w,head_dim/2
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (2i, 2i+1) of every head's channels (x: B,t,h,w,heads,D) in float32."""
    pairs = x.float().unflatten(-1, (-1, 2))  # B,t,h,w,heads,D/2,2
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[:, :, :, None], sin[:, :, :, None]  # t,h,w,1,D/2: the same for every head
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2).to(x.dtype)


class LTX25Attention(nn.Module):
    """Neighbourhood self-attention over the tokens of a grid (keys `attn.qkv`, `attn.proj`, `attn.q_norm`,
    `attn.k_norm`): B,t,h,w,C in (the block's input box), B,t',h',w',C out (its `GridPart` box)."""

    def __init__(self, width: int, kernel: Axes, head_dim: int):
        super().__init__()
        self.heads, self.head_dim, self.kernel = width // head_dim, head_dim, tuple(kernel)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.q_norm = LTX25RMSNorm(head_dim)
        self.k_norm = LTX25RMSNorm(head_dim)

    def forward(self, x: torch.Tensor, part: GridPart) -> torch.Tensor:
        b, t, h, w, c = x.shape
        # B,t,h,w,3C -> B,t,h,w,3,heads,D -> 3 x B,t,h,w,heads,D
        q, k, v = self.qkv(x).view(b, t, h, w, 3, self.heads, self.head_dim).unbind(4)
        q = part.kept(q)
        q_origin = tuple(o + s for o, s in zip(part.origin, part.keep))
        # the score scale goes into q's norm gain, as upstream (then attention with scale 1)
        q = rotate(rms_norm(q, self.q_norm.weight * self.head_dim ** -0.5), *rope_angles(self.head_dim, q_origin, part.size, x.device))
        k = rotate(rms_norm(k, self.k_norm.weight), *rope_angles(self.head_dim, part.origin, (t, h, w), x.device))
        out = neighborhood.na3d(q, k, v, self.kernel, q_origin, part.origin, part.grid, scale=1.0)
        return self.proj(out.flatten(-2))  # B,t',h',w',heads,D -> B,t',h',w',C -> proj


# Tokens per step of the SwiGLU: its hidden activations (4x the width, twice) of a step stay in a CPU's cache
# and are not held for a whole band. Measured (2 cores, AVX-512, float32): stage 5's MLP on 17 x 32 x 32 tokens
# 1.4x faster than in one step (0.212 -> 0.151 s; 1024 tokens 0.133 s, 1.05x slower at stage 4's width).
MLP_TOKENS = 4096


class LTX25SwiGLU(nn.Module):
    """w_down(silu(w_gate(x)) * w_up(x)) per token (keys `mlp.w_up`, `mlp.w_gate`, `mlp.w_down`), MLP_TOKENS
    tokens at a time. ...,C in, ...,C out."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.w_up = nn.Linear(width, hidden, bias=False)
        self.w_gate = nn.Linear(width, hidden, bias=False)
        self.w_down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # ...,C -> N,C
        out = torch.empty_like(tokens)
        for start in range(0, tokens.shape[0], MLP_TOKENS):
            step = tokens[start:start + MLP_TOKENS]
            out[start:start + MLP_TOKENS] = self.w_down(F.silu(self.w_gate(step)) * self.w_up(step))
        return out.view(x.shape)  # N,C -> ...,C


class LTX25NABlock(nn.Module):
    """x + attn(norm1(x)), then + mlp(norm2(.)): a stage 1-4 block. B,t,h,w,C in, its part's box out."""

    def __init__(self, width: int, kernel: Axes, head_dim: int, hidden: int):
        super().__init__()
        self.norm1 = LTX25RMSNorm(width)
        self.attn = LTX25Attention(width, kernel, head_dim)
        self.norm2 = LTX25RMSNorm(width)
        self.mlp = LTX25SwiGLU(width, hidden)

    def forward(self, x: torch.Tensor, part: GridPart | None = None) -> torch.Tensor:
        part = part or GridPart.whole(x)
        x = part.kept(x) + self.attn(self.norm1(x), part)
        return x + self.mlp(self.norm2(x))


# The AdaLN-Zero chunks of the shared modulation (upstream makes 7; the gates are folded into the weights).
MODULATION_CHUNKS = 7
SCALE_MSA, SHIFT_MSA, SCALE_MLP, SHIFT_MLP = 0, 1, 3, 4


def modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return x * (1.0 + scale) + shift


class LTX25DiffusionBlock(nn.Module):
    """A stage-5 block: x + context_proj(context), then attention and MLP on the RMS-normed tokens
    modulated by the shared AdaLN values plus the block's `scale_shift_table`. x and context B,t,h,w,C
    (the same box), `modulation` MODULATION_CHUNKS x (B,1,1,1,C); its part's box out."""

    def __init__(self, width: int, kernel: Axes, head_dim: int, hidden: int):
        super().__init__()
        self.context_proj = nn.Linear(width, width)
        self.scale_shift_table = nn.Parameter(torch.zeros(MODULATION_CHUNKS, width))
        self.norm1 = LTX25RMSNorm(width)
        self.attn = LTX25Attention(width, kernel, head_dim)
        self.norm2 = LTX25RMSNorm(width)
        self.mlp = LTX25SwiGLU(width, hidden)

    def forward(self, x: torch.Tensor, context: torch.Tensor, modulation: tuple[torch.Tensor, ...],
                part: GridPart | None = None) -> torch.Tensor:
        return self.with_context_added(x + self.context_proj(context), modulation, part)

    def with_context_added(self, x: torch.Tensor, modulation: tuple[torch.Tensor, ...],
                           part: GridPart | None = None) -> torch.Tensor:
        """The block after its context's addition: x (B,t,h,w,C) is x + context_proj(context)."""
        part = part or GridPart.whole(x)
        mod = [modulation[i] + self.scale_shift_table[i].view(1, 1, 1, 1, -1) for i in range(MODULATION_CHUNKS)]
        x = part.kept(x) + self.attn(modulate(self.norm1(x), mod[SCALE_MSA], mod[SHIFT_MSA]), part)
        return x + self.mlp(modulate(self.norm2(x), mod[SCALE_MLP], mod[SHIFT_MLP]))


class LTX25Upsample(nn.Module):
    """B,t,h,w,C -> B,t*st,h*sh,w*sw,C' (keys `upsamples.i.proj`): a linear to st*sh*sw*C' channels, each
    token's channels spread over its (st, sh, sw) block, channel order (C', st, sh, sw). Where st is 2
    and the clip's first frame is in the input, its first output frame (a duplicate) is dropped
    (`drop_first`)."""

    def __init__(self, width: int, out_width: int, stride: Axes):
        super().__init__()
        self.stride, self.out_width = tuple(stride), out_width
        self.proj = nn.Linear(width, out_width * stride[0] * stride[1] * stride[2])

    def forward(self, x: torch.Tensor, drop_first: bool = True) -> torch.Tensor:
        b, t, h, w, _ = x.shape
        st, sh, sw = self.stride
        y = self.proj(x).view(b, t, h, w, self.out_width, st, sh, sw)
        # B,t,h,w,C',st,sh,sw -> B,t,st,h,sh,w,sw,C' -> B,t*st,h*sh,w*sw,C'
        y = y.permute(0, 1, 5, 2, 6, 3, 7, 4).reshape(b, t * st, h * sh, w * sw, self.out_width)
        return y[:, 1:] if st == 2 and drop_first else y


class LTX25TimestepEmbedder(nn.Module):
    """A timestep (B,) -> B,t_emb: [cos, sin] of t * 10000^(-k/half), then linear, SiLU, linear (keys
    `t_embedder.mlp.0`, `t_embedder.mlp.2`)."""

    def __init__(self, channels: int, width: int):
        super().__init__()
        self.channels = channels
        self.mlp = nn.Sequential(nn.Linear(channels, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        half = self.channels // 2
        exponent = -math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half
        angles = t.float()[:, None] * torch.exp(exponent)[None, :]
        return self.mlp(torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1).to(dtype))


class LTX25AdaLN(nn.Module):
    """The shared modulation: B,t_emb -> MODULATION_CHUNKS x (B,1,1,1,C) (keys `shared_adaln.proj`)."""

    def __init__(self, width: int, t_emb_dim: int):
        super().__init__()
        self.proj = nn.Linear(t_emb_dim, MODULATION_CHUNKS * width)

    def forward(self, t_emb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(c[:, None, None, None, :] for c in self.proj(F.silu(t_emb)).chunk(MODULATION_CHUNKS, dim=-1))
