"""`VideoVAE`: the public model object every family implements.

A family subclass says what the network is: its encoder and decoder as the stages a temporal chunk
passes through in order (`encode_stages` / `decode_stages`; `encode_chunk` / `decode_chunk` run them
one after another), the latent space constants, which checkpoint keys identify it. It knows nothing
of chunks, tiles or memory: how a whole clip is run through it (padding, temporal chunks, tiles,
caches, output buffers) is the engine's job (`engine.py`, `vae.encode(model, video)` /
`vae.decode(model, z)`).

Every stage is causal in time like the whole network: run on consecutive parts of its input frames,
in order, with `ctx.first_chunk` True for the part that holds the stage's frame 0 of the clip and
`ctx.last_chunk` for the part that holds its last, it gives the frames it gives on the whole input
(its causal caches carry the rest). A stage may give them late: a decoder whose convs look ahead in
time (LTX-2's, `blocks.CausalConv3d.lookahead`) gives each frame once the next one has come, and the
rest with the clip's last frame. So the engine may feed the stages at full resolution one frame at a
time (`strategies.FrameStream`).

Latents are raw, i.e. unscaled; ComfyUI's LATENTs are `to_comfy_latent(z)` (for SeedVR2 `to_model_space(z)`).
"""
import enum
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn as nn

# One stage of an encoder or decoder: frames B,C,t,H,W and the run's RunState -> frames B,C',t',H',W'.
Stage = Callable[[torch.Tensor, object], torch.Tensor]


def run_stages(stages: list[Stage], x: torch.Tensor, ctx) -> torch.Tensor:
    """x through `stages` one after another."""
    for stage in stages:
        x = stage(x, ctx)
    return x


class ClipExtent(enum.Enum):
    """How much of the clip one call of an op's stages must see (`VideoVAE.clip_extent`), which the planner,
    the engine, the out-of-memory retries and row bands read: `CHUNKS`, consecutive temporal chunks, whole
    frames, exact tiles or one frame at a time (a causal network); `CHUNKS_AFTER_STATISTICS`, the same once
    the statistics of norms over the whole clip are known (`model.clip_norm`: a clip in several chunks passes
    through the model once per such norm first, `run.clip_statistics`, so the plan prefers one chunk);
    `UNTILED_CHUNKS`, consecutive temporal chunks of whole frames, never in exact tiles (layers that are no
    convs, which keep their own state between chunks: LTX-2.5's neighbourhood-attention decoder, whose windows
    look ahead); `WHOLE_CLIP`, the whole clip in one chunk, untiled (a layer that spans every
    frame and pixel of the clip: windows over its grid, noise drawn for it); `OWN_TILES`, the whole clip in one
    chunk that the model itself runs over its own tiles and clips (they define its output: MiniMax-H3), giving
    its output clip by clip (`VideoVAE.own_tile_pieces`), a batch of tiles at a time, its weights resident or
    streamed, as the plan says (`execution.OwnTiles`)."""

    CHUNKS = "chunks"
    CHUNKS_AFTER_STATISTICS = "chunks after whole-clip statistics"
    UNTILED_CHUNKS = "temporal chunks of whole frames"
    WHOLE_CLIP = "whole clip, untiled"
    OWN_TILES = "the model's own tiles and clips"

    @property
    def chunked(self) -> bool:
        """Whether the clip may run in temporal chunks (and a chunk's stages one frame at a time)."""
        return self in (ClipExtent.CHUNKS, ClipExtent.CHUNKS_AFTER_STATISTICS, ClipExtent.UNTILED_CHUNKS)

    @property
    def tiled(self) -> bool:
        """Whether a chunk may run in exact tiles (or in row bands: spatial parts whose norms merge moments)."""
        return self in (ClipExtent.CHUNKS, ClipExtent.CHUNKS_AFTER_STATISTICS)

    @property
    def gathers_statistics(self) -> bool:
        """Whether a clip in several chunks needs passes that gather whole-clip statistics first."""
        return self is ClipExtent.CHUNKS_AFTER_STATISTICS


@dataclass(frozen=True)
class OwnTileWork:
    """The work of one clip of a model that runs its own tiles (`ClipExtent.OWN_TILES`), in pixels at video
    resolution (batch x frames x rows x columns), which its memory scales with: `tiles` per clip, `tile_pixels`
    of one tile's run (the frames the network makes or reads for it), `clip_pixels` of the clip's blended
    frames; and the op's `clips` (its progress is counted per batch of tiles of each)."""

    clips: int
    tiles: int
    tile_pixels: int
    clip_pixels: int


