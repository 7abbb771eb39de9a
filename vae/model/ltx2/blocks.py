"""The LTX VAE's blocks (`vae/model/ltx2/network.py` puts them together): the conv wrapper and how each half pads
(`ConvKind`), the pixel norm with its optional timestep conditioning (`PixelNormAct`), the residual
block and its group, the encoder's space-to-depth and the decoder's depth-to-space resamplers, the
timestep MLP. Layout B,C,T,H,W; every block takes the run's `blocks.RunState`.

Where the decoder's convs look ahead in time (`ConvKind.lookahead`), a block's shortcut waits for its
branch in the run's cache (`layers.lagged`), and a resampler's rule on the clip's frame 0 counts the
frames it has given (`CausalCache.advance`): such a block meets its frame 0 on a later call than the
first when the layers before it wait for their next frame.
"""
import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...kernels.activation_layout import cat_frames, empty_video
from ...kernels.norm_act import pixel_norm_act
from ..blocks import CausalConv3d, Conv3d
from ..execution import RunState
from ..layers import lagged, residual_add
from ..video_vae import Stage

STRIDES = {"time": (2, 1, 1), "space": (1, 2, 2), "all": (2, 2, 2)}
PIXEL_NORM_EPS = 1e-8
TIMESTEP_CHANNELS = 256  # the sinusoidal timestep embedding the conditioning MLPs read


@dataclass(frozen=True)
class LTXBlock:
    """One entry of upstream's block list (`encoder_blocks` / `decoder_blocks` of its config).

    `name`: "res_x" (`num_layers` residual blocks at one width), "res_x_y" (one residual block that
    changes the width by `multiplier`: encoder x, decoder /), "compress_<time|space|all>" (encoder: a
    strided conv, width x `multiplier`; decoder: depth-to-space, width / `multiplier`, plus the
    rearranged input where `residual`) or "compress_<...>_res" (encoder space-to-depth, width x
    `multiplier`). `inject_noise`: a decoder res_x adds noise maps after its convs."""

    name: str
    num_layers: int = 1
    multiplier: int = 1
    residual: bool = False
    inject_noise: bool = False

    @property
    def stride(self) -> tuple[int, int, int]:
        return STRIDES[self.name.split("_")[1]] if self.name.startswith("compress_") else (1, 1, 1)


def seeded_normal(shape, seed: int, stream: int, index: int) -> torch.Tensor:
    """Standard normal values (float32, CPU) of `shape` from a generator of its own for (seed, stream,
    index): what a frame or a layer draws does not depend on what else is drawn, or in which order."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + stream) * 1_000_003 + index)
    return torch.randn(shape, generator=g)


class PixelNormAct:
    """SiLU(pixel_norm(x) * (1 + scale) + shift) for a conv's `norm=` (the norm protocol of
    `layers.RMSNorm`): per position, so tiles need no whole-frame statistics; `stats` hands the
    conditioning (`scale_shift(x)` -> per-channel (scale, shift), or None) to every tile at once."""

    def __init__(self, scale_shift=None):
        self.scale_shift = scale_shift

    def stats(self, x: torch.Tensor, ctx: RunState):
        return self.scale_shift(x) if self.scale_shift is not None else None

    def part_moments(self, x, ctx):
        return None

    def stats_of_parts(self, parts, ctx):
        return None

    def act(self, x: torch.Tensor, ctx: RunState, out: torch.Tensor | None = None, stats=None) -> torch.Tensor:
        scale, shift = stats if stats is not None else self.stats(x, ctx) or (None, None)
        return pixel_norm_act(x, PIXEL_NORM_EPS, scale, shift, act=True, out=out)


PIXEL_NORM = PixelNormAct()


class LTXConv(nn.Module):
    """Upstream's conv wrapper (keys `<name>.conv.weight`): the causal conv as `conv`."""

    def __init__(self, conv: CausalConv3d):
        super().__init__()
        self.conv = conv


@dataclass(frozen=True)
class ConvKind:
    """How one half's 3x3x3 convs pad: in time (`lookahead` 0: causal, frame 0 repeated twice; 1: centred,
    both ends repeated) and in space (`padding`: zeros or reflect)."""

    lookahead: int
    padding: str

    def __call__(self, cin: int, cout: int, stride=1) -> LTXConv:
        return LTXConv(CausalConv3d(cin, cout, 3, stride, head="replicate", lookahead=self.lookahead,
                                    padding_mode=self.padding))


