"""HunyuanVideo 1.5 (`hv15`) against diffusers' `AutoencoderKLHunyuanVideo15` (the masked attention the
model was trained with) and ComfyUI core's `vae_refiner` (unmasked), with seeded random weights saved
through real safetensors files in both key layouts (diffusers', and the released / core names).

Encode and decode match diffusers within 1e-4 x max(1, |ref|) at reduced and at the released widths
(that chunks, frames streamed and exact tiles equal the whole clip, and the load choices: the contract of
test_families.py); the chunked frame-causal attention equals the dense masked attention within 1e-6 on a
long clip; two processes with row bands give the one-process result; `attention="full"` reproduces
core's encode and decode, which differ visibly from the masked model's; sizes that fit no rule are
refused by name."""
import io
import queue
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import vae
from bench.models import meta_model
from vae.run import memory, planning
from vae.run.run_context import RunContext
from vae.run.causal_cache import CausalCache
from vae.model.hv15.network import HV15_SCALING_FACTOR, Hv15Attention
from vae.loading import CheckpointError, save_checkpoint
from vae.kernels import Optimizations
from reference import random_weights

diffusers = pytest.importorskip("diffusers")

# Reduced widths with the released structure (5 stages, 16x / 4x, 2 residual blocks per stage).
TINY = dict(latent_channels=4, block_out_channels=(8, 16, 16, 32, 32), layers_per_block=2)
LAYOUTS = ("diffusers", "released")


def bound(reference: torch.Tensor, scale: float) -> float:
    """scale x max(1, |ref|): exactness relative to the output's magnitude."""
    return scale * max(1.0, reference.abs().max().item())


@pytest.fixture(scope="module")
def reference():
    return random_weights(diffusers.AutoencoderKLHunyuanVideo15(**TINY), seed=15)


@pytest.fixture(scope="module")
def models(reference, tmp_path_factory):
    """layout -> our model loaded from a safetensors file in that layout's key names."""
    folder = tmp_path_factory.mktemp("hv15")
    save_checkpoint(reference.state_dict(), folder / "diffusers.safetensors")
    released = vae.load(folder / "diffusers.safetensors")
    save_checkpoint(released.state_dict(), folder / "released.safetensors")
    return {layout: vae.load(folder / f"{layout}.safetensors") for layout in LAYOUTS}


