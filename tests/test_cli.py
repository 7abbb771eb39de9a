"""`python -m vae encode/decode`: its latent files are ComfyUI's (what Save Latent writes and Load Latent
reads), so a SeedVR2 file holds core's LATENT (raw x 0.9152), and decode reads core's files back to the
raw latent. The tiny SeedVR2 fixture (the CLI's default model) on a 5-frame lossless clip. Bad input and
setups end with one `error:` line and exit status 2, before anything is replaced or decoded."""
import av
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import vae
from reference import assert_exact, load_tiny, tensors, tiny_checkpoint
from vae.__main__ import main
from vae.video_codecs import resolve
from vae.video_file import to_pixels
from vae.video_reader import VideoReader
from vae.video_writer import VideoWriter


def test_latent_files_are_comfyuis_both_ways(tmp_path):
    clip, latent, out = tmp_path / "clip.mkv", tmp_path / "latent.safetensors", tmp_path / "decoded.mkv"
    frames = np.random.default_rng(2).integers(0, 256, (5, 32, 48, 3), dtype=np.uint8)
    with VideoWriter(clip, resolve("ffv1", pixel_format="rgb", fps=12), 48, 32, 5) as writer:
        writer.write(frames)
        writer.finish()
    main(["encode", "--in", str(clip), "--out", str(latent)])
    main(["decode", str(latent), "--out", str(out)])

    model = load_tiny("seedvr2")
    with VideoReader(clip) as reader:
        z = vae.encode(model, reader.read(0, reader.frames))
    assert_exact(load_file(str(latent))["latent_tensor"], z * 0.9152, rtol=1e-5, atol=1e-5)
    with av.open(str(out)) as container:  # FFV1 rgb: the decoded frames rounded to 8 bits, nothing else
        written = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    expected = to_pixels(vae.decode(model, z, num_frames=5), 8)
    assert written.shape == expected.shape and np.abs(written.astype(int) - expected.astype(int)).max() <= 1


# -- bad input: one `error:` line, exit status 2, nothing replaced, nothing decoded with the wrong model ----------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A 5-frame lossless clip and its latent file made by the default (tiny SeedVR2) model."""
    folder = tmp_path_factory.mktemp("cli")
    clip, latent = folder / "clip.mkv", folder / "latent.safetensors"
    frames = np.random.default_rng(5).integers(0, 256, (5, 32, 48, 3), dtype=np.uint8)
    with VideoWriter(clip, resolve("ffv1", pixel_format="rgb", fps=12), 48, 32, 5) as writer:
        writer.write(frames)
        writer.finish()
    main(["encode", "--in", str(clip), "--out", str(latent)])
    return folder, clip, latent


def refused(capsys, argv) -> str:
    """The one stderr line of a command that must fail with exit status 2, without its `error: `."""
    with pytest.raises(SystemExit) as exited:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "[" not in line]  # progress bars aside
    assert exited.value.code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0].removeprefix("error: ")


@pytest.mark.parametrize("command", ["roundtrip", "encode", "decode"])
def test_no_command_replaces_a_file_without_overwrite(command, files, tmp_path, capsys):
    _, clip, latent = files
    out = tmp_path / ("out.safetensors" if command == "encode" else "out.mkv")
    out.write_bytes(b"keep me")
    argv = {"roundtrip": ["roundtrip", "--frames", "5", "--size", "16x16"], "encode": ["encode", "--in", clip],
            "decode": ["decode", latent]}[command] + ["--out", out]
    assert refused(capsys, argv) == f"{out} exists; pass --overwrite to replace it, or choose another --out"
    assert out.read_bytes() == b"keep me"
    main([str(a) for a in argv] + ["--overwrite"])
    assert out.stat().st_size > 100


