"""StreamVAE to core VAE: a core ComfyUI `VAE` whose encode/decode run StreamVAE, so core nodes (VAE
Decode, VAE Decode (Tiled), WanImageToVideo, ...) get the exact, memory-bounded path.

Why this is sound: core nodes only use a VAE through its public methods (`encode`, `decode`,
`encode_tiled`, `decode_tiled`) and a few attributes (compression ratios, latent channels and
dimensions, `patcher`). `StreamVAECoreVAE` subclasses `comfy.sd.VAE`, lets the base initializer
set every default attribute of the running core version (with core's own weightless pixel-space VAE
as a placeholder, so nothing is loaded), then replaces the model, its ModelPatcher and the ratios
and overrides the four methods. Semantics follow core: IMAGE batches are one clip, pixels are
cropped to a multiple of the spatial factor, and `decode_tiled`'s tile sizes are used as StreamVAE
tiles (its temporal overlap is not needed: temporal chunks carry the causal cache, so are exact).
"""
import math

import torch
from comfy_api.latest import io

import comfy.sd

from . import execution, planning
from .common import Tiling, check_image, check_tiling, latent_frames, read_latent, split_clips, tiling_inputs
from .types import STREAMVAE

try:
    import comfy.model_management as mm
except ImportError:
    mm = None


class StreamVAECoreVAE(comfy.sd.VAE):
    """A core VAE backed by a StreamVAE handle; `tiling` applies to plain encode/decode calls."""

    def __init__(self, handle, tiling: Tiling):
        super().__init__(sd={"pixel_space_vae": torch.tensor(1.0)})  # weightless placeholder, replaced below
        f = handle.spatial_factor
        self.handle, self.tiling = handle, tiling
        self.first_stage_model = handle.patcher.model if handle.patcher is not None else handle.model
        self.patcher = handle.patcher
        self.device = handle.load_device
        self.vae_dtype = torch.float32  # what core casts inputs to; StreamVAE casts per half itself
        self.output_device = mm.intermediate_device() if mm is not None else torch.device("cpu")
        self.latent_channels, self.latent_dim, self.output_channels = handle.latent_channels, 3, 3
        self.upscale_ratio = (lambda a: max(0, a * 4 - 3), f, f)
        self.downscale_ratio = (lambda a: max(0, math.floor((a + 3) / 4)), f, f)
        self.upscale_index_formula = self.downscale_index_formula = (4, f, f)
        self.working_dtypes = [torch.bfloat16, torch.float32]
        self.disable_offload, self.not_video, self.crop_input = True, False, True
        self.memory_used_encode = lambda shape, dtype: self._peak("encode", shape)
        self.memory_used_decode = lambda shape, dtype: self._peak("decode", shape)
        self.size = None
        self.model_size()

    def _peak(self, op: str, shape) -> int:
        """What core should free for `op` beside the weights (core adds the model's size itself)."""
        return planning.make_plan(self.handle.model, op, shape, self.tiling, self.device).work_bytes or 0

    # -- decode ------------------------------------------------------------------------------------
    def decode(self, samples_in, vae_options={}, tiling: Tiling | None = None):
        """Latent B,C,T',h,w -> B,T,H,W,3 (B,H,W,3 for a 4-D image latent), values 0..1."""
        h = self.handle
        latent = read_latent({"samples": samples_in}, h.family, h.latent_channels, h.spatial_factor, h.temporal_factor)
        image, _ = execution.decode(h, latent, tiling or self.tiling)
        b, frames = latent.samples.shape[0], latent.frames[0]
        if samples_in.dim() == 4 and frames == 1:
            return image
        return image.view(b, frames, *image.shape[1:])

    def decode_tiled(self, samples, tile_x=None, tile_y=None, overlap=None, tile_t=None, overlap_t=None):
        """Core's tiled decode arguments are latent units (VAE Decode (Tiled) divides by the ratios)."""
        f = self.handle.spatial_factor
        tile = (tile_y * f, tile_x * f) if tile_x and tile_y else None
        return self.decode(samples, tiling=self._tiling(tile, (overlap or 0) * f, tile_t))

    # -- encode ------------------------------------------------------------------------------------
    def encode(self, pixel_samples, tiling: Tiling | None = None):
        """IMAGE N,H,W,C (one clip; or B,T,H,W,C = B clips) -> raw latent B,C,T',h,w."""
        pixels, clip_length = pixel_samples, 0
        if pixels.dim() == 5:
            clip_length = pixels.shape[1]
            pixels = pixels.reshape(-1, *pixels.shape[2:])
        pixels, notes = check_image(self.vae_encode_crop_pixels(pixels))
        clips = split_clips(pixels.shape[0], clip_length)
        samples, _ = execution.encode(self.handle, pixels, clips, tiling or self.tiling, notes)
        return samples

    def encode_tiled(self, pixel_samples, tile_x=None, tile_y=None, overlap=None, tile_t=None, overlap_t=None):
        """Core's tiled encode arguments are pixels and frames (VAE Encode (Tiled))."""
        tile = (tile_y, tile_x) if tile_x and tile_y else None
        chunk = latent_frames(tile_t, self.handle.temporal_factor) if tile_t else None
        return self.encode(pixel_samples, tiling=self._tiling(tile, overlap or 0, chunk))

    def _tiling(self, tile, overlap: int, chunk) -> Tiling:
        t = self.tiling
        if tile is not None:
            overlap = min(overlap, min(tile) - 1)
        return Tiling(tile, overlap, chunk or t.temporal_chunk, t.tiling, t.memory_budget)


class ToCoreVAE(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StreamVAEToCoreVAE",
            display_name="StreamVAE to core VAE",
            category="StreamVAE",
            description="Wraps a StreamVAE model as a core VAE, so core nodes (VAE Decode, VAE Decode (Tiled), "
                        "WanImageToVideo, ...) encode and decode through StreamVAE. VAE Decode (Tiled) keeps its "
                        "own tile size; the inputs here apply to every other call.",
            inputs=[io.Custom(STREAMVAE).Input("vae", tooltip="The video VAE from StreamVAE Load VAE."),
                    *tiling_inputs(io)],
            outputs=[io.Vae.Output(tooltip="A core VAE for any node with a VAE input.")],
        )

    @classmethod
    def validate_inputs(cls, tile_size=None, tile_overlap=None, temporal_chunk=None, memory_budget_gb=None):
        return check_tiling(tile_size, tile_overlap, temporal_chunk, memory_budget_gb) or True

    @classmethod
    def execute(cls, vae, tile_size=0, tile_overlap=64, temporal_chunk=0, memory_budget_gb=0.0,
                tiling="exact") -> io.NodeOutput:
        settings = Tiling.from_inputs(tile_size, tile_overlap, temporal_chunk, tiling, memory_budget_gb)
        return io.NodeOutput(StreamVAECoreVAE(vae, settings))