def _video(frames: int = 9, seed: int = 3) -> torch.Tensor:
    return torch.rand(1, 3, frames, 48, 64, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _latent(channels: int = 4, frames: int = 4, seed: int = 4) -> torch.Tensor:
    return torch.randn(1, channels, frames, 3, 4, generator=torch.Generator().manual_seed(seed))


def test_sizes_are_read_from_the_shapes(reference, models):
    for layout in LAYOUTS:
        cfg = models[layout].config
        assert models[layout].family == "hv15" and cfg == models["released"].config
        assert (cfg.block_out_channels, cfg.layers_per_block, cfg.latent_channels) == \
            (TINY["block_out_channels"], TINY["layers_per_block"], TINY["latent_channels"])
        assert (cfg.spatial_compression, cfg.temporal_compression, cfg.attention) == (16, 4, "causal")
    released = models["released"].state_dict()
    assert set(released) == set(models["diffusers"].state_dict())
    assert "decoder.up.0.upsample.conv.conv.weight" in released and "encoder.mid.attn_1.q.weight" in released
    for key, value in models["diffusers"].state_dict().items():
        assert torch.equal(value, released[key]), key


@pytest.mark.parametrize("layout", LAYOUTS)
def test_encode_matches_diffusers(reference, models, layout):
    video = _video()
    with torch.no_grad():
        expected = reference.encode(video).latent_dist.mode()
    got = vae.encode(models[layout], video)
    torch.testing.assert_close(got, expected, rtol=0, atol=bound(expected, 1e-4))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_matches_diffusers(reference, models, layout):
    z = _latent()
    with torch.no_grad():
        expected = reference.decode(z).sample
    got = vae.decode(models[layout], z)
    assert got.shape == expected.shape == (1, 3, 13, 48, 64)
    torch.testing.assert_close(got, expected, rtol=0, atol=bound(expected, 1e-4))


@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_released_widths_match_diffusers():
    """The released widths (128..1024 channels; one residual block per stage instead of two: 1.0 instead
    of 1.26 billion weights, so the test takes seconds), shared by both models without a copy: both key
    layouts load it, encode and decode match diffusers."""
    with torch.device("meta"):
        meta = diffusers.AutoencoderKLHunyuanVideo15(layers_per_block=1)
    reference = random_weights(meta.to_empty(device="cpu"), seed=16)
    ours = vae.load(reference.state_dict())
    assert ours.config == vae.Hv15Config(layers_per_block=1)
    assert vae.load(dict(ours.state_dict())).config == ours.config
    opts = Optimizations(kernel_choice="defaults")  # no timing of the many large layer shapes
    g = torch.Generator().manual_seed(5)
    z, video = torch.randn(1, 32, 2, 2, 2, generator=g), torch.rand(1, 3, 5, 32, 32, generator=g) * 2 - 1
    with torch.no_grad():
        decoded, encoded = reference.decode(z).sample, reference.encode(video).latent_dist.mode()
    whole = vae.Settings(temporal_chunk=2)  # one pass over the weights
    torch.testing.assert_close(vae.decode(ours, z, whole, opts=opts), decoded, rtol=0, atol=bound(decoded, 1e-4))
    torch.testing.assert_close(vae.encode(ours, video, whole, opts=opts), encoded, rtol=0, atol=bound(encoded, 1e-4))


def test_chunked_attention_equals_the_dense_masked_attention_on_a_long_clip():
    """diffusers' attention block (its dense frame-causal mask) on 40 frames at once, against ours with the
    same weights chunk by chunk (1, 3 and 7 frames, the keys and values kept on the device or on disk)."""
    channels, frames = 16, 40
    dense = random_weights(diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15.HunyuanVideo15AttnBlock(channels), 7)
    ours = Hv15Attention(channels, full=False)
    ours.load_state_dict({k.replace("to_", ""): v for k, v in dense.state_dict().items()})
    x = torch.randn(1, channels, frames, 3, 5, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        expected = dense(x)
    for chunk, offload in ((1, "none"), (3, "disk"), (7, "none")):
        ctx = RunContext(Optimizations(), cache=CausalCache(offload))
        with torch.no_grad():
            got = torch.cat([ours(x[:, :, i:i + chunk], ctx) for i in range(0, frames, chunk)], dim=2)
        ctx.cache.close()
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6, msg=f"chunks of {chunk}, keys on {offload}")


def _bands_main(rank: int, store: str, path: str, results) -> None:
    """Decode and encode on this rank of a 2-process gloo world, uneven bands; rank 0 queues the result."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    model = vae.load(path)
    decoded = vae.decode(model, _latent(frames=3), vae.Settings(temporal_chunk=2), bands=vae.RowBands(rows=[2, 1]))
    encoded = vae.encode(model, _video(frames=9), vae.Settings(temporal_chunk=1), bands=vae.RowBands(rows=[1, 2]))
    if rank == 0:  # as bytes: a queued tensor would travel as a file descriptor this process must outlive
        payload = io.BytesIO()
        torch.save((decoded, encoded), payload)
        results.put(payload.getvalue())
    dist.destroy_process_group()


def test_row_bands_equal_one_process(models, tmp_path):
    """Two processes, each a band of rows of every layer (halo rows exchanged, the replicate padding at the
    frame's edge, the attention's keys of the whole frame on each rank): the one-process result."""
    path = tmp_path / "hv15.safetensors"
    save_checkpoint(models["released"].state_dict(), path)
    results = mp.get_context("spawn").Queue()
    ranks = mp.start_processes(_bands_main, args=(str(tmp_path / "store"), str(path), results), nprocs=2, join=False,
                               start_method="spawn")
    try:
        deadline = time.monotonic() + 300
        while True:  # a rank that failed ends the wait at once (join raises with its traceback)
            try:
                decoded, encoded = torch.load(io.BytesIO(results.get(timeout=1)), weights_only=True)
                break
            except queue.Empty:
                ranks.join(0)
                assert time.monotonic() < deadline, "the ranks gave no result in 300 s"
        ranks.join(60)
    finally:
        for process in ranks.processes:
            process.kill()
    want_z, want_x = vae.decode(models["released"], _latent(frames=3)), vae.encode(models["released"], _video(frames=9))
    torch.testing.assert_close(decoded, want_z, rtol=0, atol=bound(want_z, 1e-5))
    torch.testing.assert_close(encoded, want_x, rtol=0, atol=bound(want_x, 1e-5))


@pytest.fixture(scope="module")
def core(models):
    """ComfyUI core's own HunyuanVideo 1.5 encoder and decoder with our weights (the tree the tests run)."""
    from bench.core_vae import TREES, core_model

    if not (TREES["0.3.75"].path / "comfy").is_dir():
        pytest.skip(f"no ComfyUI checkout at {TREES['0.3.75'].path} (run .ci/setup)")
    model = models["released"]
    return core_model("0.3.75", "hv15", model.config, model.state_dict(), torch.float32)


def test_full_attention_reproduces_core(models, core):
    """`attention="full"`: core's unmasked decode and encode, whole and chunked; the masked model's
    output differs from core's by more than 1/255 of the image range (core's is not the trained math)."""
    masked = models["released"]
    full = vae.load(masked.state_dict(), config={"attention": "full"})
    z, video = _latent(frames=5), _video(frames=17)
    with torch.no_grad():
        decoded, encoded = core.decode(z), core.encode(video)
    for settings in (vae.Settings(temporal_chunk=5), vae.Settings(temporal_chunk=2),
                     vae.Settings(stream_frames=True, tile_size=32, cache_offload="disk")):
        torch.testing.assert_close(vae.decode(full, z, settings), decoded, rtol=0, atol=bound(decoded, 1e-4))
        torch.testing.assert_close(vae.encode(full, video, settings), encoded, rtol=0, atol=bound(encoded, 1e-4))
    image_units = (vae.decode(masked, z) - decoded).abs().max().item() / 2 * 255  # [-1, 1] -> 0..255
    assert image_units > 1, image_units


def test_latent_format_is_cores():
    """ComfyUI's LATENT is the raw latent; the diffusion model sees it x 1.03682 (core's HunyuanVideo15 format)."""
    model = vae.Hv15VAE(vae.Hv15Config(**TINY))
    z = _latent()
    assert model.comfy_latent_in_model_space is False and torch.equal(model.to_comfy_latent(z), z)
    torch.testing.assert_close(model.to_model_space(z), z * 1.03682)
    torch.testing.assert_close(model.from_model_space(model.to_model_space(z)), z)
    assert HV15_SCALING_FACTOR == 1.03682


def test_shapes_that_fit_no_rule_are_refused(models):
    state = dict(models["released"].state_dict())
    conv = state["decoder.up.1.block.0.conv1.conv.weight"]
    state["decoder.up.1.block.0.conv1.conv.weight"] = conv[:8]
    with pytest.raises(CheckpointError, match=r"decoder stage widths \(32, 8, 16, 16, 8\)"):
        vae.load(state)
    state = dict(models["released"].state_dict())
    state["encoder.conv_out.conv.weight"] = state["encoder.conv_out.conv.weight"][:6]
    with pytest.raises(CheckpointError, match=r"encoder.conv_out.conv.weight \(6, 32, 3, 3, 3\)"):
        vae.load(state)
    with pytest.raises(ValueError, match="attention must be one of"):
        vae.load(models["released"].state_dict(), config={"attention": "sliding"})


@pytest.mark.skipif(not memory.calibration(), reason="no memory calibration")
def test_the_memory_model_counts_the_attention_keys_of_the_clip():
    """On the device the keys and values of every latent frame add to the predicted peak (2 x 45 x 80
    positions x 1024 channels x 2 bytes a latent frame at 720p, bf16); offloaded they count at the
    attention step only, where a long clip's outweigh the chunk's other tensors."""
    model = meta_model("hv15")
    model.set_dtypes(decode=torch.bfloat16)

    def peak(frames: int, offload: str, latent_hw=(45, 80)) -> int:
        clip = planning.clip_of(model, "decode", (1, 32, frames) + latent_hw)
        return memory.estimate(model, clip, 1, None, device="cuda", cache_offload=offload, io_on_device=(False, False),
                               opts=Optimizations(kernel_choice="defaults"))

    per_frame = 2 * 45 * 80 * 1024 * 2
    assert abs(peak(31, "none") - peak(11, "none") - 20 * per_frame) <= 1
    assert peak(31, "host") == peak(11, "host")  # 457 MB of keys, read back at the attention step only
    small = (2, 2)  # a tiny frame: there the keys of a very long clip are the largest thing the run holds
    assert peak(4001, "host", small) - peak(3001, "host", small) == pytest.approx(1000 * per_frame * 4 / (45 * 80), abs=2)
