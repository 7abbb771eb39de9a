"""StreamVAE Decode: LATENT -> IMAGE frames, tiled and chunked within a memory budget."""
from comfy_api.latest import io

from . import core_api, execution
from .alpha import decoded_mask
from .latents import latent_source_input, read_latent
from .run_settings import check_tile_size, check_tiling, settings_from_inputs, tiling_inputs
from .types import STREAMVAE


class Decode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return core_api.schema(
            node_id="StreamVAEDecode",
            display_name="StreamVAE Decode",
            category="StreamVAE",
            search_aliases=["VAE Decode", "VAE Decode (Tiled)", "tiled", "decode video", "SeedVR2", "Wan"],
            description="LATENT -> video frames, exactly as the untiled VAE would, in tiles and chunks that fit the "
                        "memory budget. Takes what core's VAE Decode takes (samplers, VAE Encode, Load Latent), and "
                        "WanVideoWrapper's latents.",
            inputs=[
                io.Custom(STREAMVAE).Input("vae", tooltip="The video VAE from StreamVAE Load VAE; its family must "
                                                          "match the latent."),
                io.Latent.Input("samples", tooltip="A LATENT in core's convention (sampler, VAE Encode, Load Latent, "
                                                   "StreamVAE Encode); every batch entry is one clip."),
                *tiling_inputs(io),
                io.Combo.Input("nonfinite", options=["error", "zero"], default="error", **core_api.advanced(), tooltip=(
                    "NaN/Inf in the latent (a diverged sampler): error = stop and name the frames; zero = decode them "
                    "as 0, with a warning.")),
                io.Combo.Input("output_dtype", options=["auto", *execution.IMAGE_DTYPES], default="auto",
                               **core_api.advanced(), tooltip=(
                    "IMAGE precision in RAM: fp32 = 12 bytes per pixel of every frame, fp16 = 6. auto = fp32, or fp16 "
                    "under --fp16-intermediates.")),
                latent_source_input(io),
            ],
            outputs=[io.Image.Output(tooltip="Video frames (N,H,W,C, values 0..1), the clips one after another; "
                                             "RGBA VAEs give 4 channels, 2x upscale decoders twice the encoded size."),
                     io.Mask.Output(display_name="mask", tooltip=(
                         "RGBA VAEs: 1 - alpha per frame (N,H,W), as Load Image gives it. RGB VAEs: an empty "
                         "64x64 mask."))],
        )

    @classmethod
    def validate_inputs(cls, tile_size=None):  # ComfyUI checks the other inputs itself, each on its own widget
        return check_tile_size(tile_size) or True

    @classmethod
    def execute(cls, vae, samples, tile_size=0, tile_overlap=64, temporal_chunk=0, memory_budget_gb=0.0,
                tiling="exact", nonfinite="error", output_dtype="auto", latent_source="auto") -> io.NodeOutput:
        error = check_tiling(tile_size, tile_overlap, temporal_chunk, memory_budget_gb, tiling)
        if error:  # values that arrived through links, and the rules across inputs, are only known now
            raise ValueError(error)
        latent = read_latent(samples, vae.model, latent_source)
        settings = settings_from_inputs(tile_size, tile_overlap, temporal_chunk, tiling, memory_budget_gb)
        image, report = execution.decode(vae, latent, settings, nonfinite, execution.image_dtype(output_dtype))
        return io.NodeOutput(image, decoded_mask(image), ui={"streamvae_run": [report.as_dict()]})
