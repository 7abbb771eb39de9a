"""Decoding to and encoding from video files (`vae.video_file`, `video_writer`, `video_reader`) with
real files through PyAV: every frame arrives exactly once, lossless files are exact, the colour
conversion is the stated one, and failures leave a clearly named, readable partial file.
"""
import json
import re
import subprocess
import sys
import textwrap

import av
import numpy as np
import pytest
import torch

import vae
from reference import REPO, assert_exact, load_tiny
import vae
from vae.video_codecs import VideoFormatError, resolve
from vae.video_file import FileSink, to_pixels
from vae.video_reader import VideoReader, probe
from vae.video_writer import VideoWriteError, VideoWriter

FAMILY = "wan21"


@pytest.fixture(scope="module")
def model():
    return load_tiny(FAMILY)


def latent(model, frames=3, h=4, w=6, batch=1, seed=0):
    return torch.randn(batch, model.latent_channels, frames, h, w, generator=torch.Generator().manual_seed(seed))


def file_frames(path) -> np.ndarray:
    """Every frame of a video file, decoded with PyAV directly (not our reader), as stored:
    uint8 RGB for 8-bit files, uint16 for deeper ones."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        deep = stream.codec_context.format.components[0].bits > 8
        return np.stack([f.to_ndarray(format="rgb48le" if deep else "rgb24") for f in container.decode(stream)])


@pytest.mark.parametrize("bit_depth", ["8", "16"])
@pytest.mark.parametrize("temporal_chunk", [1, 2, 3])
def test_lossless_file_holds_exactly_the_decoded_frames(model, tmp_path, bit_depth, temporal_chunk):
    """FFV1 RGB: the file's frames equal the in-memory decode (same settings) rounded to 8/16 bits, for
    chunkings whose boundaries fall differently (1, 2, 3 latent frames per step), with a frame count
    that is not 4n+1: a frame dropped or repeated at a boundary would shift every later frame."""
    z = latent(model, frames=4)
    frames, height, width = 11, 30, 44  # 4 latent frames decode to 13 x 32 x 48; trimmed
    path = vae.decode_to_file(model, z, tmp_path / "clip.mkv", vae.Settings(temporal_chunk=temporal_chunk),
                              codec="ffv1", pixel_format="rgb", bit_depth=bit_depth, fps=12, num_frames=frames,
                              height=height, width=width)
    assert path == tmp_path / "clip.mkv" and not (tmp_path / "clip.partial.mkv").exists()
    expected = to_pixels(vae.decode(model, z, vae.Settings(temporal_chunk=temporal_chunk), num_frames=frames,
                                    height=height, width=width),
                         int(bit_depth))
    info = probe(path)
    assert (info.frames, info.width, info.height, info.fps) == (frames, width, height, 12)
    got = file_frames(path)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_clips_are_written_one_after_another(model, tmp_path):
    z = latent(model, frames=2, batch=2)
    path = vae.decode_to_file(model, z, tmp_path / "two.mkv", vae.Settings(temporal_chunk=1), codec="ffv1")
    expected = np.concatenate([to_pixels(vae.decode(model, z[i:i + 1]), 8) for i in range(2)])
    np.testing.assert_array_equal(file_frames(path), expected)


def test_h264_states_bt709_limited_range(tmp_path):
    """Known colours through the default H.264 path: the stream is tagged BT.709 / limited range, the
    stored luma is the BT.709 limited-range value, and reading back gives the colour within rounding."""
    colours = np.array([[16, 200, 90], [250, 250, 250], [10, 10, 10], [30, 120, 220]], dtype=np.uint8)
    frames = np.repeat(np.repeat(colours[:, None, None], 16, 1), 32, 2)  # 4 frames of one colour each, 16 x 32
    encoding = resolve("h264", "yuv444", "8", crf=0, fps=10)
    with VideoWriter(tmp_path / "c.mp4", encoding, 32, 16, len(frames)) as writer:
        writer.write(frames)
        path = writer.finish()
    info = probe(path)
    assert (info.colorspace, info.color_range, info.pix_fmt, info.frames) == (1, 1, "yuv444p", 4)
    with av.open(str(path)) as container:
        luma = [int(f.to_ndarray(channel_last=True)[8, 16, 0]) for f in container.decode(video=0)]
    r, g, b = colours.T / 255
    expected_luma = 16 + 219 * (0.2126 * r + 0.7152 * g + 0.0722 * b)
    assert np.abs(np.array(luma) - expected_luma).max() <= 1, (luma, expected_luma)
    with VideoReader(path) as reader:
        back = ((reader.read(0, 4)[0].permute(1, 2, 3, 0) + 1) * 127.5).numpy()
    assert np.abs(back - frames).max() <= 3  # 8-bit YUV quantisation, no matrix mismatch (that gives 10+)


def test_wrong_settings_fail_before_anything_is_written(tmp_path):
    with pytest.raises(VideoFormatError, match="10-bit"):  # ProRes stores 10 bits; the message lists what it can
        resolve("prores", bit_depth="8")
    with pytest.raises(VideoFormatError, match="even width and height"):
        VideoWriter(tmp_path / "odd.mp4", resolve("h264"), 33, 20, 5)
    with pytest.raises(VideoFormatError, match="name the file x.mkv"):
        VideoWriter(tmp_path / "x.mp4", resolve("ffv1"), 32, 20, 5)
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the output folder should be")
    with pytest.raises(VideoWriteError, match="cannot write the video into .*not_a_folder.*nothing was written"):
        VideoWriter(blocker / "clip.mp4", resolve("h264"), 32, 20, 5)
    assert list(tmp_path.iterdir()) == [blocker]


def test_cancel_keeps_a_readable_partial_file(model, tmp_path):
    calls = []
    z = latent(model, frames=4)
    with pytest.raises(vae.Cancelled):
        vae.decode_to_file(model, z, tmp_path / "clip.mkv", vae.Settings(temporal_chunk=1), codec="ffv1",
                           cancel=lambda: calls.append(1) or len(calls) > 2)
    assert not (tmp_path / "clip.mkv").exists()  # nothing looks complete
    kept = file_frames(tmp_path / "clip.partial.mkv")
    full = to_pixels(vae.decode(model, z), 8)
    assert 0 < len(kept) < len(full)
    np.testing.assert_array_equal(kept, full[:len(kept)])


def test_rerun_from_frame_zero_writes_every_frame_once(model, tmp_path):
    """The engine reruns a decode from frame 0 after an fp16 overflow; the sink skips what was written."""
    y = vae.decode(model, latent(model, frames=3))
    with VideoWriter(tmp_path / "r.mkv", resolve("ffv1"), y.shape[4], y.shape[3], y.shape[2]) as writer:
        sink = FileSink(writer)
        sink(0, y[:, :, :5])
        sink(0, y[:, :, :5])  # the rerun
        sink(5, y[:, :, 5:])
        path = writer.finish()
    np.testing.assert_array_equal(file_frames(path), to_pixels(y, 8))


FULL_DISK_SCRIPT = textwrap.dedent("""
    import json, resource, signal, sys
    import numpy as np
    from vae.video_codecs import resolve  # vae: found in the working directory, the repository root
    from vae.video_writer import VideoWriteError, VideoWriter
    path, codec, limit, flat = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "flat"
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    rng = np.random.default_rng(0)
    writer = VideoWriter(path, resolve(codec, crf=0, fps=24) if codec == "h264" else resolve(codec, fps=24), 128, 96, 500)
    try:
        for i in range(100):
            writer.write(np.full((5, 96, 128, 3), i, np.uint8) if flat else rng.integers(0, 256, (5, 96, 128, 3), dtype=np.uint8))
        writer.finish()
    except VideoWriteError as error:
        print(json.dumps({"queued": writer.queued, "message": str(error)}))
