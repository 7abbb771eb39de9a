"""`MiniMaxH3VAE`: the MiniMax-H3 video VAE (core 0.33.0's `MiniMaxH3VideoVAE`, comfy/ldm/minimax/vae.py, with
its module and key names) as a `VideoVAE`: a 3-D causal CNN encoder (`causal_cnn.py`) and a ViT3D decoder
(`vit3d.py`), each run on batches of tiles of one clip (`encode_tiles`, `decode_tile_batches`).

The decoder was trained on 256 px tiles of 17-frame clips, so core's tiles and clip blending (`tiles.py`,
`tiled.py`) are the model's function, not an execution choice: the engine hands the model the whole clip in
one chunk (`ClipExtent.OWN_TILES`, capability OWN_TILES) and takes its output clip by clip
(`own_tile_pieces`), the tiles of a clip run a batch at a time and the transformer blocks' weights resident
or streamed from host memory as the plan says (`execution.OwnTiles`), with core's frame counts
(`frames_made`), which follow no 4n+1 rule (17 frames encode to 2 latent frames, 6 latent frames decode to
18 frames).

Pixels: StreamVAE's [-1, 1] (B,3,T,H,W), ImageNet-normalised inside (`normalize_pixels`, `finish_pixels`);
core's frames are (y + 1) / 2 clamped to [0, 1]. Latents: raw (B,24,T',h,w); core's LATENT is normalised by
the latent statistics (`to_model_space`, `comfy_latent_in_model_space`).
"""
from collections.abc import Iterator

import torch
import torch.nn as nn

from ..execution import OwnTiles
from ..video_vae import ClipExtent, OwnTileWork, Stage, VideoVAE
from . import checkpoint, tiled
from .causal_cnn import MiniMaxH3Encoder
from .config import IMAGENET_MEAN, IMAGENET_STD, MiniMaxH3Config
from .tiles import TileGrid, decode_plan, encode_plan
from .vit3d import MiniMaxH3Decoder


def _channels(values: tuple[float, ...], like: torch.Tensor) -> torch.Tensor:
    """Per-channel constants 1,C,1,1,1 on `like`'s device, float32 (no buffer: the loader builds on meta)."""
    return torch.tensor(values, dtype=torch.float32, device=like.device).view(1, -1, 1, 1, 1)


