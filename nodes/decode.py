"""StreamVAE Decode: LATENT -> IMAGE frames, tiled and chunked within a memory budget."""
from comfy_api.latest import io

from . import execution
from .latents import latent_source_input, read_latent
from .run_settings import RunSettings, check_tiling, tiling_inputs
from .types import STREAMVAE


class Decode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StreamVAEDecode",
            display_name="StreamVAE Decode",
            category="StreamVAE",
            description="Decodes a LATENT to video frames in tiles and chunks that fit the memory budget. Takes what "
                        "core's VAE Decode takes (SeedVR2 LATENTs scaled by 0.9152 as core's SeedVR2 VAE makes them, "
                        "Wan LATENTs raw): from StreamVAE Encode (trimmed back to the original frame count and size), "
                        "core's VAE Encode, samplers and empty-latent nodes.",
            inputs=[
                io.Custom(STREAMVAE).Input("vae", tooltip="The video VAE from StreamVAE Load VAE; its family must "
                                                          "match the latent's channel count."),
                io.Latent.Input("samples", tooltip=(
                    "Latent, every batch entry one clip: B,C,T,H,W (core's layout), B,T,H,W,C (channels last, read "
                    "so when dim 1 is not C), B,C,H,W (one frame), or SeedVR2's B,16*T,H,W (frames folded into "
                    "channels). The layout read is in the node's run report.")),
                *tiling_inputs(io),
                io.Combo.Input("nonfinite", options=["error", "zero"], default="error", tooltip=(
                    "A latent with NaN/Inf values (a diverged sampler): 'error' stops and names the latent frames; "
                    "'zero' decodes them with those values set to 0, with a warning.")),
                io.Combo.Input("output_dtype", options=["auto", *execution.IMAGE_DTYPES], default="auto", tooltip=(
                    "Precision of the IMAGE in RAM: fp32 = 12 bytes per pixel of every frame; fp16 = 6 (half the RAM, "
                    "about 1/8 of an 8-bit level of rounding). auto = fp32, or fp16 when ComfyUI runs with "
                    "--fp16-intermediates. For long clips use StreamVAE Decode to Video, whose RAM does not grow.")),
                latent_source_input(io),
            ],
            outputs=[io.Image.Output(tooltip="Video frames along the batch axis (N,H,W,3), values 0..1; the frames "
                                             "of every clip one after another.")],
        )

    @classmethod
    def validate_inputs(cls, tile_size=None, tile_overlap=None, temporal_chunk=None, memory_budget_gb=None):
        return check_tiling(tile_size, tile_overlap, temporal_chunk, memory_budget_gb) or True

    @classmethod
    def execute(cls, vae, samples, tile_size=0, tile_overlap=64, temporal_chunk=0, memory_budget_gb=0.0,
                tiling="exact", nonfinite="error", output_dtype="auto", latent_source="auto") -> io.NodeOutput:
        error = check_tiling(tile_size, tile_overlap, temporal_chunk, memory_budget_gb)
        if error:
            raise ValueError(error)
        latent = read_latent(samples, vae.model, latent_source)
        settings = RunSettings.from_inputs(tile_size, tile_overlap, temporal_chunk, tiling, memory_budget_gb)
        image, report = execution.decode(vae, latent, settings, nonfinite, execution.image_dtype(output_dtype))
        return io.NodeOutput(image, ui={"streamvae_run": [report.as_dict()]})
