"""MiniMax-H3's decoder: a ViT over the latent tokens of one tile of one clip (core's `ViT3DDecoder`).

A latent tile B,z,t,h,w becomes t*h*w tokens (linear `x_embedder`), followed by the register tokens and
one zero token; `layers` pre-norm blocks (RMSNorm, attention with per-head RMS-normed q and k and RoPE,
a gated SiLU feed-forward, each branch scaled per channel) run over all of them; a LayerNorm and a linear
`proj_out` turn each latent token into its 4x16x16 pixels (unpatchify). Token positions are the tile's
own: each axis spans [-1, 1] over the tile, so every tile of a clip has the same positions, and the
tiles of a clip can run as one batch (`MiniMaxH3Decoder.embed`, each of `transformer_blocks`, `unpatchify`
are the steps a run may interleave, e.g. one block over every tile before the next block's weights are read).

Token layout B,S,dim (S = t*h*w image tokens in t, h, w order, then the suffix); attention heads
B,heads,S,head_dim.
"""
import math
from collections.abc import Iterable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

from .config import MiniMaxH3Config


def token_positions(t: int, h: int, w: int, suffix: int, device) -> torch.Tensor:
    """(t*h*w + suffix, 3) float32: the image tokens' (t, y, x) at cell centres, each axis scaled to
    [-1, 1] over the tile; the suffix tokens at 0 (RoPE leaves them as they are)."""
    axes = [torch.arange(0.5, n, dtype=torch.float32, device=device) / n * 2 - 1 for n in (t, h, w)]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(t * h * w, 3)  # S_img,3
    return torch.cat([grid, grid.new_zeros(suffix, 3)])  # S,3


class MiniMaxH3Rope(nn.Module):
    """RoPE over 3 axes: `rope_dims / 6` frequencies theta^(-i / n) per axis, angles 2 pi x position x
    frequency, rotating channel k with channel k + rope_dims / 2 of each head (split-half pairs)."""

    def __init__(self, cfg: MiniMaxH3Config):
        super().__init__()
        self.pairs_per_axis, self.theta = cfg.rope_dims // 6, cfg.rope_theta  # no buffer: the loader builds on meta

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions S,3 -> (cos, sin), each S,rope_dims/2 float32 (axis-major: t's pairs, then y's, x's)."""
        n = self.pairs_per_axis
        inv_freq = 1 / self.theta ** (torch.arange(n, dtype=torch.float32, device=positions.device) / n)  # pairs
        angles = 2 * math.pi * positions[:, :, None] * inv_freq  # S,3,pairs
        angles = angles.flatten(1)  # S,3*pairs
        return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Split-half RoPE on the first 2 * cos.shape[-1] channels of x (B,heads,S,head_dim); the rest pass."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], dim=-1)


class MiniMaxH3Attention(nn.Module):
    """Self-attention over all tokens: `to_qkv` packs each head's q, k, v side by side (core's layout)."""

    def __init__(self, cfg: MiniMaxH3Config):
        super().__init__()
        self.heads, self.head_dim, self.eps = cfg.heads, cfg.head_dim, cfg.eps
        self.to_qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.to_out = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, s, dim = x.shape
        qkv = self.to_qkv(x).view(b, s, self.heads, 3, self.head_dim)  # B,S,heads,(q|k|v),head_dim
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)  # 3 x B,heads,S,head_dim
        q = rotate(F.rms_norm(q, (self.head_dim,), eps=self.eps), *rope)
        k = rotate(F.rms_norm(k, (self.head_dim,), eps=self.eps), *rope)
        out = F.scaled_dot_product_attention(q, k, v)  # B,heads,S,head_dim
        return self.to_out(out.transpose(1, 2).reshape(b, s, dim))  # B,S,heads*head_dim -> B,S,dim


