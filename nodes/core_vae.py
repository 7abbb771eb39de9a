"""StreamVAE to core VAE: a core ComfyUI `VAE` whose encode/decode run StreamVAE, so core nodes (VAE
Decode, VAE Decode (Tiled), WanImageToVideo, ...) get the exact, memory-bounded path and see exactly
what core's own VAE of that family would give them: the same LATENTs (`VideoVAE.to_comfy_latent`),
frame counts (frames past the last 4n+1, LTX 8n+1, are dropped on encode; decode gives every latent frame) and
latent sizes (Wan: frames cropped, centred, to a multiple of the spatial factor, as core does; SeedVR2:
core pads inside its encoder to floor(size / 8) latents, which the adapter matches in shape only, by
cropping the top left, and says so).

How: `StreamVAECoreVAE` subclasses `comfy.sd.VAE`, lets the base initializer set every default
attribute of the running core version (with core's own weightless pixel-space VAE as a placeholder,
so nothing is loaded), then replaces the model with `StreamVAEStage` and the ModelPatcher and ratios
with StreamVAE's. The stage speaks core's chunked-I/O protocol (`comfy_has_chunked_io`,
`decode_output_shape`, `decode(..., output_buffer=)`, `encode(..., device=)`): where the running
core has it (0.33.0 and newer), core's own `decode`/`encode` drive the stage, so batching, output
device and dtype (`--fp16-intermediates`) are core's. Older cores (0.3.75) get the same steps from
`_decode_image`/`_encode_pixels`. The tiled methods always run StreamVAE's exact tiles: `decode_tiled`
takes VAE Decode (Tiled)'s tile sizes as StreamVAE tiles; temporal chunks carry the causal cache, so
its temporal overlap is not needed.
"""
import dataclasses
import logging
import math

import comfy.sd
import torch
from comfy_api.latest import io

from .. import vae
from ..vae import Settings, families, latent_frames
from . import core_api, execution
from .images import check_image
from .latents import latent_layout, read_latent
from .run_settings import check_tile_size, check_tiling, settings_from_inputs, tiling_inputs
from .types import STREAMVAE

log = logging.getLogger("streamvae")

# Core has no version flag for the protocol; its VAE.decode reading the attribute is the feature.
CORE_HAS_CHUNKED_IO = "comfy_has_chunked_io" in comfy.sd.VAE.decode.__code__.co_consts