class LTXLayerNorm(nn.Module):
    """LayerNorm over the channels at every position (keys `norm3.norm.*`): a width-changing residual
    block's shortcut."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.LayerNorm(channels, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.movedim(1, -1), self.norm.normalized_shape, self.norm.weight, self.norm.bias,
                            self.norm.eps).movedim(-1, 1)  # B,T,H,W,C -> B,C,T,H,W


class LTXTimestepMLP(nn.Module):
    """linear_1, SiLU, linear_2 over the sinusoidal embedding of a timestep (`timestep_embedder`)."""

    def __init__(self, width: int):
        super().__init__()
        self.linear_1 = nn.Linear(TIMESTEP_CHANNELS, width)
        self.linear_2 = nn.Linear(width, width)


class LTXTimeEmbedder(nn.Module):
    """The decode timestep -> per-channel conditioning values (keys `time_embedder.timestep_embedder.*`)."""

    def __init__(self, width: int):
        super().__init__()
        self.timestep_embedder = LTXTimestepMLP(width)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """t (1,) scaled timestep -> (1, width): cos then sin of t * 10000^(-k/128), k < 128, through the MLP."""
        half = TIMESTEP_CHANNELS // 2
        freqs = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device) * (-math.log(10000.0) / half))
        angles = t.float()[:, None] * freqs[None]
        mlp = self.timestep_embedder
        sinusoid = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1).to(mlp.linear_1.weight.dtype)
        return mlp.linear_2(F.silu(mlp.linear_1(sinusoid)))


class LTXResnetBlock(nn.Module):
    """conv2(SiLU(norm(conv1(SiLU(norm(x)))))) + shortcut(x), upstream's `ResnetBlock3D` on B,C,T,H,W.

    Conditioned (a 0.9.1-0.9.8 decoder): the norms are followed by (1 + scale) and + shift, from the
    block's `scale_shift_table` plus its group's timestep embedding. `inject_noise`: after each conv a
    noise map of the frame's size (the same for every frame) times `per_channel_scale1/2`. A width
    change puts LayerNorm + a 1x1x1 conv on the shortcut. Where the convs look ahead the shortcut
    waits for the branch (`layers.lagged`)."""

    def __init__(self, cin: int, cout: int, conv: ConvKind, conditioned=False, noise: tuple[int, int] | None = None):
        super().__init__()
        self.conv1, self.conv2 = conv(cin, cout), conv(cout, cout)
        self.lag = conv.lookahead > 0
        self.noise = noise  # (seed, index of this block's first noise map) or None
        if noise is not None:
            self.per_channel_scale1 = nn.Parameter(torch.zeros(cin, 1, 1))
            self.per_channel_scale2 = nn.Parameter(torch.zeros(cin, 1, 1))
        if conditioned:
            self.scale_shift_table = nn.Parameter(torch.zeros(4, cin))
        if cin != cout:
            self.norm3 = LTXLayerNorm(cin)
            self.conv_shortcut = Conv3d(cin, cout, 1)

    def _noised(self, h: torch.Tensor, which: int) -> torch.Tensor:
        """h + a noise map of h's frame size (1,1,1,H,W) times the per-channel scale `which` (1 or 2)."""
        seed, first = self.noise
        noise = seeded_normal(h.shape[3:], seed, 1, first + which - 1).to(device=h.device, dtype=h.dtype)
        scale = getattr(self, f"per_channel_scale{which}").to(h.dtype)  # C,1,1
        return h.add_((noise * scale)[None, :, None])  # 1,C,1,H,W

    def forward(self, x: torch.Tensor, ctx: RunState, embedding=None) -> torch.Tensor:
        norm1 = norm2 = PIXEL_NORM
        if embedding is not None:  # (1, 4C) from the group: shift1, scale1, shift2, scale2
            values = embedding(x.dtype).view(4, -1) + self.scale_shift_table.to(x.dtype)
            norm1 = PixelNormAct(lambda _: (values[1], values[0]))
            norm2 = PixelNormAct(lambda _: (values[3], values[2]))
        h = self.conv1.conv(x, ctx, norm=norm1)
        if self.noise is not None and h.shape[2]:
            h = self._noised(h, 1)
        h = self.conv2.conv(h, ctx, norm=norm2)
        if self.noise is not None and h.shape[2]:
            h = self._noised(h, 2)
        skip = x
        if hasattr(self, "conv_shortcut"):  # (a call may get no frames while the layers before it wait)
            skip = self.conv_shortcut(self.norm3(x), ctx) if x.shape[2] else h[:, :, :0]
        if self.lag:
            skip = lagged(ctx, self, skip, h.shape[2])
        return residual_add(h, skip, ctx)


