"""What a video file is written as: codec, container, pixel format, bit depth, quality and colour.

The choices are checked against the PyAV (FFmpeg) build that runs, so a missing encoder or a pixel
format the codec cannot store is one clear error before any frame is decoded. Colour is always
stated, never left to a player's guess:

- YUV pixel formats use the BT.709 matrix in limited range (luma 16-235, chroma 16-240 at 8 bit),
  and the stream is tagged BT.709 (matrix, primaries, transfer) and limited range.
- `rgb` stores the decoded R, G, B planes themselves (full range, no matrix); with FFV1 this is
  lossless: reading the file back gives the written 8-bit (or 16-bit) values exactly.

Alpha (RGBA VAEs): FFV1 and ProRes 4444 (yuv444) store it as a fourth plane (`with_alpha`); the
other choices cannot, and the frames are then written opaque with a note saying so.
"""
from dataclasses import dataclass, replace
from fractions import Fraction

import av

PIXEL_FORMATS = ("auto", "yuv420", "yuv422", "yuv444", "rgb")
BIT_DEPTHS = ("auto", "8", "10", "12", "16")
# FFmpeg enum values of the stream's colour tags (libavutil/pixfmt.h).
BT709, RGB_MATRIX, LIMITED_RANGE, FULL_RANGE = 1, 0, 1, 2


class VideoFormatError(ValueError):
    """The requested codec/pixel format/bit depth cannot be written with this PyAV build."""


@dataclass(frozen=True)
class Codec:
    name: str  # what users pick
    label: str
    encoder: str  # FFmpeg encoder name
    container: str  # file extension (and muxer)
    audio_encoder: str
    pixel_format: str  # what "auto" means
    bit_depth: int
    quality: str  # what `crf` does for this codec
    alpha: bool  # whether files of this codec keep an alpha plane that players and FFmpeg read back


CODECS = {codec.name: codec for codec in (
    Codec("h264", "H.264", "libx264", "mp4", "aac", "yuv420", 8, "crf", False),
    Codec("h265", "H.265/HEVC", "libx265", "mp4", "aac", "yuv420", 8, "crf", False),
    Codec("ffv1", "FFV1 (lossless)", "ffv1", "mkv", "flac", "rgb", 8, "lossless", True),
    Codec("prores", "ProRes", "prores_ks", "mov", "pcm_s16le", "yuv422", 10, "profile", True),
)}
MAX_CRF = 51
# Bits per pixel ProRes (prores_ks 422 HQ and 4444) spent at least: flat grey frames, 256x256, took 0.11-0.13
# (noise 6-10); the floor of `VideoEncoding.size_floor`.
PRORES_FLOOR_BITS = 0.1


def encoder_pixel_formats(encoder: str) -> set[str] | None:
    """FFmpeg pixel formats `encoder` accepts in this PyAV build; None when it has no such encoder."""
    try:
        codec = av.codec.Codec(encoder, "w")
    except Exception:  # av raises UnknownCodecError (older builds: ValueError) for a missing encoder
        return None
    return {f.name for f in codec.video_formats or ()}


def ffmpeg_pixel_formats(pixel_format: str, bits: int) -> tuple[str, ...]:
    """FFmpeg names for a pixel format at a bit depth, preferred first (8-bit RGB: planar, else packed)."""
    if pixel_format == "rgb":
        return ("gbrp", "bgr0") if bits == 8 else (f"gbrp{bits}le",)
    return (f"{pixel_format}p",) if bits == 8 else (f"{pixel_format}p{bits}le",)


def ffmpeg_alpha_formats(pixel_format: str, bits: int) -> tuple[str, ...]:
    """FFmpeg names of a pixel format with an alpha plane, preferred first."""
    if pixel_format == "rgb":
        return ("gbrap", "bgra") if bits == 8 else (f"gbrap{bits}le",)
    return (f"yuva{pixel_format[3:]}p",) if bits == 8 else (f"yuva{pixel_format[3:]}p{bits}le",)


def available_codecs() -> list[str]:
    return [name for name, codec in CODECS.items() if encoder_pixel_formats(codec.encoder) is not None]