class StreamVAEStage(torch.nn.Module):
    """The adapter's `first_stage_model`: StreamVAE behind core's chunked-I/O protocol. Latents in and
    out are core's LATENTs for the family; pixels are core's B,3,T,H,W in [-1, 1]."""

    comfy_has_chunked_io = True

    def __init__(self, handle, tiling: Settings):
        super().__init__()
        # A submodule, so core's model_size() and get_sd() see the weights the patcher manages.
        self.weights = handle.patcher.model if handle.patcher is not None else handle.model
        self.handle, self.tiling = handle, tiling

    def latent_shape(self, shape) -> tuple:
        """A LATENT's shape in any layout `latents.latent_layout` reads -> B,C,T',h,w."""
        h = self.handle
        return tuple(latent_layout(torch.empty(shape, device="meta"), h.family, h.latent_channels)[0].shape)

    def decode_output_shape(self, shape) -> tuple:
        b, _, t, h, w = self.latent_shape(shape)
        f = self.handle.spatial_factor
        return b, 3, self.handle.model.frames_made("decode", t), h * f, w * f

    def decode(self, samples, output_buffer=None, tiling: Settings | None = None, **vae_options):
        """LATENT -> pixels B,3,T,H,W in [-1, 1] written into `output_buffer` (a new tensor on the
        latent's device without one, as core's tiled fallbacks call it); every latent frame is decoded."""
        latent = read_latent({"samples": samples}, self.handle.model)
        if output_buffer is None:
            output_buffer = torch.empty(self.decode_output_shape(samples.shape), device=samples.device)
        execution.decode_clips(self.handle, latent, tiling or self.tiling, lambda i: execution.into(output_buffer[i:i + 1]))
        return output_buffer

    def encode(self, pixels, device=None, tiling: Settings | None = None):
        """Pixels B,3,T,H,W in [-1, 1] -> LATENT with core's latent count: frames past the last
        tf*n+1 are dropped (`VideoVAE.frames_kept`) and a size that is no multiple of the spatial factor
        is cut down to one (core's crop, centred, already did that for Wan). `device` (where core would
        compute) is the handle's."""
        f = self.handle.spatial_factor
        height, width = pixels.shape[3] // f * f, pixels.shape[4] // f * f
        if (height, width) != tuple(pixels.shape[3:]):
            log.warning("StreamVAE to core VAE: %dx%d frames cropped to %dx%d (top left), the latent size core's %s "
                        "VAE makes; core pads inside its encoder instead, so values differ. For the same result use "
                        "multiples of %d, or StreamVAE Encode (pads and keeps the size).", pixels.shape[4],
                        pixels.shape[3], width, height, self.handle.family, f)
        video = pixels[:, :, :self.handle.model.frames_kept(pixels.shape[2]), :height, :width]
        for clip in video:  # bad frames get Encode's message (as an IMAGE: N,H,W,3 in 0..1), not a wrong latent
            check_image(clip.permute(1, 2, 3, 0).add(1).mul(0.5))
        # a filter's overshoot, which check_image lets through, clamped as StreamVAE Encode clamps it
        samples, _ = execution.encode_clips(self.handle, video.shape[0], lambda i: video[i:i + 1].clamp(-1, 1),
                                            (1,) + tuple(video.shape[1:]), tiling or self.tiling)
        return samples

    def peak_bytes(self, op: str, shape) -> int:
        """Predicted peak of one clip less the weights (core adds the model's size itself), for core's
        memory requests (at least 1: core divides by it)."""
        shape = self.latent_shape(shape) if op == "decode" else tuple(shape)
        plan = vae.plan(self.handle.model, op, (1,) + tuple(shape[1:]), self.tiling, opts=self.handle.opts,
                        **execution.plan_placement(self.handle.load_device))
        return max(1, plan.work_bytes or 0)


