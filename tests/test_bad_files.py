"""Bad files, below the server: checkpoints with NaN/Inf weights or one damaged shape, a SeedVR2 file
whose group count its shapes cannot tell, and video outputs that would replace a file or could never
be written. Each is refused before any work, with a message naming what is wrong and only files that
exist. The same cases through the CLI are in test_cli.py, through a ComfyUI server in
test_bad_inputs_server.py.
"""
import os
import re
import time

import pytest
import torch

import vae
from vae import families
from reference import REPO, load_tiny, tensors
from test_bad_inputs import node_module
from vae.video_codecs import resolve
from vae.video_writer import VideoWriteError, VideoWriter


def state(family: str) -> dict:
    return dict(tensors(family, "tiny_vae.safetensors"))


# -- weights ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key, value, stored", [
    ("decoder.head.2.weight", float("nan"), torch.float32),  # one NaN: a colour channel at 0 in every frame
    ("encoder.conv1.weight", float("inf"), torch.float32),  # one Inf: an all-NaN latent
    ("decoder.head.2.bias", float("nan"), torch.float8_e4m3fn),  # fp8 files: torch has no isfinite for them
], ids=["decoder_nan", "encoder_inf", "fp8_nan"])
def test_nonfinite_weight_is_refused_naming_it(key, value, stored):
    damaged = {k: v.to(stored) for k, v in state("wan21").items()}
    weight = damaged[key].float().clone()  # the fixture tensors are shared: never written
    weight.view(-1)[-1] = value
    damaged[key] = weight.to(stored)
    with pytest.raises(vae.CheckpointError, match=rf"NaN/Inf weights: {key} \(1 of {weight.numel()} values\)"):
        vae.load(damaged)
    # allowed explicitly, it loads, and shows why it is refused by default: its output is not finite
    model = vae.load(damaged, allow_nonfinite=True)
    video = torch.rand(1, 3, 5, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    if key.startswith("encoder"):
        assert not torch.isfinite(vae.encode(model, video)).all()
    else:
        assert not torch.isfinite(vae.decode(model, vae.encode(load_tiny("wan21"), video))).all()


@pytest.mark.parametrize("family, key, dim", [
    ("wan21", "decoder.conv1.weight", 1),  # the latent channels are read from it: 6 other tensors then mismatch
    ("wan22", "decoder.conv1.weight", 1),
    ("seedvr2", "decoder.conv_in.weight", 1),  # the latent channels: the encoder's output then mismatches
    ("seedvr2", "decoder.up_blocks.0.upsamplers.0.upscale_conv.weight", 0),  # the temporal upsampler count
], ids=["wan21_z_dim", "wan22_z_dim", "seedvr2_z_dim", "seedvr2_temporal"])
def test_one_damaged_shape_is_named_alone(family, key, dim):
    """A tensor the config is read from, one size off: the message names it, not the tensors the
    wrong config then expects otherwise."""
    damaged = state(family)
    shape = list(damaged[key].shape)
    shape[dim] += 1
    damaged[key] = torch.zeros(shape)
    with pytest.raises(vae.CheckpointError) as refused:
        vae.load(damaged, config=families.spec(family).tiny.fixture_config)
    message = str(refused.value)
    named = [k for k in damaged if re.search(rf"(?<![\w.]){re.escape(k)} \(", message)]
    assert named == [key], message
    assert f"imply {tuple(state(family)[key].shape)}" in message and "download it again" in message


def test_group_count_message_gives_a_fix_that_works_without_python_arguments(tmp_path, monkeypatch):
    """The released SeedVR2 group count (32) does not divide the tiny model's channels. The fix the
    message gives, a copy of the file that says its count, is what ComfyUI and the CLI can use (no node
    input takes a config); done as written, the copy loads."""
    path = tmp_path / "tiny.safetensors"
    vae.save_checkpoint(state("seedvr2"), path)
    with pytest.raises(vae.CheckpointError) as refused:
        vae.load(path)
    message = str(refused.value)
    assert "not divisible by 32 GroupNorm groups" in message and "[16, 32, 64, 64]" in message, message
    recipe = message[message.index("vae.save_checkpoint("):message.index(") with N") + 1].replace("N}", "8}")
    monkeypatch.chdir(tmp_path)
    eval(recipe, {"vae": vae, "path": str(path)})  # the message's own words, N = 8
    assert vae.load(tmp_path / "fixed.safetensors").config.norm_num_groups == 8


def test_a_loaded_model_keeps_its_weights_when_the_file_is_written_over(tmp_path):
    """The weights were views of the file mapped into memory: the same bytes written over it in place
    (same size, every weight negated) changed the loaded model's output without a word, and a shorter
    file (the server test) crashed the process with SIGBUS."""
    path = tmp_path / "wan21.safetensors"
    original = state("wan21")
    vae.save_checkpoint(original, path)
    model = vae.load(path)
    z = torch.randn(1, 16, 2, 3, 3, generator=torch.Generator().manual_seed(0))
    before = vae.decode(model, z)
    with open(path, "r+b") as file:  # in place: the same inode and size, other numbers
        file.write(_safetensors_bytes({k: -v for k, v in original.items()}))
    assert path.stat().st_size == len(_safetensors_bytes(original))
    assert torch.equal(vae.decode(model, z), before)
    assert not torch.equal(vae.decode(vae.load(path), z), before)  # the file did change


def test_a_file_renamed_over_with_the_same_size_and_time_is_another_file(tmp_path):
    """Load VAE's fingerprint and the look-up cache (`checkpoints.file_identity`) were size and time: a
    copy that kept them (cp -p, rsync -t), renamed over the file, was taken for the file loaded before."""
    checkpoints = node_module("checkpoints")
    path, new = tmp_path / "vae.safetensors", tmp_path / "vae.safetensors.new"
    path.write_bytes(_safetensors_bytes(state("wan21")))
    new.write_bytes(_safetensors_bytes({k: -v for k, v in state("wan21").items()}))
    os.utime(new, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    before = checkpoints.file_identity(str(path))
    os.replace(new, path)
    assert (path.stat().st_size, path.stat().st_mtime_ns) == before[1:3]
    assert checkpoints.file_identity(str(path)) != before


def _safetensors_bytes(tensors: dict) -> bytes:
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in tensors.items()})