@dataclass(frozen=True)
class VideoEncoding:
    """A checked choice of how frames are written (see `resolve`)."""

    codec: Codec
    pixel_format: str  # yuv420 | yuv422 | yuv444 | rgb
    bit_depth: int
    pix_fmt: str  # the FFmpeg pixel format of the stream
    crf: int
    fps: Fraction
    alpha: bool = False  # frames are R, G, B, alpha and the stream keeps the alpha plane

    @property
    def extension(self) -> str:
        return self.codec.container

    @property
    def is_rgb(self) -> bool:
        return self.pixel_format == "rgb"

    @property
    def input_bits(self) -> int:
        """Bits per channel of the frames handed to the encoder: 8, else 16 (scaled down by FFmpeg)."""
        return 8 if self.bit_depth == 8 else 16

    @property
    def lossless(self) -> bool:
        return self.codec.quality == "lossless" and self.is_rgb

    def check_size(self, width: int, height: int) -> None:
        """4:2:0 stores chroma at half width and height, 4:2:2 at half width: those need even sizes."""
        odd = (self.pixel_format in ("yuv420", "yuv422") and width % 2) or (self.pixel_format == "yuv420" and height % 2)
        if odd:
            even = "width and height" if self.pixel_format == "yuv420" else "width"
            raise VideoFormatError(f"{self.pixel_format} needs an even {even}, but the video is {width}x{height} px: "
                                   "pick pixel_format yuv444 or rgb (or ffv1), or decode to an even size")

    def size_floor(self, width: int, height: int, frames: int) -> int | None:
        """Bytes the file will need at least, where the codec allows a guess: ProRes spends a minimum number
        of bits per pixel however flat the frames (PRORES_FLOOR_BITS); H.264/H.265 (quality-driven) and
        FFV1 (lossless) shrink with the content to almost nothing, so None."""
        if self.codec.quality != "profile":
            return None
        return int(width * height * frames * PRORES_FLOOR_BITS / 8)

    def options(self) -> dict[str, str]:
        """Encoder options: quality, and quiet x265 (it logs every setting to stderr otherwise)."""
        if self.codec.quality == "crf":
            options = {"crf": str(self.crf)}
            if self.codec.encoder == "libx265":
                options["x265-params"] = "log-level=error"
            return options
        if self.codec.quality == "profile":  # ProRes: 422 HQ, or 4444 for 4:4:4
            return {"profile": "4" if self.pixel_format == "yuv444" else "3"}
        return {}

    def with_alpha(self, channels: int) -> tuple["VideoEncoding", str | None]:
        """This encoding for frames of `channels` image channels: with an alpha plane for 4 where the
        codec and pixel format keep one, else as it is and a note saying the alpha is not kept."""
        if channels != 4:
            return self, None
        supported = encoder_pixel_formats(self.codec.encoder) or set()
        pix_fmt = next((f for f in ffmpeg_alpha_formats(self.pixel_format, self.bit_depth) if f in supported), None)
        if self.codec.alpha and pix_fmt is not None:
            return replace(self, pix_fmt=pix_fmt, alpha=True), None
        return self, (f"{self.codec.label} {self.pixel_format} cannot store alpha: the RGBA frames are written opaque "
                      "(alpha dropped); pick ffv1 (rgb or yuv), or prores with pixel_format yuv444 (4444), to keep it")

    def describe(self) -> str:
        """One line saying what is written, including the colour conversion."""
        if self.is_rgb:
            colour = "RGB planes, full range, no matrix" + (" (lossless)" if self.lossless else "")
        else:
            colour = "BT.709 matrix, limited range"
        quality = {"crf": f", crf {self.crf}", "profile": ", profile " + ("4444" if self.pixel_format == "yuv444" else "422 HQ")}
        colour += ", with alpha" if self.alpha else ""
        return (f"{self.codec.label} in .{self.extension}, {self.pix_fmt} ({self.bit_depth}-bit), {colour}"
                f"{quality.get(self.codec.quality, '')}, {float(self.fps):g} fps")


def as_fps(fps) -> Fraction:
    """Frames per second as an exact fraction (23.976 -> 2997/125; NTSC rates stay exact)."""
    try:
        value = Fraction(fps).limit_denominator(1001)
    except (ValueError, TypeError, OverflowError):  # NaN, Inf, text
        value = None
    if value is None or not 0 < value <= 1000:
        raise VideoFormatError(f"fps must be between 0 and 1000 frames per second; got {fps}")
    return value


def resolve(codec: str = "h264", pixel_format: str = "auto", bit_depth="auto", crf: int = 19, fps=24) -> VideoEncoding:
    """Check a codec/pixel format/bit depth/crf/fps choice against this PyAV build.

    "auto" picks the codec's usual format (H.264/H.265: yuv420 8-bit; FFV1: rgb 8-bit, lossless;
    ProRes: yuv422 10-bit). Raises VideoFormatError naming what this build can write instead.
    """
    if codec not in CODECS:
        raise VideoFormatError(f"codec must be one of {list(CODECS)}; got {codec!r}")
    spec = CODECS[codec]
    supported = encoder_pixel_formats(spec.encoder)
    if supported is None:
        raise VideoFormatError(f"this PyAV/FFmpeg build has no {spec.label} encoder ({spec.encoder}); pick one of "
                               f"{available_codecs()} or install a PyAV build with it")
    pixel_format = spec.pixel_format if pixel_format == "auto" else pixel_format
    if pixel_format not in PIXEL_FORMATS[1:]:
        raise VideoFormatError(f"pixel_format must be one of {list(PIXEL_FORMATS)}; got {pixel_format!r}")
    bits = spec.bit_depth if bit_depth == "auto" else int(bit_depth)
    if str(bits) not in BIT_DEPTHS[1:]:
        raise VideoFormatError(f"bit_depth must be one of {list(BIT_DEPTHS)}; got {bit_depth!r}")
    pix_fmt = next((name for name in ffmpeg_pixel_formats(pixel_format, bits) if name in supported), None)
    if pix_fmt is None:
        choices = [f"{p} {b}-bit" for p in PIXEL_FORMATS[1:] for b in (8, 10, 12, 16)
                   if any(name in supported for name in ffmpeg_pixel_formats(p, b))]
        raise VideoFormatError(f"{spec.label} cannot store {pixel_format} at {bits} bit with this build; it can store: "
                               f"{', '.join(choices)}")
    if isinstance(crf, bool) or not isinstance(crf, int) or not 0 <= crf <= MAX_CRF:
        raise VideoFormatError(f"crf must be a whole number from 0 (best) to {MAX_CRF}; got {crf!r}")
    return VideoEncoding(spec, pixel_format, bits, pix_fmt, crf, as_fps(fps))
