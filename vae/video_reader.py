"""Reading video files without holding them: `probe` (metadata only) and `VideoReader`, a frame
source that `engine.encode` reads chunk by chunk, so a long input never becomes one tensor.

Colour: YUV frames are converted to RGB with the matrix and range the file is tagged with (FFmpeg's
default, BT.601 limited range, for untagged files); RGB files (FFV1 `rgb`) are read as stored.
Files with more than 8 bits per channel are read at 16 bits, others at 8.
"""
import sys
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np
import torch

RESIZE_FILTERS = {"bicubic": "BICUBIC", "bilinear": "BILINEAR", "lanczos": "LANCZOS", "area": "AREA",
                  "nearest": "POINT"}  # our names -> FFmpeg swscale's
RGB48 = "rgb48le" if sys.byteorder == "little" else "rgb48be"
RGBA64 = "rgba64le" if sys.byteorder == "little" else "rgba64be"


def _open(source):
    """`av.open` for a path or a file object (rewound first, so it can be opened again)."""
    if hasattr(source, "seek"):
        source.seek(0)
    try:
        return av.open(source if hasattr(source, "read") else str(source), mode="r")
    except EOFError as error:  # FFmpeg's AVERROR_EOF: the container ends before its first frame
        raise ValueError(f"{_name(source)} has no frames (the file ends after its header): it is empty or was cut "
                         "off; export or download it again") from error
    except (OSError, av.FFmpegError) as error:
        raise ValueError(f"cannot open {_name(source)} as a video: {getattr(error, 'strerror', None) or error}") from error


def _name(source) -> str:
    return "the video" if hasattr(source, "read") else str(source)


def _video_stream(container, source):
    if not container.streams.video:
        raise ValueError(f"{_name(source)} has no video stream (or no frames in it)")
    return container.streams.video[0]


def _frame_rate(stream) -> Fraction:
    rate = stream.average_rate or stream.guessed_rate
    return Fraction(rate) if rate else Fraction(24)


def _metadata_frames(container, stream, fps: Fraction) -> int | None:
    """Frame count as the container states it: its own count (MP4 sample table), else the video
    stream's duration (fragmented MP4, MKV's per-track DURATION tag), else the file's duration."""
    if stream.frames:
        return int(stream.frames)
    seconds = None
    if stream.duration is not None and stream.time_base:
        seconds = stream.duration * stream.time_base
    elif "DURATION" in stream.metadata:
        h, m, s = stream.metadata["DURATION"].split(":")
        seconds = Fraction(int(h) * 3600 + int(m) * 60) + Fraction(s)
    elif container.duration is not None:
        seconds = Fraction(container.duration, av.time_base)
    return None if seconds is None else round(seconds * fps)


@dataclass(frozen=True)
class VideoInfo:
    """What a video file's headers say: `frames` as stated by the container (see `_metadata_frames`)."""

    frames: int | None
    width: int
    height: int
    fps: Fraction
    codec: str
    pix_fmt: str
    colorspace: int  # FFmpeg AVColorSpace: 0 RGB, 1 BT.709, 2 unspecified, 5/6 BT.601
    color_range: int  # 1 limited, 2 full, 0 unspecified
    audio_streams: int


def probe(source) -> VideoInfo:
    """The first video stream's metadata, without decoding a frame."""
    with _open(source) as container:
        stream = _video_stream(container, source)
        context = stream.codec_context
        fps = _frame_rate(stream)
        return VideoInfo(_metadata_frames(container, stream, fps), context.width, context.height, fps, context.name,
                         context.format.name if context.format else "", int(context.colorspace or 0),
                         int(context.color_range or 0), len(container.streams.audio))


