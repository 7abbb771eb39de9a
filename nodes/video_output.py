"""StreamVAE Decode to Video: LATENT -> a video file in ComfyUI's output folder, written while the chunks
decode, so RAM holds a few chunks of frames however long the clip is (`vae.video_file`)."""
import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from comfy_api.latest import io, ui

from ..vae import families
from ..vae.video_codecs import BIT_DEPTHS, CODECS, MAX_CRF, PIXEL_FORMATS, resolve
from ..vae.video_file import FileSink
from ..vae.video_writer import VideoWriter
from . import core_api, execution
from .latents import LatentClips, latent_source_input, read_latent
from .run_settings import check_tile_size, check_tiling, settings_from_inputs, streamed_tiling_inputs
from .types import STREAMVAE

try:
    import folder_paths
    from comfy.cli_args import args as comfy_args
    from comfy_api.latest import InputImpl
except ImportError:
    folder_paths = comfy_args = InputImpl = None

PREVIEW_FRAMES = 8
PREVIEW_EDGE = 256  # pixels, the longer side of a preview frame


class Preview:
    """Up to PREVIEW_FRAMES frames spread over the clip, shrunk to PREVIEW_EDGE px, kept as the chunks
    pass (`observe`), for the node's preview of what was written."""

    def __init__(self, total: int):
        self.wanted = set(np.linspace(0, total - 1, min(PREVIEW_FRAMES, total)).round().astype(int).tolist())
        self.frames: list[torch.Tensor] = []

    def observe(self, first: int, pixels: np.ndarray) -> None:
        for index in sorted(self.wanted.intersection(range(first, first + len(pixels)))):
            frame = torch.from_numpy(pixels[index - first].astype(np.float32) / np.iinfo(pixels.dtype).max)
            scale = min(1.0, PREVIEW_EDGE / max(frame.shape[:2]))
            size = (max(1, round(frame.shape[0] * scale)), max(1, round(frame.shape[1] * scale)))
            frame = F.interpolate(frame.permute(2, 0, 1)[None], size=size, mode="area")[0].permute(1, 2, 0)
            self.frames.append(frame)

    def image(self) -> torch.Tensor:
        """The kept frames as an IMAGE N,h,w,3 in 0..1."""
        return torch.stack(self.frames)


def output_path(filename_prefix: str, extension: str, width: int, height: int) -> tuple[Path, str]:
    """The next free `<prefix>_NNNNN_.<ext>` in ComfyUI's output folder (core's counter; a partial
    file left by a failed run counts too, so nothing is overwritten), and its subfolder."""
    try:
        folder, name, counter, subfolder, _ = folder_paths.get_save_image_path(
            filename_prefix, folder_paths.get_output_directory(), width, height)
    except Exception as error:  # core raises a bare Exception for a prefix outside the output folder
        raise ValueError(f"cannot write into the output folder for filename_prefix {filename_prefix!r}: "
                         f"{getattr(error, 'strerror', None) or error}. Choose another filename_prefix (a folder "
                         "inside ComfyUI's output folder that you can write to).") from error
    return Path(folder) / f"{name}_{counter:05}_.{extension}", subfolder


def _metadata(prompt, extra_pnginfo, description: str) -> dict[str, str]:
    """Container tags: what was written, and the workflow as core's savers store it (unless disabled)."""
    tags = {"comment": f"StreamVAE: {description}"}
    if comfy_args is None or not comfy_args.disable_metadata:
        if prompt is not None:
            tags["prompt"] = json.dumps(prompt)
        for key, value in (extra_pnginfo or {}).items():
            tags[key] = json.dumps(value)
    return tags


def conditioned_rate(prompt, node_class: str) -> float | None:
    """The frame rate the workflow's `node_class` nodes (LTX-2's LTXVConditioning) give its model: their
    `frame_rate` (the API prompt: {id: {"class_type", "inputs"}}) where they agree on a set value; None
    where there is none, one is linked to another node, or they differ."""
    rates = {node.get("inputs", {}).get("frame_rate") for node in (prompt or {}).values()
             if isinstance(node, dict) and node.get("class_type") == node_class}
    if len(rates) != 1:
        return None
    rate = rates.pop()
    return float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0 else None


def frame_rate(fps: float, latent: LatentClips, family: str, prompt=None) -> tuple[float, str]:
    """The rate to write at and why: `fps`, or with 0 (auto) the source video's (a LATENT from Encode
    from Video), else the rate the workflow's node that sets `family`'s rate gives (`FamilySpec.fps_node`:
    LTX-2's LTXVConditioning, `conditioned_rate`), else the rate `family`'s video model makes
    (`FamilySpec.fps`)."""
    if fps:
        return fps, "fps as set on the node"
    if latent.fps:
        return latent.fps, "the source video's rate (fps 0 = auto)"
    spec = families.spec(family)
    if spec.fps_node and (rate := conditioned_rate(prompt, spec.fps_node)):
        return rate, f"the frame_rate of the workflow's {spec.fps_node} (fps 0 = auto)"
    return spec.fps, f"{spec.display_name}'s rate (fps 0 = auto)"


def _audio(audio):
    """ComfyUI AUDIO {"waveform": B,C,S, "sample_rate"} -> (C,S of the first entry, rate) for the writer."""
    if audio is None:
        return None
    return audio["waveform"][0].float().cpu().numpy(), int(audio["sample_rate"])