@pytest.mark.parametrize("stored", [torch.int8, torch.uint8, torch.int32])
def test_integer_weights_are_refused_naming_them(stored, tmp_path):
    """An int8-quantized file loaded its integers as weights and decoded wrong frames (max difference 84)."""
    quantized = state("wan21")
    quantized["decoder.head.2.weight"] = (quantized["decoder.head.2.weight"] * 100).round().to(stored)
    path = tmp_path / "int8.safetensors"
    vae.save_checkpoint(quantized, path)
    for read in (lambda: vae.load(path), lambda: vae.loading.build_empty(*vae.loading.read_shapes(path))):
        with pytest.raises(vae.CheckpointError, match=rf"stores weights as integers: decoder\.head\.2\.weight "
                                                      rf"\({str(stored).removeprefix('torch.')}\)\. It is quantized"):
            read()


@pytest.mark.parametrize("metadata, says", [
    ("[1, 2, 3]", "must be an object of config fields"), ("5", "must be an object"), ("null", "must be an object"),
    ('{"groups": 8}', "'groups' is not a seedvr2 config field (those are block_out_channels,"),
    ('{"norm_num_groups": 0}', "norm_num_groups must be a whole number >= 1, got 0"),
    ('{"norm_num_groups": "8"}', 'norm_num_groups must be a whole number >= 1, got "8"'),
    ('{"norm_num_groups": -8}', "got -8"), ('{"norm_num_groups": 8.0}', "got 8.0"),
    ('{"norm_num_groups": true}', "norm_num_groups must be a whole number >= 1, got true"),
    ('{"block_out_channels": [16, "32"]}', "block_out_channels must be a list, each a whole number >= 1"),
], ids=["list", "number", "null", "unknown", "zero", "text", "negative", "float", "true", "list_item"])
def test_config_metadata_of_the_wrong_type_names_the_field(metadata, says, tmp_path):
    """These gave AttributeError, TypeError or ZeroDivisionError tracebacks, and `true` a one-group model."""
    from safetensors.torch import save_file

    path = tmp_path / "seedvr2.safetensors"
    save_file(state("seedvr2"), str(path), metadata={vae.loading.CONFIG_METADATA_KEY: metadata})
    with pytest.raises(vae.CheckpointError) as refused:
        vae.load(path)
    assert str(refused.value).startswith("the checkpoint's streamvae_config metadata") and says in str(refused.value)
    with pytest.raises(vae.CheckpointError, match="vae.load's config: norm_num_groups must be a whole number"):
        vae.load(state("seedvr2"), config={"norm_num_groups": True})


def test_a_folder_or_random_bytes_are_named_as_what_they_are(tmp_path):
    """A folder named like a model was "not found"; random bytes named .pth "held Python objects"."""
    folder = tmp_path / "wan_2.1_vae.safetensors"
    folder.mkdir()
    with pytest.raises(vae.CheckpointError, match=r"wan_2.1_vae.safetensors is a folder, not a checkpoint file"):
        vae.load(folder)
    noise = tmp_path / "noise.pth"
    noise.write_bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
                      .numpy().tobytes())
    with pytest.raises(vae.CheckpointError, match=r"noise.pth is not a PyTorch checkpoint \(its bytes are neither"):
        vae.load(noise)


