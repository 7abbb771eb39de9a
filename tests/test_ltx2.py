"""The LTX-2 VAE family (`vae/model/ltx2/`): against diffusers' `AutoencoderKLLTX2Video` at small widths
(seeded random weights saved in diffusers' names; reflect and zero padding; a timestep-conditioned
decoder), encode and decode within 1e-4 x max(1, |ref|); both key layouts and the full LTX-2
checkpoint load the same model, reading only the VAE's tensors; every temporal chunking, frames
streamed and exact tiles equal the whole clip within 1e-5 x max(1, |ref|), conditioned decoders with
their seeded noise too; what is not supported is refused by name. (Against core 0.33.0:
test_ltx2_core.py; at the released widths: test_ltx2_released.py.)"""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vae
from vae.loading import CheckpointError, save_checkpoint
from ltx2_fixtures import close, model, random_weights, save_full_checkpoint

diffusers = pytest.importorskip("diffusers")

SMALL = dict(latent_channels=16, block_out_channels=(16, 32, 64, 64), layers_per_block=(1, 1, 1, 1, 1),
             decoder_block_out_channels=(16, 32, 64), decoder_layers_per_block=(1, 2, 1, 1), decoder_causal=False)
# id -> diffusers constructor kwargs beyond SMALL
DIFFUSERS = {
    "reflect": {},
    "zeros": dict(decoder_spatial_padding_mode="zeros"),
    "conditioned": dict(timestep_conditioning=True),
}


@pytest.fixture(scope="module", params=list(DIFFUSERS))
def pair(request, tmp_path_factory):
    """(id, diffusers model, ours loaded from its safetensors file in diffusers' names)."""
    reference = random_weights(diffusers.AutoencoderKLLTX2Video(**SMALL, **DIFFUSERS[request.param]), seed=len(request.param))
    path = tmp_path_factory.mktemp("ltx2") / f"{request.param}.safetensors"
    save_checkpoint(reference.state_dict(), path)
    config = {"decoder_padding": "zeros"} if request.param == "zeros" else {}
    if request.param == "conditioned":
        config["decode_noise_scale"] = 0.0  # diffusers' VAE adds none (its pipeline does)
    return request.param, reference, vae.load(path, config=config)


def _video(frames: int, height=64, width=96, seed=3) -> torch.Tensor:
    return torch.rand(1, 3, frames, height, width, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _latent(m, frames: int, h=2, w=3, seed=4) -> torch.Tensor:
    return torch.randn(1, m.latent_channels, frames, h, w, generator=torch.Generator().manual_seed(seed))


def test_sizes_are_read_from_the_weights(pair):
    name, reference, ours = pair
    cfg = ours.config
    assert (ours.family, ours.spatial_factor, ours.temporal_factor, ours.latent_channels) == ("ltx2", 32, 8, 16)
    assert (cfg.encoder_channels, cfg.decoder_channels, cfg.patch_size) == (16, 64, 4)
    assert [b.name for b in cfg.encoder_blocks] == ["res_x", "compress_space_res", "res_x", "compress_time_res", "res_x",
                                                    "compress_all_res", "res_x", "compress_all_res", "res_x"]
    assert [(b.name, b.num_layers, b.residual) for b in cfg.decoder_blocks] == [  # diffusers lists the depths reversed
        ("res_x", 1, False), ("compress_all", 1, True), ("res_x", 1, False), ("compress_all", 1, True),
        ("res_x", 2, False), ("compress_all", 1, True), ("res_x", 1, False)]
    assert cfg.timestep_conditioning == (name == "conditioned")


def test_encode_matches_diffusers(pair):
    _, reference, ours = pair
    video = _video(9)
    with torch.no_grad():
        expected = reference.encode(video).latent_dist.mode()
    close(vae.encode(ours, video), expected, 1e-4)


def test_decode_matches_diffusers(pair):
    name, reference, ours = pair
    z = _latent(ours, 3)
    temb = torch.tensor([ours.config.decode_timestep]) if name == "conditioned" else None
    with torch.no_grad():
        expected = reference.decode(z, temb).sample
    close(vae.decode(ours, z), expected, 1e-4)


def test_both_key_layouts_and_the_full_checkpoint_load_the_same_model(pair, tmp_path):
    """Core's names inside a full LTX-2 checkpoint (metadata config beside it) and diffusers' names."""
    name, _, ours = pair
    again = vae.load(save_full_checkpoint(ours, tmp_path / "full.safetensors"))
    assert again.config == ours.config
    theirs = ours.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in again.state_dict().items())


@pytest.mark.parametrize("settings", [
    vae.Settings(temporal_chunk=1), vae.Settings(temporal_chunk=2), vae.Settings(temporal_chunk=1, stream_frames=True),
    vae.Settings(tile_size=(64, 64)), vae.Settings(tile_size=(64, 64), temporal_chunk=1, stream_frames=True),
    vae.Settings(tile_size=(64, 64), temporal_chunk=2, cache_offload="disk")],
    ids=["chunk1", "chunk2", "streamed", "tiles", "tiles-streamed", "tiles-chunk2-disk"])