class MiniMaxH3FeedForward(nn.Module):
    """w2(SiLU(gate) * value), gate and value the two halves of w1's output."""

    def __init__(self, cfg: MiniMaxH3Config):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, 2 * cfg.ff_mult * cfg.dim)
        self.w2 = nn.Linear(cfg.ff_mult * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.w1(x).chunk(2, dim=-1)  # 2 x B,S,ff_mult*dim
        return self.w2(F.silu(gate) * value)


class MiniMaxH3Block(nn.Module):
    """x + scale1 * attn(norm1(x)), then + scale2 * ff(norm2(x)) (RMSNorms with a weight)."""

    def __init__(self, cfg: MiniMaxH3Config):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.dim, eps=cfg.eps)
        self.attn = MiniMaxH3Attention(cfg)
        self.scale1 = nn.Parameter(torch.ones(cfg.dim))
        self.norm2 = nn.RMSNorm(cfg.dim, eps=cfg.eps)
        self.ff = MiniMaxH3FeedForward(cfg)
        self.scale2 = nn.Parameter(torch.ones(cfg.dim))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope) * self.scale1
        return x + self.ff(self.norm2(x)) * self.scale2


class MiniMaxH3Decoder(nn.Module):
    """Latent tiles B,z,t,h,w (after `post_quant_conv`) -> pixels B,out,4t,16h,16w, ImageNet-normalised."""

    def __init__(self, cfg: MiniMaxH3Config):
        super().__init__()
        self.config = cfg
        self.x_embedder = nn.Linear(cfg.z_channels, cfg.dim)
        self.register_tokens = nn.Parameter(torch.zeros(1, cfg.register_tokens, cfg.dim))
        self.register_buffer("mask_token", torch.zeros(1, 1, cfg.dim))  # in the file; unused at inference
        self.pos_embed = MiniMaxH3Rope(cfg)
        self.transformer_blocks = nn.ModuleList(MiniMaxH3Block(cfg) for _ in range(cfg.layers))
        self.norm_out = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.proj_out = nn.Linear(cfg.dim, cfg.patch_pixels * cfg.out_channels)

    def embed(self, z: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """z B,z,t,h,w -> (tokens B,S,dim, the RoPE (cos, sin) of the tile's positions)."""
        b, _, t, h, w = z.shape
        tokens = self.x_embedder(z.flatten(2).transpose(1, 2))  # B,t*h*w,dim
        suffix = torch.cat([self.register_tokens.to(tokens.dtype).expand(b, -1, -1),
                            tokens.new_zeros(b, 1, tokens.shape[-1])], dim=1)  # B,registers+1,dim
        rope = self.pos_embed(token_positions(t, h, w, suffix.shape[1], z.device))
        return torch.cat([tokens, suffix], dim=1), rope  # B,S,dim

    def unpatchify(self, tokens: torch.Tensor, t: int, h: int, w: int) -> torch.Tensor:
        """tokens B,S,dim -> pixels B,out,4t,16h,16w (the suffix tokens dropped)."""
        cfg = self.config
        b, p, pt = tokens.shape[0], cfg.spatial_factor, cfg.temporal_factor
        out = self.proj_out(self.norm_out(tokens[:, :t * h * w]))  # B,t*h*w,out*pt*p*p
        out = out.view(b, t, h, w, cfg.out_channels, pt, p, p)  # B,t,h,w,C,pt,p,p
        out = out.permute(0, 4, 1, 5, 2, 6, 3, 7)  # B,C,t,pt,h,p,w,p
        return out.reshape(b, cfg.out_channels, t * pt, h * p, w * p)  # B,C,T,H,W

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        tokens, rope = self.embed(z)
        for block in self.transformer_blocks:
            tokens = block(tokens, rope)
        return self.unpatchify(tokens, *z.shape[2:])

    def layer_major(self, tiles: Iterable[torch.Tensor], device: torch.device) -> Iterator[torch.Tensor]:
        """Batches of latent tiles B',z,t,h,w -> their pixels, in order, as `forward` gives them, but every
        batch through a transformer block before the next block: each block's weights, waiting in host
        memory (weights streamed), are copied to `device` once for all the batches, whose tokens are all
        held meanwhile."""
        held = [(*self.embed(z), z.shape[2:]) for z in tiles]  # per batch: tokens B',S,dim, RoPE, (t, h, w)
        for block in self.transformer_blocks:
            weights = {name: p if p.device == device else p.to(device, non_blocking=True)
                       for name, p in block.named_parameters()}
            held = [(functional_call(block, weights, (tokens, rope)), rope, thw) for tokens, rope, thw in held]
            del weights
        while held:
            tokens, _, thw = held.pop(0)
            yield self.unpatchify(tokens, *thw)