class VideoReader:
    """Frames of a video file as the video 1,3,T,H,W in [-1, 1] that `engine.encode` takes, read
    on demand by `read(start, stop)` (in order; an earlier start decodes from the beginning again).

    The selection is frame `start_frame`, then every `every_nth` frame, `frame_count` frames (0 = to
    the end); `width`/`height` (pixels, 0 = the file's; one of them 0 keeps the aspect ratio) resize
    with `resize_filter`. T is the selected count, known before decoding (the file's packets are
    counted once, which reads it without decoding). `fps` is the file's rate divided by `every_nth`.
    `channels` 4 reads R, G, B and alpha (for RGBA VAEs; opaque where the file has no alpha plane).
    """

    dtype = torch.float32
    device = torch.device("cpu")

    def __init__(self, source, start_frame: int = 0, frame_count: int = 0, every_nth: int = 1, width: int = 0,
                 height: int = 0, resize_filter: str = "bicubic", channels: int = 3):
        for name, value, low in (("start_frame", start_frame, 0), ("frame_count", frame_count, 0),
                                 ("every_nth", every_nth, 1), ("width", width, 0), ("height", height, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be a whole number >= {low}; got {value!r}")
        if resize_filter not in RESIZE_FILTERS:
            raise ValueError(f"resize_filter must be one of {list(RESIZE_FILTERS)}; got {resize_filter!r}")
        self.source, self.filter = source, RESIZE_FILTERS[resize_filter]
        with _open(source) as container:
            stream = _video_stream(container, source)
            source_w, source_h = stream.codec_context.width, stream.codec_context.height
            deep = stream.codec_context.format is not None and stream.codec_context.format.components[0].bits > 8
            self.source_fps = _frame_rate(stream)
            self.source_frames = sum(1 for packet in container.demux(stream) if packet.size)
        selected = range(start_frame, self.source_frames, every_nth)
        if frame_count:
            selected = selected[:frame_count]
        if not selected:
            raise ValueError(f"start_frame {start_frame} is past the end of {_name(source)} ({self.source_frames} frames)")
        self.selection, self.bits = selected, 16 if deep else 8
        if width and not height:
            height = max(1, round(source_h * width / source_w))
        elif height and not width:
            width = max(1, round(source_w * height / source_h))
        self.width, self.height = width or source_w, height or source_h
        self.fps = self.source_fps / every_nth
        if channels not in (3, 4):
            raise ValueError(f"channels must be 3 (RGB) or 4 (RGBA); got {channels!r}")
        self.shape = (1, channels, len(selected), self.height, self.width)
        self._frames = None  # generator of selected frames (numpy H,W,3)
        self._next = 0  # index (in the selection) of the frame the generator yields next

    @property
    def frames(self) -> int:
        return self.shape[2]

    @property
    def _format(self) -> str:
        """The FFmpeg format frames are converted to: RGB or RGBA, 8 or 16 bits."""
        if self.shape[1] == 4:
            return "rgba" if self.bits == 8 else RGBA64
        return "rgb24" if self.bits == 8 else RGB48

    def _decode(self):
        """Selected frames as numpy H,W,3 (uint8, or uint16 for deep files), decoded in order."""
        first, step, end = self.selection.start, self.selection.step, self.selection[-1] + 1
        index = 0
        with _open(self.source) as container:
            stream = _video_stream(container, self.source)
            stream.thread_type = "AUTO"  # frame threads: decoding keeps up with the encoder
            try:
                for frame in container.decode(stream):
                    if index >= end:
                        return
                    if index >= first and (index - first) % step == 0:
                        yield frame.reformat(width=self.width, height=self.height, interpolation=self.filter,
                                             format=self._format).to_ndarray()
                    index += 1
            except av.FFmpegError as error:
                raise ValueError(f"{_name(self.source)} is damaged after frame {index}: {error}") from error
        raise ValueError(f"{_name(self.source)} ended after {index} frames, but its packets announced "
                         f"{self.source_frames}; the file is damaged or incomplete")

    def read(self, start: int, stop: int) -> torch.Tensor:
        """Selected frames [start, stop) as 1,C,stop-start,H,W float32 in [-1, 1] (pixel / max * 2 - 1,
        the same numbers StreamVAE Encode makes from an IMAGE of these frames)."""
        if not 0 <= start < stop <= self.frames:
            raise IndexError(f"frames [{start}, {stop}) are outside the {self.frames} selected frames")
        if self._frames is None or start < self._next:
            self.close()
            self._frames, self._next = self._decode(), 0
        arrays = []
        while self._next < stop:
            array = next(self._frames)
            if self._next >= start:
                arrays.append(array)
            self._next += 1
        pixels = np.stack(arrays)
        frames = torch.from_numpy(pixels) / 255.0 if self.bits == 8 else torch.from_numpy(pixels.astype(np.int32)) / 65535.0
        return frames.permute(3, 0, 1, 2).unsqueeze(0).contiguous().mul_(2).sub_(1)

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        """Frames `index` (ascending; repeats allowed) as `read` gives them: the tensor method
        `engine.encode` takes its chunks with."""
        if dim != 2:
            raise ValueError(f"a VideoReader selects frames (dim 2 of 1,3,T,H,W), not dim {dim}")
        first = int(index[0])
        return self.read(first, int(index[-1]) + 1).index_select(2, index - first)

    def close(self) -> None:
        if self._frames is not None:
            self._frames.close()
            self._frames = None

    def __enter__(self) -> "VideoReader":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
