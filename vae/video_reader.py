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
        _refuse_without_index(source)
        raise ValueError(f"cannot open {_name(source)} as a video: {getattr(error, 'strerror', None) or error}") from error


def _name(source) -> str:
    return "the video" if hasattr(source, "read") else str(source)


def _video_stream(container, source):
    if not container.streams.video:
        _refuse_without_index(source)
        raise ValueError(f"{_name(source)} has no video stream (or no frames in it)")
    return container.streams.video[0]


def _frame_rate(stream) -> Fraction:
    rate = stream.average_rate or stream.guessed_rate
    return Fraction(rate) if rate else Fraction(24)


def _ends_early(source) -> str | None:
    """What the container's own structure says is missing, read from its first bytes without FFmpeg:
    "index" for an MP4/MOV without its complete moov box (written last, it lists the frames), "end" for
    an MP4 box or a Matroska/WebM segment that states more bytes than the file has; None when it is
    complete, or its format states no length (other containers, a Matroska file never closed)."""
    try:
        file = source if hasattr(source, "read") else open(source, "rb")
    except OSError:
        return None
    try:
        size = file.seek(0, 2)
        file.seek(0)
        head = file.read(12)
        if head[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip"):  # ISO base media: top-level boxes
            at, index = 0, False
            while at + 8 <= size:
                file.seek(at)
                box = file.read(16)
                length = int.from_bytes(box[:4], "big") or size - at  # 0: to the end of the file
                if length == 1:  # a 64-bit size follows the type
                    length = int.from_bytes(box[8:16], "big")
                if length < 8 or at + length > size:
                    return "end" if index else "index"
                index, at = index or box[4:8] == b"moov", at + length
            return None if index else "index"
        if head[:4] == b"\x1a\x45\xdf\xa3":  # EBML: its header, then the Segment element and its size
            file.seek(4)
            length, _ = _vint(file)
            file.seek(file.tell() + length)
            if file.read(4) == b"\x18\x53\x80\x67":
                length, unknown = _vint(file)
                return "end" if not unknown and file.tell() + length > size else None
        return None
    except (OSError, ValueError):
        return None
    finally:
        if file is not source:
            file.close()


def _vint(file) -> tuple[int, bool]:
    """An EBML variable-size integer read at the file's position (length in its leading zero bits):
    (its value, whether it is all ones: "unknown", a file never closed)."""
    first = file.read(1)[0]
    width = 9 - first.bit_length()
    value = first & (0xFF >> width)
    for byte in file.read(width - 1):
        value = value << 8 | byte
    return value, value == (1 << 7 * width) - 1


def _refuse_without_index(source) -> None:
    if _ends_early(source) == "index":
        raise ValueError(f"{_name(source)} is an MP4 cut off before its index (the moov box that lists its frames, "
                         "written when the file is finished): its download, copy or recording stopped early, and "
                         "without the index no frame can be found. Download or export it again.")


def _measured_rate(stream, stamps: list[int], name: str) -> tuple[Fraction, str | None]:
    """The frame rate to encode at, and a note where it is not simply the one the file states: the
    average of a variable rate over the frames' timestamps (`stamps`, in the stream's time base, any
    order), or 24 where neither the file nor its timestamps give one."""
    stamps = sorted(stamps)
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    spaced = bool(steps) and min(steps) > 0 and stream.time_base is not None
    average = (Fraction(len(steps)) / ((stamps[-1] - stamps[0]) * stream.time_base)).limit_denominator(1001) \
        if spaced else None
    if spaced and max(steps) - min(steps) > max(1, min(steps) // 50):  # not one rate (rounding aside)
        ms = [float(step * stream.time_base) * 1000 for step in (min(steps), max(steps))]
        return average, (f"{name} has a variable frame rate (frames {ms[0]:.0f} to {ms[1]:.0f} ms apart): encoded at "
                         f"its average, {float(average):.4g} fps")
    if stream.average_rate or stream.guessed_rate:
        return _frame_rate(stream), None
    return (average, None) if spaced else (Fraction(24), f"{name} states no frame rate: 24 fps assumed")


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
        self.notes: list[str] = []  # what the reader assumed or accepted, for the caller to report
        with _open(source) as container:
            stream = _video_stream(container, source)
            source_w, source_h = stream.codec_context.width, stream.codec_context.height
            deep = stream.codec_context.format is not None and stream.codec_context.format.components[0].bits > 8
            stated = _metadata_frames(container, stream, _frame_rate(stream))
            packets = [packet.pts for packet in container.demux(stream) if packet.size]
            self.source_frames = len(packets)
            self.source_fps, note = _measured_rate(stream, [p for p in packets if p is not None], _name(source))
        self.notes += [note] if note else []
        selected = range(start_frame, self.source_frames, every_nth)
        if frame_count:
            selected = selected[:frame_count]
        if not selected:
            raise ValueError(f"start_frame {start_frame} is past the end of {_name(source)} ({self.source_frames} frames)")
        if _ends_early(source) == "end" and self.source_frames < (stated or self.source_frames + 1):
            self._short(stated, selected, frame_count)
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

    def _short(self, stated: int | None, selected: range, frame_count: int) -> None:
        """The file is cut off (its container states more bytes than it has): with fewer frames readable
        than it states, an error, unless `frame_count` asked for frames that all end before the cut (then
        a note naming both counts); where it states no count, a note."""
        n = self.source_frames
        if stated is None:
            self.notes.append(f"{_name(self.source)} is cut off (it ends before its container says): its {n} readable "
                              "frames are read")
            return
        said = f"{_name(self.source)} is cut off: its container states {stated} frames"
        if frame_count and len(selected) == frame_count:
            self.notes.append(f"{said}, and {n} can be read; the {frame_count} frames asked for are among them")
            return
        raise ValueError(f"{said}, but only {n} can be read: its download, copy or recording stopped early. Download "
                         f"or export it again, or set frame_count (python -m vae encode: --count) to encode only frames "
                         f"that are there (start_frame + frames x every_nth within the first {n}).")

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