""")


def decodable_frames(path) -> int:
    """Frames a player gets from a file cut off mid-write: packet by packet, past the broken last one."""
    count = 0
    with av.open(str(path)) as container:
        for packet in container.demux(video=0):
            try:
                count += len(packet.decode())
            except av.FFmpegError:
                pass
    return count


@pytest.mark.parametrize("codec, limit, content", [("h264", 300_000, "noise"), ("ffv1", 40_000, "flat")])
def test_full_disk_is_found_as_it_happens_and_the_kept_frames_are_counted(codec, limit, content, tmp_path):
    """A file-size limit makes the real write() fail as a full disk does. Small frames sat in FFmpeg's
    buffers (a Matroska cluster holds 5 s): the failure came at the close, after the whole decode, and the
    message said "what reached the disk stays readable" of a file holding fewer frames than encoded. Now
    every packet goes to the disk as it is made: the run stops before its last frame, saying how many
    frames the kept file holds, and a player gets exactly those."""
    extension = "mp4" if codec == "h264" else "mkv"
    path = tmp_path / f"full.{extension}"
    result = subprocess.run([sys.executable, "-c", FULL_DISK_SCRIPT, str(path), codec, str(limit), content],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    failed = json.loads(result.stdout)
    assert failed["queued"] < 500, "found only when the file was closed"
    held = int(re.search(r"The first (\d+) of the 500 frames stay readable in ", failed["message"]).group(1))
    assert f"full.partial.{extension}" in failed["message"] and "File too large" in failed["message"], failed
    assert not path.exists() and held == decodable_frames(tmp_path / f"full.partial.{extension}") > 0


def test_audio_is_muxed_alongside(model, tmp_path):
    rate, z = 8000, latent(model, frames=3)
    wave = np.sin(np.linspace(0, 200, rate * 3, dtype=np.float32))[None].repeat(2, 0)
    path = vae.decode_to_file(model, z, tmp_path / "a.mp4", vae.Settings(temporal_chunk=1), fps=9, audio=(wave, rate))
    with av.open(str(path)) as container:
        (audio,) = container.streams.audio
        assert audio.codec_context.name == "aac" and audio.channels == 2
        seconds = sum(f.samples for f in container.decode(audio=0)) / rate
    assert abs(seconds - 1.0) < 0.2  # cut to the video: 9 frames at 9 fps (aac adds priming samples)


def test_encode_from_file_equals_encode_of_the_same_frames(model, tmp_path):
    z = latent(model, frames=4)
    path = vae.decode_to_file(model, z, tmp_path / "in.mkv", codec="ffv1", fps=30)
    frames = torch.from_numpy(file_frames(path)) / 255.0  # as an IMAGE would hold them
    video = frames.permute(3, 0, 1, 2).unsqueeze(0).contiguous() * 2 - 1
    got, clip = vae.encode_from_file(model, path, vae.Settings(temporal_chunk=2))
    torch.testing.assert_close(got, vae.encode(model, video, vae.Settings(temporal_chunk=2)), rtol=0, atol=0)
    assert (clip.frames, clip.height, clip.width, clip.fps) == (13, 32, 48, 30)
    # A frame range, every 2nd frame, resized: the chosen frames, 4n+1-padded like Encode pads.
    got, clip = vae.encode_from_file(model, path, start_frame=3, frame_count=4, every_nth=2, width=24,
                                     resize_filter="area")
    assert (clip.frames, clip.height, clip.width, clip.fps, list(clip.selection)) == (4, 16, 24, 15, [3, 5, 7, 9])
    picked = torch.nn.functional.avg_pool2d(video[0, :, [3, 5, 7, 9]], 2).unsqueeze(0)  # area = 2x2 mean here
    assert_exact(got, vae.encode(model, picked), rtol=0, atol=0.02)
    with pytest.raises(ValueError, match="past the end"):
        vae.encode_from_file(model, path, start_frame=13)