def test_a_latent_is_decoded_only_by_a_model_of_its_family(files, tmp_path, capsys):
    """A SeedVR2 latent file with a Wan2.1 checkpoint (16 channels both): refused, naming both. Without
    --checkpoint the fixture of the file's family decodes it; a file that names no family (Save Latent's)
    asks for --checkpoint instead of guessing."""
    _, _, latent = files
    wan21 = tiny_checkpoint("wan21")
    message = refused(capsys, ["decode", latent, "--out", tmp_path / "a.mkv", "--checkpoint", wan21])
    assert message == f"{latent} was made by a seedvr2 VAE, but wan21 is loaded: pass --checkpoint with a seedvr2 VAE file"

    z = torch.randn(1, 16, 2, 4, 6, generator=torch.Generator().manual_seed(4))  # a Wan2.1 latent, as encode writes it
    wan_file = tmp_path / "wan.safetensors"
    save_file({"latent_tensor": z}, str(wan_file), {"family": "wan21", "streamvae_frames": "5",
                                                   "streamvae_size": "32,48", "streamvae_latent_space": "comfyui"})
    main(["decode", str(wan_file), "--out", str(tmp_path / "wan.mkv"), "--codec", "ffv1", "--pixel-format", "rgb"])
    assert "using the tiny wan21 fixture model" in capsys.readouterr().out
    with av.open(str(tmp_path / "wan.mkv")) as container:
        written = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert np.abs(written.astype(int) - to_pixels(vae.decode(load_tiny("wan21"), z), 8).astype(int)).max() <= 1

    core_file = tmp_path / "core.latent"
    save_file({"latent_tensor": z}, str(core_file))
    assert "does not say which VAE made it" in refused(capsys, ["decode", core_file, "--out", tmp_path / "c.mkv"])


def test_a_latent_of_another_spatial_factor_is_refused(tmp_path, capsys):
    """64x64 px as a 4x4 latent is 16-px cells (Wan2.2's factor); Wan2.1's are 8 px."""
    path = tmp_path / "sf16.safetensors"
    save_file({"latent_tensor": torch.zeros(1, 16, 2, 4, 4)}, str(path), {"streamvae_size": "64,64"})
    message = refused(capsys, ["decode", path, "--out", tmp_path / "x.mkv", "--checkpoint", tiny_checkpoint("wan21")])
    assert "is 64x64 px as a 4x4 latent, but this wan21 VAE's latent cells are 8 px (a 8x8 latent)" in message


@pytest.mark.parametrize("case, says", [
    ("cuda", "--device cuda:7: this torch has"),
    ("video_as_latent", "is not a latent file"),
    ("budget_zero", "--memory-budget must be more than 0 GiB, or auto (leave it out for no limit); got 0"),
    ("budget_text", "--memory-budget must be a number of GiB or auto; got 'abc'"),
    ("budget_tiny", "set --memory-budget to at least"),
    ("nonfinite", "NaN/Inf weights: decoder.conv_out.bias (1 of 3 values)"),
])
def test_bad_setups_end_with_one_error_line(case, says, files, tmp_path, capsys):
    folder, clip, latent = files
    out = tmp_path / "out.mkv"
    argv = {"cuda": ["decode", latent, "--out", out, "--device", "cuda:7"],
            "video_as_latent": ["decode", clip, "--out", out],
            "budget_zero": ["decode", latent, "--out", out, "--memory-budget", "0"],
            "budget_text": ["decode", latent, "--out", out, "--memory-budget", "abc"],
            "budget_tiny": ["decode", latent, "--out", out, "--memory-budget", "1e-12"]}.get(case)
    if case == "nonfinite":
        damaged = {k: v.clone() for k, v in tensors("seedvr2", "tiny_vae.safetensors").items()}
        damaged["decoder.conv_out.bias"][1] = float("nan")
        vae.save_checkpoint(damaged, tmp_path / "damaged.safetensors", config={"norm_num_groups": 8})
        argv = ["decode", latent, "--out", out, "--checkpoint", tmp_path / "damaged.safetensors"]
    message = refused(capsys, argv)
    assert says in message, message
    if case == "budget_tiny":
        assert "GiB, or leave it out for no limit" in message and "bytes" not in message, message
    assert not out.exists() and not list(tmp_path.glob("*.partial.*"))
    if case == "nonfinite":  # and loaded when allowed explicitly
        main([str(a) for a in argv] + ["--allow-nonfinite"])
        assert out.exists()
