"""Decode straight to a video file and encode straight from one, so host memory does not grow with
the clip: `decode_to_file` hands every decoded chunk to a `VideoWriter` (encoding on its own thread)
and `encode_from_file` reads the frames each chunk needs from a `VideoReader`.

    vae.decode_to_file(m, z, "clip.mp4", fps=24, num_frames=t, height=h, width=w)
    z, clip = vae.encode_from_file(m, "clip.mp4", every_nth=2, width=960)
"""
import logging
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import torch

from .run import engine, inputs
from .video_codecs import resolve
from .video_reader import VideoReader
from .video_writer import VideoWriter

log = logging.getLogger("streamvae")


def to_pixels(frames: torch.Tensor, bits: int) -> np.ndarray:
    """Decoder output 1,C,k,H,W in [-1, 1] (not clamped) -> k,H,W,C integers: uint8 for 8 bits,
    uint16 (0..65535) otherwise, (x + 1) / 2 * max rounded to nearest. Converted on the frames'
    device, so only the integer frames cross to the host."""
    if frames.shape[0] != 1:
        raise ValueError(f"one clip at a time: got {frames.shape[0]} clips (shape {tuple(frames.shape)})")
    top = 255 if bits == 8 else 65535
    pixels = frames[0].float().add(1).mul_(top / 2).round_().clamp_(0, top).permute(1, 2, 3, 0)
    if bits == 8:
        return pixels.to(torch.uint8).cpu().numpy()
    return pixels.to(torch.int32).cpu().numpy().astype(np.uint16)


class FileSink:
    """`engine.decode`'s `sink` for a `VideoWriter`: converts each chunk and queues it (RGBA frames
    without their alpha when the writer's encoding keeps none: `VideoEncoding.with_alpha` said so).

    Called as sink(first, frames, offset=clip start in the file). Frames the writer already has
    (a decode rerun after an fp16 overflow starts again at frame 0) are skipped, so every frame is
    written exactly once and in order. `observe(first, pixels)`, if given, sees every new chunk
    (the node's preview).
    """

    def __init__(self, writer: VideoWriter, observe=None):
        self.writer, self.observe = writer, observe

    def __call__(self, first: int, frames: torch.Tensor, offset: int = 0) -> None:
        first += offset
        skip = self.writer.queued - first
        if skip < 0:
            raise RuntimeError(f"frames {self.writer.queued}..{first - 1} were never delivered")
        if skip >= frames.shape[2]:
            return
        pixels = to_pixels(frames[:, :self.writer.channels, skip:], self.writer.encoding.input_bits)
        if self.observe is not None:
            self.observe(first + skip, pixels)
        self.writer.write(pixels)

    def at(self, offset: int):
        """The sink for a clip whose first frame is frame `offset` of the file."""
        return partial(self, offset=offset)


def decode_to_file(model, z: torch.Tensor, path, how=None, *, fps=24, codec: str = "h264", crf: int = 19,
                   pixel_format: str = "auto", bit_depth="auto", num_frames: int | None = None,
                   height: int | None = None, width: int | None = None, audio=None, metadata: dict | None = None,
                   observe=None, progress=None, cancel=None, overwrite: bool = False, **decode_kwargs) -> Path:
    """Decode a raw latent B,C,T',h,w (every batch entry a clip; they are written one after another)
    into the video file `path` and return it.

    `codec`, `pixel_format`, `bit_depth`, `crf` and `fps` as in `video_codecs.resolve` (an RGBA
    model's alpha is kept where the codec can hold it, else dropped with a warning); `num_frames`,
    `height`, `width` trim every clip as in `engine.decode`; `audio` = (waveform C,S, sample_rate)
    is muxed alongside; `observe(first, pixels)` sees every chunk as written. `how` (a `Plan` or
    `Settings`) and the other keyword arguments (`opts`, ...) go to `engine.decode`, whose chunks are
    encoded while the next ones decode. An existing file is an error unless `overwrite`; the path is
    checked before anything is decoded. On failure or cancel the frames written so far stay in
    `<name>.partial.<ext>` and the error is raised.
    """
    encoding, note = resolve(codec, pixel_format, bit_depth, crf, fps).with_alpha(model.out_channels)
    if note:
        log.warning("StreamVAE: %s", note)
        warnings.warn(note, RuntimeWarning, stacklevel=2)
    video = z if z.dim() == 5 else z.unsqueeze(2)
    inputs.checked_latent(model, video, decode_kwargs.get("nonfinite", "error"))  # before a file is made for it
    clips, n_lat = video.shape[0], video.shape[2]
    frames = num_frames or model.frames_made("decode", n_lat)
    of = model.spatial_factor * model.decode_upscale
    size = (height or video.shape[3] * of, width or video.shape[4] * of)
    with VideoWriter(path, encoding, size[1], size[0], frames * clips, audio=audio, metadata=metadata,
                     overwrite=overwrite) as writer:
        sink = FileSink(writer, observe)
        for i in range(clips):
            engine.decode(model, video[i:i + 1], how, num_frames=frames, height=size[0], width=size[1],
                             sink=sink.at(i * frames), progress=progress, cancel=cancel, **decode_kwargs)
        return writer.finish()


def encode_from_file(model, source, how=None, *, start_frame: int = 0, frame_count: int = 0, every_nth: int = 1,
                     width: int = 0, height: int = 0, resize_filter: str = "bicubic",
                     **encode_kwargs) -> tuple[torch.Tensor, VideoReader]:
    """Encode frames of the video file `source` (a path or a file object) to a raw latent 1,C,T',h,w,
    reading only the frames each chunk needs (selection and resize as in `VideoReader`).

    Returns the latent and the (closed) reader, whose `frames`, `height`, `width` and `fps` say what
    was encoded; `decode(z, num_frames=reader.frames, height=reader.height, width=reader.width)`
    gives those frames back. `how` and the other keyword arguments go to `engine.encode`.
    """
    with VideoReader(source, start_frame, frame_count, every_nth, width, height, resize_filter,
                     model.in_channels) as reader:
        return engine.encode(model, reader, how, **encode_kwargs), reader