class StreamVAECoreVAE(comfy.sd.VAE):
    """A core VAE backed by a StreamVAE handle; `tiling` applies to plain encode/decode calls."""

    def __init__(self, handle, tiling: Settings):
        super().__init__(sd={"pixel_space_vae": torch.tensor(1.0)})  # weightless placeholder, replaced below
        f, tf = handle.spatial_factor, handle.temporal_factor
        self.handle, self.tiling = handle, tiling
        self.first_stage_model = StreamVAEStage(handle, tiling)
        self.patcher = handle.patcher
        self.device = handle.load_device
        self.vae_dtype = torch.float32  # what core casts inputs to; StreamVAE casts per half itself
        self.output_device = core_api.intermediate_device()
        self.latent_channels, self.latent_dim, self.output_channels = handle.latent_channels, 3, 3
        # core's ratios: the network's frame counts (tf*n - (tf - 1) pixel frames per n latent frames: Wan 4,
        # LTX 8), read by core's nodes (LTXVAddGuide's frame index, VAE Decode (Tiled)'s tile sizes)
        model = handle.model
        self.upscale_ratio = (lambda a: max(0, model.frames_made("decode", a)) if a > 0 else 0, f, f)
        self.downscale_ratio = (lambda a: model.frames_made("encode", model.frames_kept(math.floor(a))) if a > 0 else 0,
                                f, f)
        self.upscale_index_formula = self.downscale_index_formula = (tf, f, f)
        self.working_dtypes = [torch.bfloat16, torch.float32]
        self.disable_offload, self.not_video = True, False
        core = families.spec(handle.family).core  # crops an encode's frames as core's VAE of the family does
        self.crop_input = core is None or core.crops_input
        self.memory_used_encode = lambda shape, dtype: self.first_stage_model.peak_bytes("encode", shape)
        self.memory_used_decode = lambda shape, dtype: self.first_stage_model.peak_bytes("decode", shape)
        self.size = None
        self.model_size()

    # -- what core's chunked-I/O decode and encode do, for cores without them and the tiled methods --
    def _decode_image(self, samples, tiling: Settings | None = None):
        """LATENT -> B,T,H,W,3 (values 0..1) on core's intermediate device, in its dtype."""
        pixels = torch.empty(self.first_stage_model.decode_output_shape(samples.shape), device=self.output_device,
                             dtype=core_api.intermediate_dtype())
        self.first_stage_model.decode(samples, output_buffer=pixels, tiling=tiling)
        return self.process_output(pixels).movedim(1, -1)

    def _encode_pixels(self, pixel_samples, tiling: Settings | None = None, not_video=None):
        """IMAGE N,H,W,C (one clip; one image each with `not_video`) or B,T,H,W,C (B clips) -> LATENT."""
        pixels = self.vae_encode_crop_pixels(pixel_samples).movedim(-1, 1)
        if pixels.dim() == 4:
            as_images = self.not_video if not_video is None else not_video
            pixels = pixels.unsqueeze(2) if as_images else pixels.movedim(1, 0).unsqueeze(0)
        return self.first_stage_model.encode(self.process_input(pixels).to(self.vae_dtype), tiling=tiling)

    if not CORE_HAS_CHUNKED_IO:
        def decode(self, samples_in, vae_options={}):
            return self._decode_image(samples_in)

        def encode(self, pixel_samples):
            return self._encode_pixels(pixel_samples)

    # -- tiled calls: StreamVAE's exact tiles ---------------------------------------------------------
    def decode_tiled(self, samples, tile_x=None, tile_y=None, overlap=None, tile_t=None, overlap_t=None):
        """Core's tiled decode arguments are latent units (VAE Decode (Tiled) divides by the ratios)."""
        f = self.handle.spatial_factor
        tile = (tile_y * f, tile_x * f) if tile_x and tile_y else None
        return self._decode_image(samples, self._tiling(tile, (overlap or 0) * f, tile_t))

    def encode_tiled(self, pixel_samples, tile_x=None, tile_y=None, overlap=None, tile_t=None, overlap_t=None,
                     not_video=None):
        """Core's tiled encode arguments are pixels and frames (VAE Encode (Tiled))."""
        tile = (tile_y, tile_x) if tile_x and tile_y else None
        chunk = latent_frames(tile_t, self.handle.temporal_factor) if tile_t else None
        return self._encode_pixels(pixel_samples, self._tiling(tile, overlap or 0, chunk), not_video)

    def _tiling(self, tile, overlap: int, chunk) -> Settings:
        t = self.tiling
        if tile is not None:
            overlap = min(overlap, min(tile) - 1)
        return dataclasses.replace(t, tile_size=tile, tile_overlap=overlap, temporal_chunk=chunk or t.temporal_chunk)


class ToCoreVAE(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return core_api.schema(
            node_id="StreamVAEToCoreVAE",
            display_name="StreamVAE to core VAE",
            category="StreamVAE",
            search_aliases=["core VAE", "VAE", "WanImageToVideo"],
            description="A core VAE with these tile and memory settings, for core nodes (Load VAE's VAE output is the "
                        "same with automatic settings). VAE Decode (Tiled) keeps its own tile size.",
            inputs=[io.Custom(STREAMVAE).Input("vae", tooltip="The video VAE from StreamVAE Load VAE."),
                    *tiling_inputs(io)],
            outputs=[io.Vae.Output(tooltip="A core VAE for any node with a VAE input.")],
        )

    @classmethod
    def validate_inputs(cls, tile_size=None):  # ComfyUI checks the other inputs itself, each on its own widget
        return check_tile_size(tile_size) or True

    @classmethod
    def execute(cls, vae, tile_size=0, tile_overlap=64, temporal_chunk=0, memory_budget_gb=0.0,
                tiling="exact") -> io.NodeOutput:
        error = check_tiling(tile_size, tile_overlap, temporal_chunk, memory_budget_gb, tiling)
        if error:
            raise ValueError(error)
        model = vae.model
        if (model.in_channels, model.out_channels, model.decode_upscale) != (3, 3, 1):
            raise ValueError(f"the core-VAE adapter covers RGB video VAEs; this {model.family} VAE ({model.out_channels} "
                             f"image channels, {model.decode_upscale}x decoder) runs with StreamVAE Encode / Decode instead")
        settings = settings_from_inputs(tile_size, tile_overlap, temporal_chunk, tiling, memory_budget_gb)
        return io.NodeOutput(StreamVAECoreVAE(vae, settings))