class MiniMaxH3VAE(VideoVAE):
    family = "minimax_h3"
    spatial_factor = 16
    temporal_factor = 4
    latent_channels = 24
    probe_keys = checkpoint.PROBE_KEYS
    comfy_latent_in_model_space = True  # core's LATENT: (mean - latents_mean) / latents_std

    def __init__(self, cfg: MiniMaxH3Config = MiniMaxH3Config()):
        super().__init__()
        self.config = cfg
        self.spatial_factor, self.temporal_factor = cfg.spatial_factor, cfg.temporal_factor
        self.latent_channels, self.in_channels, self.out_channels = cfg.embed_dim, cfg.in_channels, cfg.out_channels
        self.encoder = MiniMaxH3Encoder(cfg)
        self.quant_conv = nn.Conv3d(2 * cfg.z_channels, 2 * cfg.embed_dim, 1)
        self.post_quant_conv = nn.Conv3d(cfg.embed_dim, cfg.z_channels, 1)
        self.decoder = MiniMaxH3Decoder(cfg)
        self.register_buffer("latents_mean", torch.zeros(cfg.embed_dim))
        self.register_buffer("latents_std", torch.ones(cfg.embed_dim))

    # --- the checkpoint -------------------------------------------------------------------------
    @classmethod
    def native_state_dict(cls, state_dict: dict) -> dict | None:
        """The file as it is, with core's latent statistics where it has none; None for another layout or
        the int8 file (`refusal` says what to load instead)."""
        if not all(k in state_dict for k in cls.probe_keys) or checkpoint.quantized_layers(state_dict):
            return None
        return checkpoint.with_statistics(state_dict)

    @classmethod
    def refusal(cls, state_dict: dict) -> str | None:
        """The int8 (convrot) file: what to load instead."""
        quantized = checkpoint.quantized_layers(state_dict)
        if not quantized:
            return None
        return (f"this is the int8 (convrot) MiniMax-H3 VAE ({len(quantized)} quantized layers, e.g. {quantized[0]}); "
                "StreamVAE runs the full-precision file: load the bf16/fp32 MiniMax-H3 VAE (or decode this one with "
                "core's Load VAE)")

    @classmethod
    def config_from_state_dict(cls, state_dict: dict, overrides: dict) -> MiniMaxH3Config:
        return checkpoint.config_from_state_dict(state_dict, **overrides)

    # --- what the engine runs: the whole clip over the model's own tiles and clips ----------------
    def clip_extent(self, op: str) -> ClipExtent:
        return ClipExtent.OWN_TILES  # core's tiles and clips, blended, are the model's function

    def own_tile_pieces(self, op: str, x: torch.Tensor, ctx) -> Iterator[torch.Tensor]:
        """Pixels B,3,T,H,W -> moments B,48,t,h,w per clip (encode); raw latent B,24,T',h,w -> pixels
        B,3,n,H,W per clip (decode), each clip's frames once final; each clip's tiles as the run says
        (`RunState.own_tile_clip`)."""
        run = tiled.encoded_clips if op == "encode" else tiled.decoded_clips
        return run(self, x, ctx.own_tile_clip, ctx.step)

    def own_tile_work(self, op: str, input_shape: tuple[int, ...]) -> OwnTileWork:
        """Per clip: its tiles; one tile's pixel frames (decode: the 4 x its latent frames it makes, before
        the clip keeps its frames; encode: the clip's 17 frames it reads); the clip's blended frames (decode:
        the most any clip keeps; encode: the 17 frames it reads)."""
        cfg, (b, _, t, h, w) = self.config, input_shape
        if op == "decode":
            plan = decode_plan(t, cfg)
            h, w = h * cfg.spatial_factor, w * cfg.spatial_factor
            tile_frames = max(clip.tokens for clip in plan.clips) * cfg.temporal_factor
            clip_frames = max(len(clip.raw_frames) for clip in plan.clips)
            clips = sum(bool(clip.raw_frames) for clip in plan.clips)
        else:
            plan = encode_plan(t, cfg)
            clips, tile_frames = plan.clips, len(plan.clip_frames(0))
            clip_frames = tile_frames
        grid = TileGrid.of(h, w, cfg)
        return OwnTileWork(clips, len(grid.tiles), b * tile_frames * grid.rows.size * grid.cols.size,
                           b * clip_frames * h * w)

    def streamed_modules(self, op: str) -> list[nn.Module]:
        """The decoder's transformer blocks (nearly all of its weights: 4.83 of 4.85 GB in bf16)."""
        return list(self.decoder.transformer_blocks) if op == "decode" else []

    def frames_made(self, op: str, frames: int) -> int:
        """Core's frame counts: the latent frames `encode` makes of `frames` pixel frames, the pixel frames
        `decode` makes of `frames` latent frames."""
        if op == "encode":
            return encode_plan(frames, self.config).latent_frames
        return decode_plan(frames, self.config).frames

    def frames_kept(self, frames: int) -> int:
        return frames  # core completes the last clip with copies of the last frame: every frame is read

    def encode_stages(self) -> list[Stage]:
        # pixels B,3,T,H,W (the clip) -> moments B,48,T',h,w
        return [lambda x, ctx: torch.cat(list(self.own_tile_pieces("encode", x, ctx)), dim=2)]

    def decode_stages(self) -> list[Stage]:
        # raw latent B,24,T',h,w (the clip) -> pixels B,3,T,H,W
        return [lambda z, ctx: torch.cat(list(self.own_tile_pieces("decode", z, ctx)), dim=2)]

    def moments(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, logvar = h.chunk(2, dim=1)  # 2 x B,24,T',h,w
        return mean, logvar

    def encode_modules(self) -> list[nn.Module]:
        return [self.encoder, self.quant_conv]

    def decode_modules(self) -> list[nn.Module]:
        return [self.post_quant_conv, self.decoder]

    # --- pixels and latents ---------------------------------------------------------------------
    def normalize_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """[-1, 1] pixels -> the encoder's ImageNet-normalised input (x's dtype)."""
        return (((x + 1) * 0.5 - _channels(IMAGENET_MEAN, x)) / _channels(IMAGENET_STD, x)).to(x.dtype)

    def finish_pixels(self, raw: torch.Tensor) -> torch.Tensor:
        """The decoder's ImageNet-normalised output -> [-1, 1] pixels, float32, unclamped (one new tensor: a
        clip's frames at full resolution)."""
        return (raw.float() * _channels(IMAGENET_STD, raw)).add_(_channels(IMAGENET_MEAN, raw)).mul_(2).sub_(1)

    def to_model_space(self, z: torch.Tensor) -> torch.Tensor:
        """Raw latent B,C,T,h,w -> core's LATENT (normalised by the latent statistics), float32."""
        return (z.float() - self.latents_mean.float().view(1, -1, 1, 1, 1)) / self.latents_std.float().view(1, -1, 1, 1, 1)

    def from_model_space(self, z: torch.Tensor) -> torch.Tensor:
        return z.float() * self.latents_std.float().view(1, -1, 1, 1, 1) + self.latents_mean.float().view(1, -1, 1, 1, 1)

    # --- one tile of one clip -------------------------------------------------------------------
    def encode_tiles(self, x: torch.Tensor) -> torch.Tensor:
        """ImageNet-normalised pixels B,3,T,H,W -> the posterior's moments B,2*embed,(T-1)/4+1,H/16,W/16."""
        return self.quant_conv(self.encoder(x))

    def decode_tiles(self, z: torch.Tensor) -> torch.Tensor:
        """Raw latent B,24,t,h,w -> ImageNet-normalised pixels B,3,4t,16h,16w."""
        return self.decoder(self.post_quant_conv(z.to(self.post_quant_conv.weight.dtype)))

    def decode_tile_batches(self, batches: Iterator[torch.Tensor], own: OwnTiles) -> Iterator[torch.Tensor]:
        """Batches of raw latent tiles (each B',24,t,h,w) -> their pixels (`decode_tiles`), in order: each
        batch through the whole decoder in turn, or, with the weights streamed, every batch of the clip
        through each transformer block before the next block's weights are read (`MiniMaxH3Decoder.layer_major`)."""
        if not own.weights_streamed:
            yield from map(self.decode_tiles, batches)
            return
        conv = self.post_quant_conv
        yield from self.decoder.layer_major((conv(z.to(conv.weight.dtype)) for z in batches), conv.weight.device)

