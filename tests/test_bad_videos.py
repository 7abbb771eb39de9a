"""Bad input, round three, below the server: two runs writing one output, video files cut off or of a
variable frame rate, and what decode and the CLI are given (latents that are not floats or have no
values, `--out` naming a folder, `--fps nan`). Each is refused before any work with a message that says
what to do, or handled and said. The same cases through a ComfyUI server: test_bad_setups_server.py.
"""
import multiprocessing
import time
from fractions import Fraction

import av
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import vae
from reference import load_tiny
from test_cli import refused
from vae.__main__ import main
from vae.video_codecs import VideoFormatError, resolve
from vae.video_reader import VideoReader
from vae.video_writer import VideoWriteError, VideoWriter

@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A 9-frame lossless clip, and a SeedVR2 latent file (the CLI's default model) to decode."""
    folder = tmp_path_factory.mktemp("inputs")
    write_clip(folder / "clip.mkv")
    save_file({"latent_tensor": torch.randn(1, 16, 2, 4, 6, generator=torch.Generator().manual_seed(0))},
              str(folder / "latent.safetensors"), {"family": "seedvr2"})
    return folder / "clip.mkv", folder / "latent.safetensors"


def write_as_one_run(target, shade: int, mine, theirs, results) -> None:
    """One of two processes writing `target` (with overwrite), its frames of one grey `shade`: both
    have their partial file before either writes a frame, so their writes overlap."""
    writer = VideoWriter(target, resolve("ffv1", fps=24), 32, 32, 5, overwrite=True)
    mine.touch()
    deadline = time.monotonic() + 60
    while not theirs.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    writer.write(np.full((5, 32, 32, 3), shade, np.uint8))
    try:
        results.put({"shade": shade, "wrote": str(writer.finish())})
    except VideoWriteError as error:
        results.put({"shade": shade, "error": str(error), "kept": str(error.partial_path)})


def shades(path) -> list[int]:
    """The grey level of every frame of a lossless file written by TWO_WRITERS."""
    with av.open(str(path)) as container:
        return [int(np.median(f.to_ndarray(format="rgb24"))) for f in container.decode(video=0)]


def test_two_processes_writing_one_output_never_share_a_file(tmp_path):
    """Both opened `out.partial.mkv`: one said it wrote out.mkv while the file held the other's frames,
    the other failed on the rename. Now each writes its own partial file; the first to finish replaces
    the target, the other finds it changed, leaves it alone and says where its own complete video is."""
    target = tmp_path / "out.mkv"
    target.write_bytes(b"an older video, replaced on purpose (overwrite)")
    ready, fork = [tmp_path / "ready_a", tmp_path / "ready_b"], multiprocessing.get_context("fork")
    results = fork.Queue()
    runs = [fork.Process(target=write_as_one_run, args=(target, shade, ready[i], ready[1 - i], results))
            for i, shade in enumerate((60, 200))]  # forked: two real processes, without a second torch import
    for run in runs:
        run.start()
    results = [results.get(timeout=120) for _ in runs]
    for run in runs:
        run.join()
    (won,), (lost,) = [r for r in results if "wrote" in r], [r for r in results if "error" in r]
    assert won["wrote"] == str(target) and shades(target) == [won["shade"]] * 5
    assert f"{target} changed while this video was written" in lost["error"] and lost["kept"] in lost["error"]
    assert lost["kept"] != str(target) and shades(lost["kept"]) == [lost["shade"]] * 5


def test_an_existing_folder_as_the_output_is_refused_before_anything_runs(inputs, tmp_path, capsys):
    """`--out` naming a folder failed after the whole decode, on the rename."""
    clip, latent = inputs
    folder = tmp_path / "videos.mkv"
    folder.mkdir()
    for argv in (["decode", latent, "--out", folder, "--overwrite"], ["encode", "--in", clip, "--out", folder]):
        assert refused(capsys, argv).startswith(f"--out {folder} is a folder: name a file in it")
    with pytest.raises(VideoWriteError, match=r"videos.mkv is a folder; nothing was written"):
        VideoWriter(folder, resolve("ffv1"), 16, 16, 5, overwrite=True)
    assert list(folder.iterdir()) == []


def write_clip(path, frames=9, stamps_ms=None):
    """A lossless clip of `frames` distinct frames at 24 fps, or at the timestamps `stamps_ms`."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=24)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        if stamps_ms is not None:
            stream.time_base = stream.codec_context.time_base = Fraction(1, 1000)
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 20 * i, np.uint8), format="rgb24")
            if stamps_ms is not None:
                frame.pts, frame.time_base = stamps_ms[i], Fraction(1, 1000)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def test_a_cut_off_video_is_refused_naming_both_counts(tmp_path, capsys):
    """A Matroska file whose container states 9 frames, cut to the first few, encoded those few with exit
    status 0. Now it is refused naming both counts, unless --count asks only for frames that are there."""
    clip, out = tmp_path / "clip.mkv", tmp_path / "latent.safetensors"
    write_clip(clip)
    data = clip.read_bytes()
    clip.write_bytes(data[:len(data) // 2])
    with av.open(str(clip)) as container:
        readable = sum(1 for p in container.demux(video=0) if p.size)
    assert 0 < readable < 9
    message = refused(capsys, ["encode", "--in", clip, "--out", out])
    assert f"clip.mkv is cut off: its container states 9 frames, but only {readable} can be read" in message, message
    assert not out.exists()
    main(["encode", "--in", str(clip), "--out", str(out), "--count", str(readable)])
    said = capsys.readouterr().err
    assert f"warning: {clip} is cut off: its container states 9 frames, and {readable} can be read" in said, said
    assert load_file(str(out))["latent_tensor"].shape[2] == vae.latent_frames(readable)


def test_an_mp4_cut_before_its_index_says_so(tmp_path):
    """An MP4 whose index (the moov box, written last) was never written said "no video stream" or
    "Invalid data found"."""
    path = tmp_path / "clip.mp4"
    with av.open(str(path), "w") as container:  # a plain MP4: its index after the frames
        stream = container.add_stream("libx264", rate=24)
        stream.width = stream.height = 32
        for i in range(9):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.full((32, 32, 3), 20 * i, np.uint8), format="rgb24")))
        container.mux(stream.encode(None))
    data = path.read_bytes()
    moov = data.index(b"moov") - 4
    for cut in (moov, moov + 40):  # before the index, and inside it
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"clip.mp4 is an MP4 cut off before its index \(the moov box"):
            VideoReader(path)


def test_a_variable_frame_rate_is_encoded_at_its_average_and_said(tmp_path, capsys):
    """Frames 33 to 334 ms apart (9 frames over 0.8 s: 10 fps on average) were encoded as the 24 fps the
    stream header claims."""
    clip, out = tmp_path / "vfr.mkv", tmp_path / "latent.safetensors"
    write_clip(clip, stamps_ms=[0, 33, 66, 150, 200, 400, 433, 466, 800])
    with VideoReader(clip) as reader:
        assert reader.fps == 10 and reader.frames == 9
        assert reader.notes == [f"{clip} has a variable frame rate (frames 33 to 334 ms apart): encoded at its "
                                "average, 10 fps"]
    write_clip(tmp_path / "even.mkv")
    with VideoReader(tmp_path / "even.mkv") as reader:
        assert reader.fps == 24 and reader.notes == []  # a constant rate: as stated, nothing said
    main(["encode", "--in", str(clip), "--out", str(out)])
    assert f"warning: {clip} has a variable frame rate" in capsys.readouterr().err
    with safe_open(str(out), "pt") as file:
        assert Fraction(file.metadata()["fps"]) == 10


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_a_latent_file_of_integers_is_refused(dtype, tmp_path, capsys):
    """The CLI decoded int32 and bool latents into a video."""
    path = tmp_path / "ints.safetensors"
    save_file({"latent_tensor": torch.ones(1, 16, 2, 4, 6, dtype=dtype)}, str(path), {"family": "seedvr2"})
    message = refused(capsys, ["decode", path, "--out", tmp_path / "x.mkv"])
    assert f"holds {str(dtype).removeprefix('torch.')} values, but a latent is floating-point numbers" in message


def test_decode_refuses_latents_without_float_values():
    """vae.decode decoded a complex latent, and a meta-device latent gave a raw NotImplementedError."""
    model = load_tiny("wan21")
    with pytest.raises(ValueError, match=r"decode takes a latent of floating-point numbers, got complex64 values"):
        vae.decode(model, torch.zeros(1, 16, 2, 3, 3, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"the latent is on the meta device \(a shape without values\), the model on cpu"):
        vae.decode(model, torch.zeros(1, 16, 2, 3, 3, device="meta"))


def test_an_empty_latent_or_a_rate_that_is_no_number_says_so(inputs, tmp_path, capsys):
    """A 0x0 latent said "yuv420 needs an even width"; `--fps nan` "Invalid literal for Fraction"."""
    _, latent = inputs
    empty = tmp_path / "empty.safetensors"
    save_file({"latent_tensor": torch.zeros(1, 16, 2, 0, 0)}, str(empty), {"family": "seedvr2"})
    assert "decode got an empty latent of shape (1, 16, 2, 0, 0)" in refused(capsys, ["decode", empty, "--out",
                                                                                      tmp_path / "e.mp4"])
    for fps in ("nan", "inf", "0", "-5"):
        assert refused(capsys, ["decode", latent, "--out", tmp_path / "f.mkv", "--fps", fps]).startswith(
            "--fps must be a number of frames per second above 0, at most 1000; got")
    with pytest.raises(VideoFormatError, match=r"fps must be between 0 and 1000 frames per second; got nan"):
        vae.decode_to_file(load_tiny("wan21"), torch.zeros(1, 16, 2, 2, 2), tmp_path / "g.mkv", codec="ffv1",
                           fps=float("nan"))
    assert not list(tmp_path.glob("*.mkv")) and not list(tmp_path.glob("*.mp4"))