class DecodeToVideo(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return core_api.schema(
            node_id="StreamVAEDecodeToVideo",
            display_name="StreamVAE Decode to Video",
            category="StreamVAE",
            search_aliases=["Save Video", "VAE Decode", "video file", "mp4", "long video", "SeedVR2", "Wan", "LTX-2"],
            description="LATENT -> a video file in ComfyUI's output folder, written while the chunks decode, so RAM "
                        "does not grow with the clip's length (no IMAGE is made). Every frame, in order, at the "
                        "latent's true size.",
            inputs=[
                io.Custom(STREAMVAE).Input("vae", tooltip="The video VAE from StreamVAE Load VAE; its family must "
                                                          "match the latent."),
                io.Latent.Input("samples", tooltip="A LATENT in core's convention; the clips of a batch go into the "
                                                   "file one after another."),
                io.String.Input("filename_prefix", default="StreamVAE/video", tooltip=(
                    "File name in ComfyUI's output folder (subfolders allowed); a counter and the extension are added.")),
                io.Combo.Input("codec", options=list(CODECS), default="h264", tooltip=(
                    "h264 / h265 (.mp4, play everywhere), ffv1 (.mkv, lossless), prores (.mov, for editing).")),
                io.Float.Input("fps", default=0.0, min=0.0, max=1000.0, step=0.001, tooltip=(
                    "Video frames per second. 0 = auto: the source video's rate, else LTX-2's LTXVConditioning "
                    "frame_rate, else the model's (Wan2.1 16, Wan2.2-5B 24, SeedVR2 24, LTX-2 24).")),
                io.Int.Input("crf", default=19, min=0, max=MAX_CRF, step=1, tooltip=(
                    "h264/h265 quality in CRF units: 0 = best, 17-23 = visually good, 51 = smallest. ffv1 and prores "
                    "ignore it.")),
                io.Combo.Input("pixel_format", options=list(PIXEL_FORMATS), default="auto", **core_api.advanced(),
                               tooltip="yuv420/422/444 (BT.709, limited range) or rgb. auto: yuv420 for h264/h265, "
                                       "yuv422 for prores, rgb for ffv1."),
                io.Combo.Input("bit_depth", options=list(BIT_DEPTHS), default="auto", **core_api.advanced(), tooltip=(
                    "Bits per channel. auto: 8, or 10 for prores; 10 or more cut banding where the codec allows.")),
                *streamed_tiling_inputs(io),
                io.Audio.Input("audio", optional=True, tooltip="Optional sound (core's AUDIO, e.g. LTX-2's from "
                                                               "LTXV Audio VAE Decode), muxed into the file and cut "
                                                               "to the video's length."),
                latent_source_input(io),
            ],
            outputs=[
                io.Video.Output(tooltip="The written file as a VIDEO, for Save Video, Get Video Components or "
                                        "StreamVAE Encode from Video."),
                io.String.Output(display_name="path", tooltip="Full path of the written file."),
            ],
            hidden=[io.Hidden.prompt, io.Hidden.extra_pnginfo],
            is_output_node=True,
        )

    @classmethod
    def validate_inputs(cls, tile_size=None):
        """One input, so that its error shows on its widget alone; ComfyUI checks the others' types,
        ranges and options on their own widgets, and the combination of codec, pixel format and bit
        depth is checked first thing when the node runs, before anything is decoded."""
        return check_tile_size(tile_size) or True

    @classmethod
    def execute(cls, vae, samples, filename_prefix="StreamVAE/video", codec="h264", fps=0.0, crf=19,
                pixel_format="auto", bit_depth="auto", tile_size=0, tile_overlap=64, temporal_chunk=0,
                memory_budget_gb=0.0, audio=None, latent_source="auto") -> io.NodeOutput:
        error = check_tiling(tile_size, tile_overlap, temporal_chunk, memory_budget_gb)
        if error:  # values that arrived through links are only known now
            raise ValueError(error)
        latent = read_latent(samples, vae.model, latent_source)
        fps, why = frame_rate(fps, latent, vae.family, cls.hidden.prompt)
        encoding, alpha_note = resolve(codec, pixel_format, bit_depth, crf, fps).with_alpha(vae.model.out_channels)
        height, width = output_size(vae.model, latent)
        encoding.check_size(width, height)
        path, subfolder = output_path(filename_prefix, encoding.extension, width, height)
        settings = settings_from_inputs(tile_size, tile_overlap, temporal_chunk, "exact", memory_budget_gb)
        total = sum(latent.frames)
        preview = Preview(total)
        metadata = _metadata(cls.hidden.prompt, cls.hidden.extra_pnginfo, encoding.describe())
        with VideoWriter(path, encoding, width, height, total, audio=_audio(audio), metadata=metadata) as writer:
            _, report = execution.decode(vae, latent, settings, sink=FileSink(writer, preview.observe))
            path = writer.finish()
        report.notes += [alpha_note] if alpha_note else []
        report.notes.append(f"wrote {path.name}: {total} frames {width}x{height}, {encoding.describe()}; {why}")
        written = {"filename": path.name, "subfolder": subfolder, "type": "output", "frames": total,
                   "width": width, "height": height, "fps": float(encoding.fps), "format": encoding.describe()}
        shown = ui.PreviewImage(preview.image(), cls=cls).as_dict()
        video = InputImpl.VideoFromFile(str(path)) if InputImpl is not None else None
        return io.NodeOutput(video, os.fspath(path), ui={**shown, "streamvae_run": [report.as_dict()],
                                                         "streamvae_video": [written]})


def output_size(model, latent) -> tuple[int, int]:
    """(height, width) a LATENT decodes to: the size Encode was given (else the latent's full size),
    times the decoder's upscale."""
    _, _, _, h, w = latent.samples.shape
    height, width = latent.size if latent.size is not None else (h * model.spatial_factor, w * model.spatial_factor)
    return height * model.decode_upscale, width * model.decode_upscale
