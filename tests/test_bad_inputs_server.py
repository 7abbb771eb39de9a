"""Bad input, faults and interrupts as ComfyUI users meet them, through a real ComfyUI 0.3.75 server.

Queue-time problems (a checkpoint that is not a video VAE, absurd tiling values) must come back from
`POST /prompt` as node errors carrying our message; run-time problems as an `execution_error` naming
the node and the fix; recoverable faults (out of memory, fp16 overflow, an interrupt) must end in the
library's own result on this or the next run. Library-level counterparts: test_bad_inputs.py.

Out-of-memory errors are injected by the tests' fault hook (comfy_support/faults.py, which the server
process installs at start-up when STREAMVAE_FAULTS is set): this module sets STREAMVAE_FAULTS at
import, i.e. during collection, before the session's server starts, and a test writes the one-shot
fault file before queueing. Without a test writing it the hook does nothing.
"""
import json
import os
import tempfile
from pathlib import Path

import pytest
import requests
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import vae

from comfy_support.client import PromptRejected
from reference import assert_exact, load_tiny, manifest, tensors
from test_bad_inputs import FOREIGN_SAYS, write_foreign
from test_nodes_server import (FRAMES, HEIGHT, WIDTH, as_uint8, assert_images_close, clip, models, node,  # noqa: F401
                               object_info, saved_images, saved_latent, uploaded_clip, vae_file, video_of)

FAULTS_ENV = "STREAMVAE_FAULTS"
os.environ.setdefault(FAULTS_ENV, str(Path(tempfile.gettempdir()) / f"streamvae-faults-{os.getpid()}.json"))
FAULT_FILE = Path(os.environ[FAULTS_ENV])


class _Payload:
    """Pickles to a call of `exec` that would write a marker file if the checkpoint were unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


BAD_FILES = ["zz_bad_unet.safetensors", "zz_bad_lora.safetensors", "zz_bad_clip_text.safetensors",
             "zz_bad_truncated.safetensors", "zz_bad_garbage.safetensors", "zz_bad_evil.ckpt"]


@pytest.fixture(scope="module")
def vae_dir(comfy_server, tmp_path_factory):
    """models/vae of the server with damaged, foreign, malicious and alternative-layout checkpoints
    added (names sort after the fixtures, so no other test picks them by default); removed afterwards."""
    folder = comfy_server.base / "models" / "vae"
    marker = tmp_path_factory.mktemp("pickle") / "marker.txt"
    for kind in ("unet", "lora", "clip_text"):
        write_foreign(kind, folder / f"zz_bad_{kind}.safetensors")
    data = (folder / vae_file("wan21")).read_bytes()
    (folder / "zz_bad_truncated.safetensors").write_bytes(data[: len(data) // 3])
    (folder / "zz_bad_garbage.safetensors").write_bytes(data[:8] + b"\x00\xff" * 16 + data[40:])
    torch.save({"state_dict": dict(tensors("wan21", "tiny_vae.safetensors")), "payload": _Payload(marker)},
               folder / "zz_bad_evil.ckpt")
    native = dict(tensors("wan22", "tiny_vae.safetensors"))
    torch.save({"state_dict": dict(tensors("wan21", "tiny_vae.safetensors"))}, folder / "zz_ok_wan21.pth")
    renamed = manifest("wan22")["diffusers_keys"]
    save_file({renamed[k]: v for k, v in native.items()}, str(folder / "zz_ok_wan22_diffusers.safetensors"))
    save_file({k: v.to(torch.float8_e4m3fn) for k, v in tensors("wan21", "tiny_vae.safetensors").items()},
              str(folder / "zz_ok_wan21_fp8.safetensors"))
    yield folder, marker
    for path in folder.glob("zz_*"):
        path.unlink()


def decode_prompt(info, vae_name, samples=None, **decode):
    """Load VAE -> Decode (an empty 16-channel latent unless `samples` is a node) -> Preview."""
    return {
        "1": samples or node(info, "EmptyHunyuanLatentVideo", width=32, height=32, length=5, batch_size=1),
        "2": node(info, "StreamVAELoader", vae_name=vae_name),
        "3": node(info, "StreamVAEDecode", vae=["2", 0], samples=["1", 0], **decode),
        "4": node(info, "PreviewImage", images=["3", 0]),
    }


def rejection(client, prompt, node_id) -> str:
    """The custom validation messages ComfyUI returned for `node_id` when the prompt was queued."""
    with pytest.raises(PromptRejected) as rejected:
        client.queue(prompt)
    assert rejected.value.error["type"] == "prompt_outputs_failed_validation"
    errors = rejected.value.node_errors[node_id]["errors"]
    assert all(e["type"] == "custom_validation_failed" for e in errors), errors
    return " | ".join(e["details"] for e in errors)


def execution_error(client, prompt, timeout=120) -> dict:
    entry = client.run(prompt, timeout=timeout, check=False)
    assert entry["status"]["status_str"] == "error", entry["status"]
    return next(data for kind, data in entry["status"]["messages"] if kind == "execution_error")


def latent_file(server, name, z) -> str:
    """Write `z` as a core .latent file into the server's input folder (for LoadLatent)."""
    save_file({"latent_tensor": z.contiguous(), "latent_format_version_0": torch.tensor([])},
              str(server.base / "input" / name))
    return name