def test_decode_equals_the_whole_clip(pair, settings):
    """Every chunking, frames streamed and exact tiles (2x2 tiles: each meets two frame borders, reflect
    or zero padding there, and two tile borders) against the decoder run on the whole clip at once."""
    _, _, ours = pair
    z = _latent(ours, 4, h=3, w=4)
    whole = vae.decode(ours, z, vae.Settings(temporal_chunk=4))
    close(vae.decode(ours, z, settings), whole, 1e-5)


@pytest.mark.parametrize("settings", [vae.Settings(temporal_chunk=1), vae.Settings(tile_size=64),
                                      vae.Settings(temporal_chunk=1, stream_frames=True, tile_size=64)],
                         ids=["chunk1", "tiles", "tiles-streamed"])
def test_encode_equals_the_whole_clip(pair, settings):
    _, _, ours = pair
    video = _video(17, 96, 128)
    close(vae.encode(ours, video, settings), vae.encode(ours, video, vae.Settings(temporal_chunk=3)), 1e-5)


def test_any_frame_count_encodes_and_decodes_back():
    """13 frames (not 8n+1) encode as 17 (the last repeated) and decode back to 13; core drops frames 9-12."""
    ours = model("ltx2")
    video = _video(13)
    z = vae.encode(ours, video)
    assert z.shape[2] == 3
    padded = torch.cat([video, video[:, :, -1:].expand(-1, -1, 4, -1, -1)], dim=2)
    close(z, vae.encode(ours, padded), 1e-6)
    assert vae.decode(ours, z, num_frames=13).shape == (1, 3, 13, 64, 96)


def test_conditioned_noise_is_seeded_and_the_same_however_the_clip_runs():
    """0.9.1: the latent's noise and the noise maps come from the seed: a decode is reproducible, any
    chunking or tiling gives the same frames, and another seed gives other frames."""
    ours = model("v091")
    z = _latent(ours, 3)
    whole = vae.decode(ours, z)
    close(vae.decode(ours, z), whole, 0)
    for settings in (vae.Settings(temporal_chunk=1), vae.Settings(tile_size=64, stream_frames=True, temporal_chunk=1)):
        close(vae.decode(ours, z, settings), whole, 1e-5)
    other = vae.load(dict(ours.state_dict()), config={**dataclasses.asdict(ours.config), "noise_seed": 1})
    assert (vae.decode(other, z) - whole).abs().max() > 1e-3


def test_the_audio_vae_is_refused_by_name(tmp_path):
    """LTX-2's audio VAE names the core loader that takes it (its diffusion-decoder VAE is the `ltx25` family)."""
    with pytest.raises(CheckpointError, match="audio VAE.*LTXVAudioVAELoader"):
        vae.load({"audio_vae.decoder.conv_in.conv.weight": torch.zeros(4, 8, 3, 3), "vocoder.conv_pre.weight": torch.zeros(4, 8, 7)})


def test_a_metadata_config_that_disagrees_with_the_weights_is_refused(tmp_path):
    ours = model("ltx2")
    path = tmp_path / "bad.safetensors"
    save_full_checkpoint(ours, path)
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), "pt") as f:
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    config = json.loads(metadata["config"])
    config["vae"]["encoder_blocks"][1][0] = "compress_time_res"  # the weights hold a 4x space-to-depth there
    save_file(tensors, str(path), metadata={"config": json.dumps(config)})
    with pytest.raises(CheckpointError, match="compress_time_res.*compress_space_res"):
        vae.load(path)
    config["vae"]["norm_layer"] = "group_norm"
    save_file(tensors, str(path), metadata={"config": json.dumps(config)})
    with pytest.raises(CheckpointError, match="norm_layer='group_norm'"):
        vae.load(path)


LAZY = """
import resource, sys, vae
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
m = vae.load(sys.argv[1])
print(m.family, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_the_vae_is_read_out_of_a_full_checkpoint_alone(tmp_path):
    """256 MiB of a diffusion model beside the VAE in the file: only the VAE's tensors are read (the
    file's header says where they are), and loading grows the peak resident memory by far less."""
    path = save_full_checkpoint(model("ltx2"), tmp_path / "ltx-2.safetensors", extra_bytes=1 << 28)
    tensors, metadata = vae.read_checkpoint(path)
    assert tensors and all(k.startswith("vae.") for k in tensors) and "config" in metadata
    assert set(vae.loading.read_shapes(path)[0]) == set(tensors)
    env = {**os.environ, "PYTHONPATH": str(Path(vae.__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", LAZY, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path), env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    family, grown = done.stdout.split()
    assert family == "ltx2" and int(grown) < (1 << 28) // 4, grown


def test_row_bands_refuse_the_decoder_that_looks_ahead(tmp_path):
    """Row bands pad zeros at a band's ends and know no clip end: the LTX decoder is refused up front."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ours = model("ltx2")
        with pytest.raises(ValueError, match="row bands cannot run this ltx2 decode"):
            vae.decode(ours, _latent(ours, 2), bands=vae.RowBands())
    finally:
        dist.destroy_process_group()
