"""`VideoWriter`: RGB (or RGBA) frames -> a video file, encoded on a background thread behind a bounded queue.

The producer (the decode) hands over chunks of frames and goes on decoding while the thread
converts and encodes them; the queue holds at most `queue_chunks` chunks, so memory does not grow
with the clip and a slow encoder slows the decode down instead of piling frames up.

Nothing that looks complete appears before the end: frames go to a partial file of this writer's own
in the target's folder (`<name>.partial.<ext>`, or `<name>.partial-2.<ext>`, ... where that name is
taken, e.g. by another run writing the same target: created exclusively), which takes the target's
name in one atomic step only when every expected frame was written and the file was closed. Nothing
is replaced unless asked (`overwrite`), not even then a target that changed while this one was
written (another run's), and the path (folder, name, free space for what the codec needs at least)
is checked when the writer is made, before anything is decoded. MP4/MOV are written as fragmented
MP4 (a fragment at least every second) and MKV in clusters of at most a second, each flushed to the
disk as it is made, so a full disk stops the run within a second of video, and a partial file cut off
by a full disk or a killed process is still a playable video up to its last complete fragment; after
a cancel or an error the file is closed properly and kept under its partial name, and the error says
how many frames it holds.
"""
import errno
import logging
import os
import queue
import shutil
import sys
import threading
from pathlib import Path

import av
import numpy as np

from .video_codecs import BT709, FULL_RANGE, LIMITED_RANGE, RGB_MATRIX, VideoEncoding, VideoFormatError

log = logging.getLogger("streamvae")
RGB48 = "rgb48le" if sys.byteorder == "little" else "rgb48be"
RGBA64 = "rgba64le" if sys.byteorder == "little" else "rgba64be"
# Muxer options: every packet's bytes handed to the disk at once (a write error, such as a full disk,
# then surfaces while the run goes on), in fragments / clusters of at most a second.
FLUSHED = {"flush_packets": "1"}
MUXER_OPTIONS = {"mp4": {**FLUSHED, "movflags": "+frag_keyframe+empty_moov+default_base_moof+use_metadata_tags",
                         "frag_duration": "1000000"},  # microseconds
                 "mkv": {**FLUSHED, "cluster_time_limit": "1000"}}  # milliseconds
MUXER_OPTIONS["mov"] = MUXER_OPTIONS["mp4"]
PARTIAL_NAMES = 100  # <name>.partial.<ext>, then -2 ... -100: more runs on one target at once than anyone has
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class VideoWriteError(RuntimeError):
    """Writing the video failed; `partial_path` holds what was written (None when nothing was)."""

    def __init__(self, message: str, partial_path: Path | None = None):
        super().__init__(message)
        self.partial_path = partial_path


def partial_path(path: Path, number: int = 1) -> Path:
    """The `number`th name a partial file of `path` may take (1: `<name>.partial.<ext>`)."""
    return path.with_name(f"{path.stem}.partial{'' if number == 1 else f'-{number}'}{path.suffix}")


