"""StreamVAE Encode: IMAGE frames -> LATENT, split into clips, tiled and chunked within a memory budget."""
from comfy_api.latest import io

from . import core_api, execution
from .alpha import encode_input
from .images import MAX_FRAMES, check_batch_size, clip_batch, split_clips
from .latents import make_latent
from .run_settings import check_tile_size, check_tiling, settings_from_inputs, tiling_inputs
from .types import STREAMVAE


class Encode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return core_api.schema(
            node_id="StreamVAEEncode",
            display_name="StreamVAE Encode",
            category="StreamVAE",
            search_aliases=["VAE Encode", "VAE Encode (Tiled)", "tiled", "encode video", "SeedVR2", "Wan"],
            description="Video frames -> LATENT, exactly as the untiled VAE would, in tiles and chunks that fit the "
                        "memory budget. The LATENT is core's VAE Encode's; any frame count and size, given back whole "
                        "by StreamVAE Decode.",
            inputs=[
                io.Custom(STREAMVAE).Input("vae", tooltip="The video VAE from StreamVAE Load VAE."),
                io.Image.Input("image", tooltip="Video frames (N,H,W,3, values 0..1), any count and size; a 5-D "
                                                "B,T,H,W,C IMAGE is B clips."),
                io.Int.Input("batch_size", default=0, min=0, max=MAX_FRAMES, step=1, **core_api.advanced(), tooltip=(
                    "Frames per clip. 0 = the whole batch is one video; 1 = independent images; else 4n+1 (5, 9, "
                    "13, ...).")),
                *tiling_inputs(io),
                io.Mask.Input("mask", optional=True, tooltip=(
                    "RGBA VAEs only: transparency as Load Image gives it (1 - alpha, one mask or one per frame). "
                    "Unconnected: the IMAGE's own alpha, else opaque.")),
            ],
            outputs=[io.Latent.Output(tooltip="LATENT as core's VAE Encode makes it, one clip per batch entry, with the "
                                              "true frame counts for StreamVAE Decode.")],
        )

    @classmethod
    def validate_inputs(cls, tile_size=None):  # one input: its error shows on its widget alone (see check_tile_size)
        return check_tile_size(tile_size) or True

    @classmethod
    def execute(cls, vae, image, batch_size=0, tile_size=0, tile_overlap=64, temporal_chunk=0,
                memory_budget_gb=0.0, tiling="exact", mask=None) -> io.NodeOutput:
        error = check_batch_size(batch_size) or check_tiling(tile_size, tile_overlap, temporal_chunk, memory_budget_gb,
                                                             tiling)
        if error:  # values that arrived through links, the 4n+1 rule and the rules across inputs
            raise ValueError(error)
        image, batch_size, batch_notes = clip_batch(image, batch_size)
        image, notes = encode_input(image, mask, vae.model.in_channels)
        notes = batch_notes + notes
        clips = split_clips(image.shape[0], batch_size)
        settings = settings_from_inputs(tile_size, tile_overlap, temporal_chunk, tiling, memory_budget_gb)
        samples, report = execution.encode(vae, image, clips, settings, notes)
        latent = make_latent(*image_vae_layout(vae.model, samples, clips.frames), (image.shape[1], image.shape[2]))
        return io.NodeOutput(latent, ui={"streamvae_run": [report.as_dict()]})


def image_vae_layout(model, samples, frames: list[int]):
    """(samples, frames per batch entry) as core lays out an image VAE's LATENT (Qwen-Image 2.1: one
    frame per latent frame, each independent): B,C,h,w with every frame its own batch entry; a video
    VAE's LATENT as it is (B,C,T',h,w, one clip per entry)."""
    if model.temporal_factor != 1:
        return samples, frames
    b, c, t, h, w = samples.shape
    # b c t h w -> (b t) c h w, the clips' padding frames dropped
    images = samples.transpose(1, 2).reshape(b * t, c, h, w)
    keep = [i * t + k for i, n in enumerate(frames) for k in range(n)]
    return images[keep], [1] * len(keep)
