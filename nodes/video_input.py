"""StreamVAE Encode from Video: a video file -> LATENT, reading only the frames each chunk needs, so a
long input never becomes one IMAGE tensor (`vae.video_reader.VideoReader`)."""
from comfy_api.latest import io

from ..vae.video_reader import RESIZE_FILTERS, VideoReader
from . import core_api, execution
from .encode import image_vae_layout
from .images import MAX_FRAMES, MAX_SIZE
from .latents import make_latent
from .run_settings import check_tile_size, check_tiling, settings_from_inputs, streamed_tiling_inputs
from .types import STREAMVAE


def video_source(video):
    """The file (path or file object) behind a ComfyUI VIDEO, e.g. from Load Video or Decode to Video."""
    if hasattr(video, "get_stream_source"):
        return video.get_stream_source()
    raise ValueError("this VIDEO holds its frames in memory, not a file (e.g. from Create Video); encode its images "
                     "with StreamVAE Encode, or load a file with Load Video")


class EncodeFromVideo(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return core_api.schema(
            node_id="StreamVAEEncodeFromVideo",
            display_name="StreamVAE Encode from Video",
            category="StreamVAE",
            search_aliases=["VAE Encode", "Load Video", "encode video", "video file", "SeedVR2", "Wan"],
            description="A video file -> LATENT, reading only the frames each chunk needs, so RAM does not grow with "
                        "the clip. The same LATENT as Load Video -> StreamVAE Encode of those frames.",
            inputs=[
                io.Custom(STREAMVAE).Input("vae", tooltip="The video VAE from StreamVAE Load VAE."),
                io.Video.Input("video", tooltip="A video file, e.g. from Load Video or StreamVAE Decode to Video."),
                io.Int.Input("start_frame", default=0, min=0, max=10**7, step=1, tooltip=(
                    "First frame to encode (0-based frame index in the file).")),
                io.Int.Input("frame_count", default=0, min=0, max=MAX_FRAMES, step=1, tooltip=(
                    "Frames to encode; 0 = all frames to the end of the file.")),
                io.Int.Input("every_nth", default=1, min=1, max=1000, step=1, tooltip=(
                    "Take every n-th frame (2 halves the frame rate; the fps output says the new rate).")),
                io.Int.Input("width", default=0, min=0, max=MAX_SIZE, step=1, tooltip=(
                    "Resize to this width in pixels; 0 = the file's (or, with height set, keep the aspect ratio).")),
                io.Int.Input("height", default=0, min=0, max=MAX_SIZE, step=1, tooltip=(
                    "Resize to this height in pixels; 0 = the file's (or, with width set, keep the aspect ratio).")),
                io.Combo.Input("resize_filter", options=list(RESIZE_FILTERS), default="bicubic", **core_api.advanced(),
                               tooltip="How frames are resized: bicubic, bilinear, lanczos (sharpest), area (best "
                                       "for shrinking), nearest."),
                *streamed_tiling_inputs(io),
            ],
            outputs=[
                io.Latent.Output(tooltip="LATENT in core's convention with the true frame count, size and frame rate, "
                                         "for StreamVAE Decode / Decode to Video."),
                io.Float.Output(display_name="fps", tooltip="Frame rate of the encoded frames in frames per second "
                                                            "(the file's, divided by every_nth)."),
            ],
        )

    @classmethod
    def validate_inputs(cls, tile_size=None):  # ComfyUI checks the other inputs itself, each on its own widget
        return check_tile_size(tile_size) or True

    @classmethod
    def execute(cls, vae, video, start_frame=0, frame_count=0, every_nth=1, width=0, height=0,
                resize_filter="bicubic", tile_size=0, tile_overlap=64, temporal_chunk=0,
                memory_budget_gb=0.0) -> io.NodeOutput:
        error = check_tiling(tile_size, tile_overlap, temporal_chunk, memory_budget_gb)
        if error:  # values that arrived through links are only known now
            raise ValueError(error)
        settings = settings_from_inputs(tile_size, tile_overlap, temporal_chunk, "exact", memory_budget_gb)
        with VideoReader(video_source(video), start_frame, frame_count, every_nth, width, height,
                         resize_filter, vae.model.in_channels) as reader:  # RGBA VAEs: the file's alpha, else opaque
            samples, report = execution.encode_clips(vae, 1, lambda i: reader, reader.shape, settings, reader.notes)
        frames = f"{reader.frames} frame{'s' if reader.frames != 1 else ''}"
        report.notes.append(f"read {frames} of {reader.width}x{reader.height} at {float(reader.fps):g} fps")
        latent = make_latent(*image_vae_layout(vae.model, samples, [reader.frames]), (reader.height, reader.width),
                             float(reader.fps))
        return io.NodeOutput(latent, float(reader.fps), ui={"streamvae_run": [report.as_dict()]})