def identity(path: Path) -> tuple[int, int, int, int] | None:
    """(device, inode, size, modification time in ns) of the file at `path`, None where there is none:
    what tells that a target was written while this run wrote its own video."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def readable_frames(path: Path) -> int:
    """Video frames of the file at `path` that can be read whole: its complete packets (FFmpeg marks one
    cut off at the end of the file corrupt), counted without decoding them."""
    try:
        with av.open(str(path)) as container:
            return sum(1 for p in container.demux(video=0) if p.size and not p.is_corrupt)
    except (OSError, av.FFmpegError, IndexError, EOFError):  # no video stream, or nothing readable at all
        return 0


def _disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in DISK_FULL


def _reason(error: BaseException) -> str:
    if _disk_full(error):
        return f"the disk is full ({error.strerror})"
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


class VideoWriter:
    """Writes `frames` frames of width x height to `path` as `encoding` says (see module docstring).

    `write(chunk)` takes frames T,H,W,3 (T,H,W,4 when `encoding.alpha`) as uint8 (8-bit encodings)
    or uint16 (deeper ones).
    `audio` = (waveform C,S float in -1..1, sample_rate) is muxed alongside, cut to the video's
    length. `metadata` (str -> str) goes into the container's tags. Use `finish()` on success,
    `abort()` on failure or cancel.
    """

    def __init__(self, path, encoding: VideoEncoding, width: int, height: int, frames: int, *, audio=None,
                 metadata: dict | None = None, queue_chunks: int = 2, overwrite: bool = False):
        encoding.check_size(width, height)
        self.path, self.encoding, self.frames, self.overwrite = Path(path), encoding, frames, overwrite
        if self.path.suffix.lower() != f".{encoding.extension}":
            raise VideoFormatError(f"{encoding.codec.label} is written as .{encoding.extension}; name the file "
                                   f"{self.path.stem}.{encoding.extension} instead of {self.path.name}")
        self.partial: Path | None = None  # this writer's own file, made by `_claim`
        self.queued = self.encoded = 0
        self._error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=queue_chunks)
        self._claim(width, height)
        try:
            self._container = av.open(str(self.partial), mode="w", options=MUXER_OPTIONS.get(encoding.extension, FLUSHED))
        except (OSError, av.FFmpegError) as error:
            self.partial.unlink(missing_ok=True)
            raise VideoWriteError(f"cannot write the video into {self.path.parent}: {_reason(error)}. Choose another "
                                  "folder (filename_prefix / --out) or make this one writable; nothing was written.") from error
        try:
            for key, value in (metadata or {}).items():
                self._container.metadata[key] = value
            self._stream = self._add_video_stream(width, height)
            self._audio = self._add_audio_stream(audio) if audio is not None else None
        except BaseException:
            self._container.close()
            self.partial.unlink(missing_ok=True)
            raise
        self._thread = threading.Thread(target=self._run, name="streamvae-video-writer", daemon=True)
        self._thread.start()

    # --- setup -----------------------------------------------------------------------------------
    def _claim(self, width: int, height: int) -> None:
        """Everything about the path that can fail, checked before a frame is decoded (FFmpeg opens
        the file only when the first packet is written): nothing is replaced without `overwrite`, and
        a folder never, the folder can be made and written, the name is valid there, and the disk has
        room for what the codec is predicted to need at least (`VideoEncoding.size_floor`). Creates
        this writer's own empty partial file, and notes what the target is now."""
        if os.path.isdir(self.path):
            raise VideoWriteError(f"{self.path} is a folder; nothing was written. Name a file in it, e.g. "
                                  f"{self.path / ('video.' + self.encoding.extension)}.")
        if os.path.exists(self.path) and not self.overwrite:  # (Path.exists raises for a name too long)
            raise VideoWriteError(f"{self.path} exists; nothing was written. Choose another name, or replace it "
                                  "explicitly (python -m vae: --overwrite; vae.decode_to_file: overwrite=True).")
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            needed, free = self.encoding.size_floor(width, height, self.frames), shutil.disk_usage(folder).free
        except OSError as error:
            blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
            reason = f"{blocker} is a file, not a folder" if blocker is not None else _reason(error)
            raise VideoWriteError(f"cannot write the video into {folder}: {reason}. Choose another folder "
                                  "(filename_prefix / --out) or make this one writable; nothing was written.") from error
        if needed is not None and needed > free:
            raise VideoWriteError(f"{self.frames} frames of {width}x{height} as {self.encoding.codec.label} need at "
                                  f"least {needed / 2**30:.3g} GiB, but {folder} has {free / 2**30:.3g} GiB free: free "
                                  "space, choose another folder, or pick h264/h265; nothing was written.")
        try:
            self.partial = self._create_partial()
        except (OSError, ValueError) as error:  # ValueError: a name with a NUL byte
            if getattr(error, "errno", None) == errno.ENAMETOOLONG:
                length = len(os.fsencode(partial_path(self.path).name))
                reason = (f"the name {self.path.name} is too long for this file system ({length} bytes with the "
                          ".partial it is written under)")
            else:
                reason = _reason(error)
            raise VideoWriteError(f"cannot write the video {self.path}: {reason}. Choose another name or folder "
                                  "(filename_prefix / --out); nothing was written.") from error
        self._target = identity(self.path)

    def _create_partial(self) -> Path:
        """The first free partial name of the target, created exclusively (O_EXCL): no other run, and no
        file a failed run left, is ever written into."""
        for number in range(1, PARTIAL_NAMES + 1):
            candidate = partial_path(self.path, number)
            try:
                os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                return candidate
            except FileExistsError:
                continue
        raise FileExistsError(errno.EEXIST, f"{partial_path(self.path).name} to -{PARTIAL_NAMES} are all taken "
                                            "(by other runs, or left by failed ones): remove them")

    def _add_video_stream(self, width: int, height: int):
        e = self.encoding
        stream = self._container.add_stream(e.codec.encoder, rate=e.fps)
        stream.width, stream.height, stream.pix_fmt = width, height, e.pix_fmt
        stream.options = e.options()
        context = stream.codec_context
        # Tag what the pixels are, so players do not guess (BT.601 vs BT.709, limited vs full range).
        context.colorspace = RGB_MATRIX if e.is_rgb else BT709
        context.color_range = FULL_RANGE if e.is_rgb else LIMITED_RANGE
        context.color_primaries = context.color_trc = BT709
        return stream

    def _add_audio_stream(self, audio):
        waveform, sample_rate = audio
        waveform = np.asarray(waveform, dtype=np.float32)
        if waveform.ndim != 2 or waveform.shape[0] not in (1, 2) or sample_rate <= 0:
            raise ValueError(f"audio must be 1 or 2 channels of samples (C,S) at a positive sample rate; got shape "
                             f"{waveform.shape} at {sample_rate} Hz")
        samples = round(self.frames / self.encoding.fps * sample_rate)  # the video's length
        self._audio_samples = np.ascontiguousarray(waveform[:, :samples].T).reshape(1, -1)
        self._audio_layout = "mono" if waveform.shape[0] == 1 else "stereo"
        stream = self._container.add_stream(self.encoding.codec.audio_encoder, rate=int(sample_rate))
        stream.layout = self._audio_layout
        return stream

    # --- the writer thread -----------------------------------------------------------------------
    def _run(self) -> None:
        ended = False  # the end-of-frames marker was taken from the queue
        try:
            if self._audio is not None:
                frame = av.AudioFrame.from_ndarray(self._audio_samples, format="flt", layout=self._audio_layout)
                frame.sample_rate, frame.pts = self._audio.rate, 0
                self._container.mux(self._audio.encode(frame))
                self._container.mux(self._audio.encode(None))
            while (chunk := self._queue.get()) is not None:
                for array in chunk:
                    self._encode(array)
            ended = True
            self._container.mux(self._stream.encode(None))  # flush the encoder's delayed frames
        except BaseException as error:  # reported to the producer by write() / finish()
            self._error = error
            while not ended and self._queue.get() is not None:  # a producer blocked on a full queue goes on
                pass

    def _encode(self, array: np.ndarray) -> None:
        e = self.encoding
        if e.alpha:
            frame = av.VideoFrame.from_ndarray(array, format="rgba" if array.dtype == np.uint8 else RGBA64)
        else:
            frame = av.VideoFrame.from_ndarray(array, format="rgb24" if array.dtype == np.uint8 else RGB48)
        if e.is_rgb:
            frame = frame.reformat(format=e.pix_fmt)
        else:
            frame = frame.reformat(format=e.pix_fmt, dst_colorspace="ITU709", dst_color_range="MPEG")
        frame.pts = self.encoded
        self._container.mux(self._stream.encode(frame))
        self.encoded += 1

    # --- the producer side -----------------------------------------------------------------------
    @property
    def channels(self) -> int:
        """Channels of the frames `write` takes: 4 (R, G, B, alpha) when the encoding keeps alpha, else 3."""
        return 4 if self.encoding.alpha else 3

    def write(self, chunk: np.ndarray) -> None:
        """Queue frames T,H,W,C (C = `channels`) for encoding; blocks while the queue is full; raises
        VideoWriteError as soon as the writer thread has failed."""
        expected = np.uint8 if self.encoding.input_bits == 8 else np.uint16
        shape = (self._stream.height, self._stream.width, self.channels)
        if chunk.dtype != expected or chunk.ndim != 4 or chunk.shape[1:] != shape:
            raise ValueError(f"frames must be {np.dtype(expected).name} T,{','.join(map(str, shape))}; "
                             f"got {chunk.dtype} {chunk.shape}")
        while True:
            self._check_thread()
            try:
                self._queue.put(chunk, timeout=0.5)
                break
            except queue.Full:
                continue
        self.queued += len(chunk)

    def _check_thread(self) -> None:
        if self._error is not None:
            self._stop()
            advice = " Free disk space or choose another folder and run again." if _disk_full(self._error) else ""
            raise self._failure(f"writing {self.partial.name} failed after {self.encoded} of {self.frames} frames: "
                                f"{_reason(self._error)}.{advice}", self._error)

    def _stop(self) -> None:
        """End the thread and close the file (errors while closing are logged: the run already failed)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._container is not None:
            try:
                self._container.close()
            except Exception as error:
                log.warning("StreamVAE: closing %s failed: %s", self.partial, _reason(error))
            self._container = None

    def _failure(self, message: str, cause: BaseException | None = None) -> VideoWriteError:
        """The error to raise, saying how many frames the partial file holds; it is kept when it holds
        any, else removed (a message names only a file that exists). After a write error some encoded
        frames never reached the disk: the file's readable frames are counted then."""
        held = 0
        if self.encoded and self.partial.is_file() and self.partial.stat().st_size > 0:
            held = self.encoded if self._error is None else readable_frames(self.partial)
        if not held:
            self.partial.unlink(missing_ok=True)
            error = VideoWriteError(message + " Nothing was written.")
        else:
            error = VideoWriteError(f"{message} The first {held} of the {self.frames} frames stay readable in "
                                    f"{self.partial} (not the complete video).", self.partial)
        error.__cause__ = cause
        return error

    def finish(self) -> Path:
        """Encode what is queued, close the file and give it its final name; returns that path."""
        self._queue.put(None)
        self._thread.join()
        self._check_thread()
        try:
            self._container.close()
        except (OSError, av.FFmpegError) as error:
            self._container = None
            raise self._failure(f"closing {self.partial.name} failed: {_reason(error)}.", error) from error
        self._container = None
        if self.encoded != self.frames:
            raise self._failure(f"{self.encoded} of {self.frames} frames arrived at the writer; the file is incomplete.")
        if self.overwrite and identity(self.path) == self._target:
            os.replace(self.partial, self.path)  # atomic: readers see the old file or the new one
        elif self.overwrite or not self._link():
            raise VideoWriteError(f"{self.path} {'changed' if self.overwrite else 'appeared'} while this video was "
                                  "written (another run wrote it?); it was left alone, and this run's complete video is "
                                  f"{self.partial}.", self.partial)
        return self.path

    def _link(self) -> bool:
        """Give the partial file the target's name unless the target exists (never replacing one, in one
        atomic step: a hard link, then the partial name removed); False when it exists. On a file
        system without hard links, checked and then renamed."""
        try:
            os.link(self.partial, self.path)
        except FileExistsError:
            return False
        except OSError:  # no hard links here (FAT, some network shares)
            if os.path.lexists(self.path):
                return False
            os.replace(self.partial, self.path)
            return True
        self.partial.unlink()
        return True

    def abort(self, reason: str) -> VideoWriteError:
        """Stop after the queued frames, close the file, and return the error to raise (`reason` first)."""
        self._stop()
        return self._failure(reason)

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is not None and self._container is not None:
            failure = self.abort(f"{kind.__name__}: {error}")
            if failure.partial_path is not None:  # the error goes on up; where its frames stay is said here
                log.warning("StreamVAE: %s", failure)
