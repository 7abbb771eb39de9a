"""StreamVAE Multi-GPU in a real ComfyUI server, on the CPU: Load VAE with two worker processes
("cpu, cpu") encodes and decodes like the library in one process; a worker killed mid-decode fails the
prompt with that rank's message and leaves no worker behind; the next prompt starts new workers."""
import os
import signal

import pytest
import torch
import vae

from comfy_support.client import PromptRejected
from reference import assert_exact
from test_distributed import worker_processes
from test_nodes_server import (FRAMES, HEIGHT, WIDTH, as_uint8, assert_images_close, clip, core_latent,  # noqa: F401
                               models, node, object_info, saved_images, saved_latent, uploaded_clip, vae_file, video_of)

FAMILY = "seedvr2"  # GroupNorm statistics are all-reduced between the ranks


def multi_device_prompt(object_info, devices="cpu, cpu", **loader):
    return {
        "m": node(object_info, "StreamVAEMultiDevice", devices=devices, timeout_s=60),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file(FAMILY), devices=["m", 0], **loader),
    }


def workers_of(server) -> list:
    return worker_processes(server._process.pid)


def test_two_worker_processes_round_trip_like_one_process(comfy_server, comfy_client, object_info, uploaded_clip,
                                                          clip, models):
    prompt = multi_device_prompt(object_info)
    prompt.update({
        "1": node(object_info, "LoadImage", image=uploaded_clip),
        "3": node(object_info, "StreamVAEEncode", vae=["2", 0], image=["1", 0]),
        "4": node(object_info, "SaveLatent", samples=["3", 0], filename_prefix="multi_device"),
        "5": node(object_info, "StreamVAEDecode", vae=["2", 0], samples=["3", 0], temporal_chunk=1),
        "6": node(object_info, "PreviewImage", images=["5", 0]),
    })
    entry = comfy_client.run(prompt, timeout=240)
    model = models(FAMILY)
    z = vae.encode(model, video_of(clip))
    assert_exact(saved_latent(comfy_server, entry, "4"), core_latent(FAMILY, z), rtol=1e-4, atol=1e-4)
    expected = as_uint8(vae.decode(model, z, num_frames=FRAMES, height=HEIGHT, width=WIDTH))
    assert_images_close(saved_images(comfy_client, entry, "6"), expected)
    assert entry["outputs"]["2"]["streamvae_model"][0]["devices"] == ["cpu", "cpu"]
    assert entry["outputs"]["5"]["streamvae_run"][0]["steps"] == 3  # one progress step per latent chunk (7 frames -> 3)
    assert len(workers_of(comfy_server)) == 2  # kept for the next run


def test_a_worker_killed_mid_decode_fails_the_prompt_and_leaves_no_process(comfy_server, comfy_client, object_info):
    prompt = multi_device_prompt(object_info)
    prompt.update({
        "1": node(object_info, "EmptyHunyuanLatentVideo", width=64, height=64, length=161, batch_size=1),
        "3": node(object_info, "StreamVAEDecode", vae=["2", 0], samples=["1", 0], temporal_chunk=1),
        "4": node(object_info, "PreviewImage", images=["3", 0]),
    })
    prompt_id = comfy_client.queue(prompt)
    comfy_client.wait_for(prompt_id, lambda m: m["type"] == "progress" and m["data"].get("node") == "3", timeout=240)
    victims = sorted(workers_of(comfy_server), key=lambda p: p.create_time())
    assert len(victims) == 2
    os.kill(victims[1].pid, signal.SIGKILL)
    comfy_client.wait(prompt_id, timeout=60)
    entry = comfy_client.history(prompt_id)
    assert entry["status"]["status_str"] == "error"
    error = next(data for kind, data in entry["status"]["messages"] if kind == "execution_error")
    assert "rank 1 (cpu) failed: the process exited (SIGKILL" in error["exception_message"]
    assert not workers_of(comfy_server)
    # the next run starts new workers
    prompt["1"]["inputs"]["length"] = 5
    comfy_client.run(prompt, timeout=240)


def test_devices_are_checked_when_queued(comfy_client, object_info):
    prompt = multi_device_prompt(object_info, devices="cpu")
    prompt.update({"1": node(object_info, "EmptyHunyuanLatentVideo", width=32, height=32, length=5, batch_size=1),
                   "3": node(object_info, "StreamVAEDecode", vae=["2", 0], samples=["1", 0]),
                   "4": node(object_info, "PreviewImage", images=["3", 0])})
    with pytest.raises(PromptRejected, match="at least two devices"):
        comfy_client.queue(prompt)
    if not torch.cuda.is_available():  # CUDA devices counted in words: not "0 CUDA device(s) (cuda:0 .. cuda:-1)"
        prompt["m"]["inputs"]["devices"] = "cuda:0, cuda:1"
        with pytest.raises(PromptRejected, match=r"'cuda:0': this machine has no CUDA device \(a CPU-only torch"):
            comfy_client.queue(prompt)