# -- video outputs ----------------------------------------------------------------------------------


def frames(n=5, h=16, w=16) -> torch.Tensor:
    return torch.zeros(n, h, w, 3, dtype=torch.uint8).numpy()


def test_an_existing_video_is_replaced_only_when_asked(tmp_path):
    model = load_tiny("wan21")
    z = torch.zeros(1, 16, 2, 2, 2)
    target = tmp_path / "clip.mkv"
    target.write_bytes(b"the user's own video")
    decoded = []
    with pytest.raises(VideoWriteError, match=r"clip.mkv exists; nothing was written.*overwrite"):
        vae.decode_to_file(model, z, target, codec="ffv1", progress=lambda done, total: decoded.append(done))
    assert target.read_bytes() == b"the user's own video" and not decoded  # refused before the decode
    (tmp_path / "clip.partial.mkv").write_bytes(b"what a failed run kept")  # or another run is writing
    target.unlink()
    assert vae.decode_to_file(model, z, target, codec="ffv1") == target  # its own partial file: the next name
    path = vae.decode_to_file(model, z, target, codec="ffv1", overwrite=True)
    assert path == target and target.stat().st_size > 100 and not (tmp_path / "clip.partial-2.mkv").exists()
    assert (tmp_path / "clip.partial.mkv").read_bytes() == b"what a failed run kept"


@pytest.mark.parametrize("where", ["proc", "long_name", "nul_byte"])
def test_an_impossible_output_path_fails_before_decoding(where, tmp_path):
    """FFmpeg opens the file when its first packet is written: without the check, these failed after the
    decode of the first chunks, naming a partial file that did not exist."""
    path = {"proc": "/proc/streamvae_cannot_be_here/clip.mkv", "long_name": tmp_path / ("v" * 300 + ".mkv"),
            "nul_byte": str(tmp_path / "clip\0.mkv")}[where]
    decoded = []
    with pytest.raises(VideoWriteError, match="nothing was written") as refused:
        vae.decode_to_file(load_tiny("wan21"), torch.zeros(1, 16, 2, 2, 2), path, codec="ffv1",
                           progress=lambda done, total: decoded.append(done))
    assert not decoded, "it decoded before finding out"
    if where == "long_name":
        assert "too long for this file system" in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_a_predicted_size_above_the_free_space_is_refused(tmp_path):
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    frames_needed = int(free / (1920 * 1080 * 0.1 / 8)) + 1  # ProRes never spends less than 0.1 bit per pixel
    started = time.perf_counter()
    with pytest.raises(VideoWriteError, match=r"need at least .* GiB, but .* GiB free"):
        VideoWriter(tmp_path / "long.mov", resolve("prores", fps=24), 1920, 1080, frames_needed)
    assert time.perf_counter() - started < 5 and list(tmp_path.iterdir()) == []
    VideoWriter(tmp_path / "short.mov", resolve("prores", fps=24), 1920, 1080, 2).abort("not needed")


def test_a_failure_names_only_files_that_exist(tmp_path):
    """Frames reached the encoder, but FFmpeg never got to write its file (it opens it at the first
    packet, and x264 holds the first frames back): the message must not point at a file that is not there."""
    folder = tmp_path / "out"
    writer = VideoWriter(folder / "clip.mp4", resolve("h264"), 16, 16, 10)
    writer.write(frames())
    while writer.encoded < 5:
        time.sleep(0.01)
    writer.partial.unlink()
    folder.rmdir()  # the folder went away meanwhile (a removed drive, a cleanup): the file cannot be made
    error = writer.abort("stopped")
    assert "Nothing was written" in str(error) and "partial" not in str(error) and error.partial_path is None
    assert list(tmp_path.iterdir()) == []


def test_a_video_with_no_frames_says_so(tmp_path):
    """A container that ends after its header (FFmpeg: "End of file")."""
    import av

    from vae.video_reader import VideoReader

    path = tmp_path / "empty.mkv"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=24)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "bgr0"
        container.start_encoding()
    with pytest.raises(ValueError, match=r"empty.mkv has no frames \(the file ends after its header\)"):
        VideoReader(path)


def test_troubleshooting_lists_every_bad_input_with_a_test_that_exists():
    """docs/troubleshooting.md's table: at least 60 kinds of bad input, each naming a test of this suite."""
    table = (REPO / "docs" / "troubleshooting.md").read_text().split("## Every bad input")[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| Bad input")]
    assert len(rows) >= 60, len(rows)
    for row in rows:
        tests = re.findall(r"`(test_\w+\.py)::(test_\w+)", row)
        assert tests, row
        for module, name in tests:
            assert re.search(rf"^def {name}\(", (REPO / "tests" / module).read_text(), re.M), (module, name)