def interrupt_at_first_step(client, prompt, node_id: str, timeout: float = 120):
    """Queue `prompt` and interrupt it at the first progress step of `node_id`: (the step's value, that
    node's progress messages, the history entry). Raises TimeoutError if it does not end in time."""
    prompt_id = client.queue(prompt)
    seen = client.wait_for(prompt_id, lambda m: m["type"] == "progress" and m["data"]["node"] == node_id, timeout)
    at = seen.progress[-1]["value"] if seen.progress else None
    client.interrupt(prompt_id)
    events = client.wait(prompt_id, timeout)
    return at, [p for p in events.progress if p["node"] == node_id], client.history(prompt_id)


def random_latent(shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# -- checkpoints: refused when the prompt is queued ------------------------------------------------------


@pytest.mark.parametrize("kind", ["unet", "lora", "clip_text"])
def test_foreign_checkpoint_is_rejected_at_queue_time(kind, vae_dir, comfy_client, object_info):
    message = rejection(comfy_client, decode_prompt(object_info, f"zz_bad_{kind}.safetensors"), "2")
    assert "not a video VAE checkpoint" in message and FOREIGN_SAYS[kind] in message, message


@pytest.mark.parametrize("name", ["zz_bad_truncated.safetensors", "zz_bad_garbage.safetensors"])
def test_damaged_checkpoint_is_rejected_at_queue_time(name, vae_dir, comfy_client, object_info):
    message = rejection(comfy_client, decode_prompt(object_info, name), "2")
    assert f"{name} is not a readable safetensors file" in message and "download it again" in message, message


def test_malicious_pickle_is_refused_and_never_runs(vae_dir, comfy_client, object_info):
    _, marker = vae_dir
    message = rejection(comfy_client, decode_prompt(object_info, "zz_bad_evil.ckpt"), "2")
    assert "builtins.exec" in message and "never unpickles code" in message, message
    # The web extension's look-up of the same file answers 400 with the same reason.
    response = requests.get(comfy_client.url + "/api/streamvae/checkpoint", params={"vae_name": "zz_bad_evil.ckpt"},
                            timeout=30)
    assert response.status_code == 400 and "builtins.exec" in response.json()["error"]
    assert not marker.exists(), "the checkpoint's pickled code ran"


def test_checkpoint_missing_from_models_vae_says_where_to_put_it(comfy_client, object_info):
    message = rejection(comfy_client, decode_prompt(object_info, "wan_2.1_vae_from_another_pc.safetensors"), "2")
    assert "is not in models/vae; put the file there" in message, message


@pytest.mark.parametrize("name, family", [("zz_ok_wan21.pth", "wan21"), ("zz_ok_wan22_diffusers.safetensors", "wan22"),
                                          ("zz_ok_wan21_fp8.safetensors", "wan21")])
def test_other_checkpoint_layouts_decode_like_the_library(name, family, vae_dir, comfy_server, comfy_client, object_info):
    """A .pth state dict (read with weights_only), diffusers key names, fp8 storage (upcast on load)."""
    channels = 48 if family == "wan22" else 16
    z = random_latent((1, channels, 2, 3, 4))
    samples = node(object_info, "LoadLatent", latent=latent_file(comfy_server, f"layout_{family}.latent", z))
    entry = comfy_client.run(decode_prompt(object_info, name, samples), timeout=120)
    if name.endswith("fp8.safetensors"):  # the same weights, rounded to fp8 as stored
        model = vae.load({k: v.to(torch.float8_e4m3fn).float() for k, v in tensors(family, "tiny_vae.safetensors").items()})
    else:
        model = load_tiny(family)
    assert entry["outputs"]["2"]["streamvae_model"][0]["family"] == family
    assert_images_close(saved_images(comfy_client, entry, "4"), as_uint8(vae.decode(model, z)))


# -- latents and images -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, message", [((1, 16, 4), "must be 5-D"), ((1, 16, 0, 4, 4), "LATENT is empty")])
def test_unusable_latent_fails_with_a_clear_error(shape, message, comfy_server, comfy_client, object_info):
    samples = node(object_info, "LoadLatent", latent=latent_file(comfy_server, "unusable.latent", torch.zeros(shape)))
    error = execution_error(comfy_client, decode_prompt(object_info, vae_file("wan21"), samples))
    assert error["node_type"] == "StreamVAEDecode" and message in error["exception_message"], error["exception_message"]


def test_nan_latent_names_the_frame(comfy_server, comfy_client, object_info):
    z = random_latent((1, 16, 3, 4, 4))
    z[:, 3, 1, 2, 2] = float("nan")
    samples = node(object_info, "LoadLatent", latent=latent_file(comfy_server, "nan.latent", z))
    error = execution_error(comfy_client, decode_prompt(object_info, vae_file("wan21"), samples))
    assert error["node_type"] == "StreamVAEDecode"
    assert "NaN/Inf" in error["exception_message"] and "frame(s) [1]" in error["exception_message"], error


def test_rgba_image_encodes_its_colour_and_says_so(comfy_server, comfy_client, object_info, uploaded_clip, clip, models):
    prompt = {
        "1": node(object_info, "LoadImage", image=uploaded_clip),
        "2": node(object_info, "JoinImageWithAlpha", image=["1", 0], alpha=["1", 1]),  # 7 RGBA frames
        "3": node(object_info, "StreamVAELoader", vae_name=vae_file("wan21")),
        "4": node(object_info, "StreamVAEEncode", vae=["3", 0], image=["2", 0]),
        "5": node(object_info, "SaveLatent", samples=["4", 0], filename_prefix="rgba"),
    }
    entry = comfy_client.run(prompt, timeout=120)
    assert_exact(saved_latent(comfy_server, entry, "5"), vae.encode(models("wan21"), video_of(clip)),
                               rtol=1e-4, atol=1e-4)
    notes = entry["outputs"]["4"]["streamvae_run"][0]["notes"]
    assert any("alpha dropped" in n for n in notes), notes
    assert "alpha dropped" in comfy_server.log


def test_odd_sizes_with_exact_tiles_come_back_whole(comfy_client, object_info, uploaded_clip, clip, models):
    """2 frames of 40x72 on Wan2.2 (factor 16): padded in time and space, tiled, then cropped back."""
    prompt = {
        "1": node(object_info, "LoadImage", image=uploaded_clip),
        "2": node(object_info, "ImageFromBatch", image=["1", 0], batch_index=0, length=2),
        "3": node(object_info, "ImageScale", image=["2", 0], upscale_method="nearest-exact", width=72, height=40,
                  crop="disabled"),
        "4": node(object_info, "StreamVAELoader", vae_name=vae_file("wan22")),
        "5": node(object_info, "StreamVAEEncode", vae=["4", 0], image=["3", 0], tile_size=64, tile_overlap=16),
        "6": node(object_info, "StreamVAEDecode", vae=["4", 0], samples=["5", 0], tile_size=64, tile_overlap=16),
        "7": node(object_info, "PreviewImage", images=["6", 0]),
    }
    entry = comfy_client.run(prompt, timeout=180)
    video = F.interpolate(video_of(clip[:2])[0].movedim(1, 0), size=(40, 72), mode="nearest-exact").movedim(0, 1)[None]
    model = models("wan22")
    expected = vae.decode(model, vae.encode(model, video), num_frames=2, height=40, width=72)
    images = saved_images(comfy_client, entry, "7")
    assert images.shape == (2, 40, 72, 3)
    assert_images_close(images, as_uint8(expected))
    grid = entry["outputs"]["6"]["streamvae_run"][0]["plan"]["grid"]
    assert grid[0] * grid[1] > 1, grid  # it really ran tiled


# -- tiling values: refused at queue time, or at run time when they arrive through a link -------------------


@pytest.mark.parametrize("class_type, values, message", [
    ("StreamVAEDecode", {"tile_size": -64}, "tile_size must be between 0 (automatic) and 8192"),
    ("StreamVAEDecode", {"tile_overlap": 100_000}, "Value 100000 bigger than max of 4096"),
    ("StreamVAEDecode", {"temporal_chunk": 10**9}, "bigger than max of 4096"),
    ("StreamVAEDecode", {"memory_budget_gb": 1e9}, "bigger than max of 1024.0"),
    ("StreamVAEToCoreVAE", {"tile_size": 8}, "is below 16 px"),
    ("StreamVAEEncode", {"batch_size": -3}, "Value -3 smaller than min of 0"),
])
def test_absurd_values_are_rejected_before_anything_runs(class_type, values, message, comfy_client, object_info):
    """On the widget at fault (ComfyUI's own range check, or the node's for tile_size), on every node."""
    if class_type == "StreamVAEDecode":
        prompt = decode_prompt(object_info, vae_file("wan21"), **values)
    elif class_type == "StreamVAEEncode":
        prompt = encode_prompt(object_info)
        prompt["3"]["inputs"].update(values)
    else:
        prompt = decode_prompt(object_info, vae_file("wan21"))
        prompt["3"] = node(object_info, class_type, vae=["2", 0], **values)
        prompt["4"] = node(object_info, "VAEDecode", samples=["1", 0], vae=["3", 0])
        prompt["5"] = node(object_info, "PreviewImage", images=["4", 0])
    with pytest.raises(PromptRejected) as rejected:
        comfy_client.queue(prompt)
    errors = rejected.value.node_errors["3"]["errors"]
    assert len(errors) == 1 and errors[0]["extra_info"]["input_name"] == next(iter(values)), errors
    assert message in errors[0]["message"] + errors[0]["details"], errors


def test_linked_bad_value_fails_when_the_node_runs(comfy_client, object_info):
    """A value from another node is unknown at queue time; the node refuses it with the same message."""
    prompt = decode_prompt(object_info, vae_file("wan21"))
    prompt["5"] = node(object_info, "PrimitiveInt", value=8)
    prompt["3"]["inputs"]["tile_size"] = ["5", 0]
    error = execution_error(comfy_client, prompt)
    assert error["node_type"] == "StreamVAEDecode" and "is below 16 px" in error["exception_message"]


# -- interrupts, overlapping prompts, faults ------------------------------------------------------------------


def encode_prompt(info, tile_size=64, tiling="exact", family="wan21", **extra):
    """Encode 5 frames of 192x192 (many tiles) -> SaveLatent."""
    return {
        "1": node(info, "EmptyImage", width=192, height=192, batch_size=5, color=0x3366CC),
        "2": node(info, "StreamVAELoader", vae_name=vae_file(family), **extra),
        "3": node(info, "StreamVAEEncode", vae=["2", 0], image=["1", 0], tile_size=tile_size, tile_overlap=16,
                  tiling=tiling),
        "4": node(info, "SaveLatent", samples=["3", 0], filename_prefix="bad_inputs"),
    }


def constant_video(color=0x3366CC, frames=5, size=192):
    rgb = torch.tensor([(color >> 16) & 255, (color >> 8) & 255, color & 255]) / 255
    return (rgb.view(1, 3, 1, 1, 1) * 2 - 1).expand(1, 3, frames, size, size).contiguous()


def test_interrupted_encode_stops_early_and_the_next_run_works(comfy_server, comfy_client, object_info, models):
    """Fast tiles, so one progress step is one tile of one chunk (exact tiles step once per conv)."""
    prompt = encode_prompt(object_info, tiling="fast")
    at_interrupt, steps, entry = interrupt_at_first_step(comfy_client, prompt, "3")
    assert [d["node_type"] for k, d in entry["status"]["messages"] if k == "execution_interrupted"] == ["StreamVAEEncode"]
    assert steps[-1]["value"] <= at_interrupt + 2 < steps[0]["max"], [p["value"] for p in steps]

    again = comfy_client.run(prompt, timeout=180)  # nothing left behind: same prompt, full result
    expected = vae.encode(models("wan21"), constant_video(), vae.Settings(tile_size=64, tile_overlap=16, tiling="fast"))
    assert_exact(saved_latent(comfy_server, again, "4"), expected, rtol=1e-4, atol=1e-4)


def test_prompt_queued_while_a_decode_runs_gets_its_own_result(comfy_server, comfy_client, object_info, models):
    """Two decodes back to back, the second queued while the first still holds its buffers and
    caches: both finish, each with its own latent's frames."""
    latents = [random_latent((1, 16, 3, 8, 8), seed=s) for s in (11, 12)]
    ids = []
    for i, z in enumerate(latents):
        samples = node(object_info, "LoadLatent", latent=latent_file(comfy_server, f"overlap_{i}.latent", z))
        prompt = decode_prompt(object_info, vae_file("wan21"), samples, temporal_chunk=1)
        ids.append(comfy_client.queue(prompt))
        if i == 0:
            comfy_client.wait_for(ids[0], lambda m: m["type"] == "progress", timeout=120)
    for prompt_id, z in zip(ids, latents):
        comfy_client.wait(prompt_id, timeout=240)
        entry = comfy_client.history(prompt_id)
        assert entry["status"]["status_str"] == "success", entry["status"]
        assert_images_close(saved_images(comfy_client, entry, "4"), as_uint8(vae.decode(models("wan21"), z)))


def test_gpu_only_options_on_a_cpu_machine_warn_and_run(comfy_client, object_info, uploaded_clip, clip, models):
    prompt = {
        "1": node(object_info, "LoadImage", image=uploaded_clip),
        "2": node(object_info, "StreamVAEGPUOptimizations", cudnn_benchmark=True, channels_last_3d=True,
                  attention_backend="flash"),
        "3": node(object_info, "StreamVAELoader", vae_name=vae_file("seedvr2"), device="gpu", gpu_options=["2", 0]),
        "4": node(object_info, "StreamVAEEncode", vae=["3", 0], image=["1", 0]),
        "5": node(object_info, "StreamVAEDecode", vae=["3", 0], samples=["4", 0]),
        "6": node(object_info, "PreviewImage", images=["5", 0]),
    }
    entry = comfy_client.run(prompt, timeout=180)
    notes = " | ".join(entry["outputs"]["3"]["streamvae_model"][0]["notes"])
    for expected in ("device gpu: ComfyUI has no GPU here",
                     "cudnn_benchmark: a cuDNN setting, no effect on cpu",
                     "attention flash: a GPU kernel, not available on cpu; PyTorch's choice runs"):
        assert expected in notes, notes
    model = models("seedvr2")
    assert_images_close(saved_images(comfy_client, entry, "6"),
                        as_uint8(vae.decode(model, vae.encode(model, video_of(clip)), num_frames=FRAMES, height=HEIGHT,
                                            width=WIDTH)))


def inject(fault: dict) -> None:
    FAULT_FILE.write_text(json.dumps(fault))


def test_out_of_memory_mid_decode_retries_smaller_and_keeps_the_result(comfy_server, comfy_client, object_info, models):
    z = random_latent((1, 16, 3, 8, 8), seed=21)
    samples = node(object_info, "LoadLatent", latent=latent_file(comfy_server, "oom.latent", z))
    log_before = len(comfy_server.log)
    inject({"op": "decode", "oom_at_call": 50, "times": 1})  # ~35 module calls per chunk: inside the second
    entry = comfy_client.run(decode_prompt(object_info, vae_file("wan21"), samples, temporal_chunk=1), timeout=180)
    assert not FAULT_FILE.exists(), "the fault was not consumed"
    log = comfy_server.log[log_before:]
    assert "injected out-of-memory error 1 of 1" in log and "retrying the chunk with" in log, log[-3000:]
    assert_images_close(saved_images(comfy_client, entry, "4"), as_uint8(vae.decode(models("wan21"), z)))


def test_out_of_memory_at_the_smallest_setting_says_what_was_tried(comfy_server, comfy_client, object_info, models):
    inject({"op": "decode", "oom_at_call": 1, "times": 10**6})
    error = execution_error(comfy_client, decode_prompt(object_info, vae_file("wan21")))
    message = error["exception_message"]
    assert error["node_type"] == "StreamVAEDecode"
    assert "even at the smallest setting" in message and "tried:" in message and "Free memory" in message, message
    entry = comfy_client.run(decode_prompt(object_info, vae_file("wan21")), timeout=120)  # and the next run works
    assert saved_images(comfy_client, entry, "4").shape == (5, 32, 32, 3)


def test_fp16_overflow_falls_back_and_decodes_correctly(comfy_server, comfy_client, object_info):
    z = random_latent((1, 16, 2, 4, 4), seed=31) * 1e5  # overflows fp16 activations, not fp32
    samples = node(object_info, "LoadLatent", latent=latent_file(comfy_server, "overflow.latent", z))
    prompt = decode_prompt(object_info, vae_file("wan21"), samples)
    prompt["2"]["inputs"]["decode_dtype"] = "fp16"
    log_before = len(comfy_server.log)
    entry = comfy_client.run(prompt, timeout=120)
    assert "fp16 decode overflowed" in comfy_server.log[log_before:]
    reference = load_tiny("wan21", dtype=torch.float16).set_dtypes(decode=torch.float32)  # fp16-rounded weights
    assert_images_close(saved_images(comfy_client, entry, "4"), as_uint8(vae.decode(reference, z)))