class LTXResGroup(nn.Module):
    """`num_layers` residual blocks at one width (upstream's `UNetMidBlock3D`, keys `res_blocks.i`), and
    in a conditioned decoder the group's `time_embedder`."""

    def __init__(self, channels: int, block: LTXBlock, conv: ConvKind, conditioned=False, noise=None):
        super().__init__()
        self.res_blocks = nn.ModuleList([
            LTXResnetBlock(channels, channels, conv, conditioned, None if noise is None else (noise[0], noise[1] + 2 * i))
            for i in range(block.num_layers)])
        if conditioned:
            self.time_embedder = LTXTimeEmbedder(4 * channels)

    def stages(self, timestep=None) -> list[Stage]:
        """Its residual blocks; conditioned, each with the group's embedding of `timestep(dtype)`."""
        if timestep is None or not hasattr(self, "time_embedder"):
            return list(self.res_blocks)

        def embedding(dtype: torch.dtype) -> torch.Tensor:
            return self.time_embedder(timestep(dtype))

        return [partial(block, embedding=embedding) for block in self.res_blocks]


def space_to_depth(x: torch.Tensor, stride) -> torch.Tensor:
    """b c (t p) (h q) (w r) -> b (c p q r) t h w (channel order c, then the time, row, column offsets)."""
    b, c, t, h, w = x.shape
    p, q, r = stride
    out = empty_video(x, (b, c * p * q * r, t // p, h // q, w // r))  # in x's layout
    out.unflatten(1, (c, p, q, r)).copy_(  # b c p q r t h w
        x.unflatten(4, (w // r, r)).unflatten(3, (h // q, q)).unflatten(2, (t // p, p)).permute(0, 1, 3, 5, 7, 2, 4, 6))
    return out


def depth_to_space(x: torch.Tensor, stride) -> torch.Tensor:
    """Inverse of `space_to_depth`: b (c p q r) t h w -> b c (t p) (h q) (w r)."""
    b, cpqr, t, h, w = x.shape
    p, q, r = stride
    c = cpqr // (p * q * r)
    out = empty_video(x, (b, c, t * p, h * q, w * r))  # in x's layout
    out.unflatten(4, (w, r)).unflatten(3, (h, q)).unflatten(2, (t, p)).copy_(  # b c t p h q w r
        x.unflatten(1, (c, p, q, r)).permute(0, 1, 5, 2, 6, 3, 7, 4))
    return out


class LTXSpaceToDepth(nn.Module):
    """Encoder downsampler (`compress_*_res`): space_to_depth(conv(x)) + the mean of consecutive channel
    groups of space_to_depth(x), B,Cin,T,H,W -> B,Cout,T/p,H/q,W/r. Temporal: frame 0 is repeated
    first and frames wait in `ctx.cache` until they pair up."""

    def __init__(self, cin: int, block: LTXBlock, conv: ConvKind):
        super().__init__()
        self.stride, self.cout = block.stride, cin * block.multiplier
        volume = self.stride[0] * self.stride[1] * self.stride[2]
        self.group = cin * volume // self.cout
        self.conv = conv(cin, self.cout // volume)

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        p = self.stride[0]
        if p > 1:
            held = ctx.cache.pop(self)
            x = cat_frames(([x[:, :, :1]] if ctx.first_chunk else []) + ([held] if held is not None else []) + [x])
            usable = x.shape[2] - x.shape[2] % p
            if usable < x.shape[2]:
                ctx.cache.put(self, x[:, :, usable:])
            x = x[:, :, :usable]
        b, _, t, h, w = x.shape
        if t == 0:
            return empty_video(x, (b, self.cout, 0, h // self.stride[1], w // self.stride[2]))
        skip = space_to_depth(x, self.stride).unflatten(1, (self.cout, self.group)).mean(2)  # B,Cout,...
        return residual_add(space_to_depth(self.conv.conv(x, ctx), self.stride), skip, ctx)


class LTXDepthToSpace(nn.Module):
    """Decoder upsampler (`compress_*`): depth_to_space(conv(x)), B,Cin,T,H,W -> B,Cin/m,T*p,H*q,W*r, plus
    with `residual` depth_to_space(x) repeated over the channels (waiting for the conv where it looks
    ahead); a temporal one drops the clip's first frame."""

    def __init__(self, cin: int, block: LTXBlock, conv: ConvKind):
        super().__init__()
        self.stride, self.residual, self.lag = block.stride, block.residual, conv.lookahead > 0
        volume = self.stride[0] * self.stride[1] * self.stride[2]
        self.repeats = volume // block.multiplier
        self.conv = conv(cin, volume * cin // block.multiplier)

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        y = depth_to_space(self.conv.conv(x, ctx), self.stride)
        if self.residual:
            skip = depth_to_space(x, self.stride).repeat(1, self.repeats, 1, 1, 1)
            if self.lag:
                skip = lagged(ctx, self, skip, y.shape[2])
            y = residual_add(y, skip, ctx)
        if self.stride[0] > 1 and y.shape[2] and ctx.cache.advance((self, "frames"), y.shape[2]) == 0:
            y = y[:, :, 1:]  # the clip's frame 0 becomes one frame, not two
        return y


LOG_VARIANCES = ("uniform", "per_channel", "constant", "none")
PADDINGS = ("zeros", "reflect")


def _blocks(*entries) -> tuple[LTXBlock, ...]:
    return tuple(LTXBlock(name, **params) for name, params in entries)


@dataclass(frozen=True)
class LTX2Config:
    """The released LTX-2 VAE; every size is read from a checkpoint's weights (`checkpoint.read`),
    what the weights cannot say from its metadata config. Decoder blocks are in the order they run
    (upstream lists them in the encoder's order)."""

    encoder_blocks: tuple[LTXBlock, ...] = _blocks(
        ("res_x", dict(num_layers=4)), ("compress_space_res", dict(multiplier=2)), ("res_x", dict(num_layers=6)),
        ("compress_time_res", dict(multiplier=2)), ("res_x", dict(num_layers=6)), ("compress_all_res", dict(multiplier=2)),
        ("res_x", dict(num_layers=2)), ("compress_all_res", dict(multiplier=2)), ("res_x", dict(num_layers=2)))
    decoder_blocks: tuple[LTXBlock, ...] = _blocks(
        ("res_x", dict(num_layers=5)), ("compress_all", dict(multiplier=2, residual=True)), ("res_x", dict(num_layers=5)),
        ("compress_all", dict(multiplier=2, residual=True)), ("res_x", dict(num_layers=5)),
        ("compress_all", dict(multiplier=2, residual=True)), ("res_x", dict(num_layers=5)))
    latent_channels: int = 128
    in_channels: int = 3           # image channels, before the patchify; the decoder gives as many
    patch_size: int = 4
    encoder_channels: int = 128    # encoder.conv_in's output width
    decoder_channels: int = 1024   # decoder.conv_in's output width
    latent_log_var: str = "uniform"  # the encoder's log-variance channels: 1 shared (uniform), C, -30, none
    causal_decoder: bool = False
    timestep_conditioning: bool = False
    encoder_padding: str = "zeros"
    decoder_padding: str = "reflect"
    decode_timestep: float = 0.05
    decode_noise_scale: float = 0.025
    noise_seed: int = 0

    @property
    def spatial_factor(self) -> int:
        return self.patch_size * 2 ** sum(b.stride[1] == 2 for b in self.encoder_blocks)

    @property
    def temporal_factor(self) -> int:
        return 2 ** sum(b.stride[0] == 2 for b in self.encoder_blocks)