class LayoutError(ValueError):
    """Checkpoint tensors whose shapes fit no configuration rule of the family whose key layout they
    have; the message names the shapes."""


class VideoVAE(nn.Module):
    family: str = ""
    spatial_factor: int = 8
    temporal_factor: int = 4
    latent_channels: int = 16
    in_channels: int = 3  # image channels encode takes: 3 (RGB) or 4 (RGBA)
    out_channels: int = 3  # image channels decode gives
    decode_upscale: int = 1  # decoded frames are this many times the encoded size (2 for 2x upscale decoders)
    # Whether every frame is an image of its own (an image network run on a clip: Qwen-Image 2.1): a
    # run then marks every chunk as one that holds its clip's frame 0 (`ctx.first_chunk`).
    frames_are_images: bool = False

    # --- what a family defines -------------------------------------------------------------
    probe_keys: tuple[str, ...] = ()  # keys whose presence identifies the family's checkpoints

    @classmethod
    def native_state_dict(cls, state_dict: dict) -> dict | None:
        """`state_dict` in this family's own key names, or None when it is not this family's layout."""
        return state_dict if all(k in state_dict for k in cls.probe_keys) else None

    @classmethod
    def config_from_state_dict(cls, state_dict: dict, overrides: dict):
        """The family config the tensor shapes describe, with `overrides` applied."""
        raise NotImplementedError

    @classmethod
    def metadata_overrides(cls, metadata: dict) -> dict:
        """Config overrides from the checkpoint's own metadata in upstream's format (before the
        `streamvae_config` metadata and the caller's); none unless the family's checkpoints carry it."""
        return {}

    @classmethod
    def refusal(cls, state_dict: dict) -> str | None:
        """Why a checkpoint of a relative of this family that it does not run (same file, other
        network) is refused, and where to load it instead; None when the keys are no such relative."""
        return None

    def encode_stages(self) -> list[Stage]:
        """The encoder in order: pixels B,in_channels,t,H,W in, moments B,2*latent,t',h,w out (see the
        module docstring)."""
        raise NotImplementedError

    def decode_stages(self) -> list[Stage]:
        """The decoder in order: a raw latent B,C,t,h,w in, pixel frames B,out_channels,t',H*u,W*u out,
        u = `decode_upscale`."""
        raise NotImplementedError

    def prefill_stages(self, op: str) -> list[Stage]:
        """The first stages of `op` that must see every frame of the clip before the clip runs (a
        non-causal attention gathers its keys: `layers.FrameCausalAttention`); the engine runs them
        over the whole clip first with `ctx.prefill` set. None for a causal network."""
        return []

    def clip_extent(self, op: str) -> ClipExtent:
        """How much of the clip one call of `op`'s stages must see (`ClipExtent`); the plan gives a whole-clip
        extent one chunk of every latent frame (`planning.clip_settings`). Chunks for a causal network."""
        return ClipExtent.CHUNKS

    def own_tile_pieces(self, op: str, x: torch.Tensor, ctx) -> Iterator[torch.Tensor]:
        """Where `op`'s extent is `ClipExtent.OWN_TILES`: its output for the whole clip `x` (the input its
        stages take), in consecutive frame pieces, each final when it is yielded (the engine hands each on,
        so a decode streams to a file with one of the model's clips in memory); the tiles run as
        `ctx.own_tiles` says."""
        raise NotImplementedError

    def own_tile_work(self, op: str, input_shape: tuple[int, ...]) -> OwnTileWork:
        """Where `op`'s extent is `ClipExtent.OWN_TILES`: the work of one of its clips for an input of
        `input_shape` (the memory model scales with it)."""
        raise NotImplementedError

    def streamed_modules(self, op: str) -> list[nn.Module]:
        """The modules of `op` whose weights may wait in host memory, each copied to the compute device
        while it runs (`execution.OwnTiles.weights_streamed`); none by default."""
        return []

    def frames_made(self, op: str, frames: int) -> int:
        """How many frames `op` makes of `frames`: the latent frames an encode makes of `frames` pixel frames
        (the clip padded by repeating its last frame), the pixel frames a decode makes of `frames` latent
        frames. The 4n+1 rule of `run.geometry` (`latent_frames`, `pixel_frames`) by default; a network with a
        rule of its own (its own clips) declares a whole-clip extent (`clip_extent`): the engine then hands
        its one chunk every frame of the clip, unpadded."""
        tf = self.temporal_factor
        return (frames - 2 + tf) // tf + 1 if op == "encode" else tf * (frames - 1) + 1

    def frames_kept(self, frames: int) -> int:
        """Of a clip of `frames` pixel frames, how many the network's encoder reads as core's does (core's
        VAE Encode makes `frames_made("encode", frames_kept(frames))` latent frames): by default those up to
        the last whole latent frame (tf*n+1), the rest dropped (StreamVAE's encode pads them to the next
        whole latent frame instead); all of them for a network that completes its own clips, which the
        engine hands the clip's frames as they are, unpadded."""
        tf = self.temporal_factor
        return tf * ((frames - 1) // tf) + 1

    def attention_cache_elements(self, op: str, batch: int, latent_frames: int, latent_hw: tuple[int, int]) -> int:
        """Elements of the keys and values a frame-causal attention of `op` keeps for a whole clip of
        `latent_frames` latent frames (`kv_cache.py`; `memory.estimate` counts them); 0 without one."""
        return 0

    def moments(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's output B,2*latent,t,h,w -> (mean, logvar) of the posterior."""
        raise NotImplementedError

    def encode_chunk(self, video: torch.Tensor, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """One temporal chunk of pixels (B,in_channels,t,H,W) -> (mean, logvar) of its latent frames."""
        return self.moments(run_stages(self.encode_stages(), video, ctx))

    def decode_chunk(self, z: torch.Tensor, ctx) -> torch.Tensor:
        """One temporal chunk of raw latents (B,C,t,h,w) -> its pixel frames (B,out_channels,t',H*u,W*u)."""
        return run_stages(self.decode_stages(), z, ctx)

    def memory_calibration(self, op: str) -> tuple[str, float]:
        """(calibrated family, scale) for `op`: whose measured memory coefficients
        (`memory_calibration.json`) predict this model's activations, and the factor they are
        multiplied by (a variant of another width scales from its family's released width)."""
        return self.family, 1.0

    def looks_ahead(self, op: str) -> bool:
        """Whether `op`'s convs look ahead in time (`CausalConv3d.lookahead`): their last frames then come
        with the clip's last chunk, and a stage may meet its frame 0 on a later chunk than the first."""
        from .blocks import CausalConv3d

        modules = self.decode_modules() if op == "decode" else self.encode_modules()
        return any(isinstance(m, CausalConv3d) and m.lookahead for root in modules for m in root.modules())

    def attention_widths(self) -> list[int]:
        """The channel widths of the model's mid-block attentions (one head each), ascending: what a
        forced attention kernel must take."""
        from .layers import FrameSelfAttention

        return sorted({m.channels for m in self.modules() if isinstance(m, FrameSelfAttention)})

    def encode_modules(self) -> list[nn.Module]:
        return [self.encoder]

    def decode_modules(self) -> list[nn.Module]:
        return [self.decoder]

    def to_model_space(self, z: torch.Tensor) -> torch.Tensor:
        """Raw latent -> the latent the diffusion model sees."""
        raise NotImplementedError

    def from_model_space(self, z: torch.Tensor) -> torch.Tensor:
        """Inverse of `to_model_space`."""
        raise NotImplementedError

    # ComfyUI's LATENT of this family (what core's VAE nodes make and take, and its .latent files hold):
    # the raw latent (Wan: its latent format normalises inside the diffusion model), or, where this is
    # True, `to_model_space(z)` (SeedVR2: core's VAE scales after encoding, unscales before decoding).
    comfy_latent_in_model_space: bool = False

    def to_comfy_latent(self, z: torch.Tensor) -> torch.Tensor:
        """Raw latent -> ComfyUI's LATENT samples for this family."""
        return self.to_model_space(z) if self.comfy_latent_in_model_space else z

    def from_comfy_latent(self, z: torch.Tensor) -> torch.Tensor:
        """ComfyUI's LATENT samples for this family -> raw latent."""
        return self.from_model_space(z) if self.comfy_latent_in_model_space else z

    # --- dtypes and devices --------------------------------------------------------------------
    @property
    def encode_dtype(self) -> torch.dtype:
        return next(self.encode_modules()[0].parameters()).dtype

    @property
    def decode_dtype(self) -> torch.dtype:
        return next(self.decode_modules()[0].parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def set_dtypes(self, encode: torch.dtype | None = None, decode: torch.dtype | None = None) -> "VideoVAE":
        """Cast the encoder and decoder weights separately (bf16 decode is near-lossless, bf16 encode is not)."""
        for modules, dtype in ((self.encode_modules(), encode), (self.decode_modules(), decode)):
            if dtype is not None:
                for module in modules:
                    module.to(dtype)
        return self
