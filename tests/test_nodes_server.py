"""The StreamVAE nodes in a real ComfyUI 0.3.75 server: registration, API prompts end to end against
the library's own output, queue-time validation, interrupts, and the core-VAE adapter.

Inputs are exact: frames are uploaded as an animated PNG, which core LoadImage turns into an IMAGE
batch of uint8/255 values, so the library reference sees the same numbers. Latents come back through
core SaveLatent (float32 safetensors), images through PreviewImage (uint8 PNGs, truncated like core).
A LATENT is what core's VAE nodes make: the library's raw latent for Wan, times 0.9152 for SeedVR2
(`core_latent`). Interop with core's own VAEs: test_core_interop_server.py; Load VAE's VAE output in core's
nodes: test_one_node_swap_server.py.
"""
import io
import math

import numpy as np
import pytest
import requests
import torch
import vae
from vae import families
from PIL import Image
from safetensors.torch import load_file, save_file

from comfy_support.client import PromptRejected
from comfy_support.environment import REPO
from reference import assert_exact, load_tiny

pytestmark = pytest.mark.comfy  # runs a real ComfyUI: CI's second lane (.ci/run)

FAMILIES = ("seedvr2", "wan21", "wan22")
NODES = {
    "StreamVAELoader", "StreamVAEEncode", "StreamVAEDecode", "StreamVAETorchCompileSettings",
    "StreamVAEGPUOptimizations", "StreamVAEToCoreVAE", "StreamVAETestPattern", "StreamVAEDecodeToVideo",
    "StreamVAEEncodeFromVideo", "StreamVAEMultiDevice",
}
UNIT_WORDS = ("pixel", "px", "frame", "GiB", "latent", "per block", "graphs", "CRF", "Seconds")
FRAMES, HEIGHT, WIDTH = 7, 24, 40  # not 4n+1, and not a multiple of 16 (Wan2.2's factor)


def vae_file(family):
    return f"streamvae_tiny_{family}.safetensors"


# -- helpers -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def object_info(comfy_server):
    client = comfy_server.client()
    try:
        return client.object_info()
    finally:
        client.close()


def node(object_info, class_type, **values):
    """An API-prompt node with every required widget at its default, `values` (links) on top."""
    inputs = {}
    for name, spec in object_info[class_type]["input"]["required"].items():
        if name in values:
            continue
        kind, options = spec[0], (spec[1] if len(spec) > 1 else {})
        if "default" in options:
            inputs[name] = options["default"]
        elif kind == "COMBO":
            inputs[name] = options["options"][0]
        elif isinstance(kind, list) and kind:
            inputs[name] = kind[0]
    inputs.update(values)
    return {"class_type": class_type, "inputs": inputs}


@pytest.fixture(scope="module")
def clip():
    """7 random frames 24x40 (uint8), the same every run."""
    return np.random.default_rng(5).integers(0, 256, (FRAMES, HEIGHT, WIDTH, 3), dtype=np.uint8)


def upload_frames(server, frames_uint8, name: str) -> str:
    """uint8 frames N,H,W,3 uploaded as an animated PNG, which core LoadImage reads as an N-frame IMAGE
    batch of exactly these values / 255; returns the name to give LoadImage."""
    data = io.BytesIO()
    images = [Image.fromarray(frame) for frame in frames_uint8]
    images[0].save(data, format="PNG", save_all=True, append_images=images[1:], duration=40, loop=0)
    client = server.client()
    try:
        return client.upload_image(data.getvalue(), name)["name"]
    finally:
        client.close()


@pytest.fixture(scope="module")
def uploaded_clip(comfy_server, clip):
    """`clip` uploaded; core LoadImage reads it as a 7-frame IMAGE batch."""
    return upload_frames(comfy_server, clip, "streamvae_clip.png")


# Core's SeedVR2 VAE keeps LATENTs scaled by this (comfy/ldm/seedvr/constants.py, 0.33.0); Wan's are raw.
SEEDVR2_CORE_SCALE = 0.9152


def core_latent(family, z):
    """The library's raw latent as core's VAE Encode of `family` would return it."""
    return z * SEEDVR2_CORE_SCALE if family == "seedvr2" else z


def video_of(frames_uint8):
    """uint8 N,H,W,3 -> the library's input 1,3,N,H,W in [-1, 1], as the Encode node computes it."""
    image = torch.from_numpy(frames_uint8).float() / 255.0
    return image.permute(3, 0, 1, 2).unsqueeze(0) * 2 - 1


def frames_of(video: torch.Tensor) -> torch.Tensor:
    """The library's B,3,T,H,W in [-1, 1] as core's IMAGE T,H,W,3 in 0..1."""
    return ((video + 1) / 2).clamp(0, 1)[0].permute(1, 2, 3, 0)


def as_uint8(video):
    """Library output B,3,T,H,W in [-1, 1] -> uint8 frames N,H,W,3 as PreviewImage saves them."""
    image = ((video + 1) / 2).clamp(0, 1).permute(0, 2, 3, 4, 1).reshape(-1, *video.shape[3:], 3)
    return np.clip(255.0 * image.numpy(), 0, 255).astype(np.uint8)


def saved_images(client, entry, node_id):
    refs = entry["outputs"][node_id]["images"]
    return np.stack([np.asarray(Image.open(io.BytesIO(client.view(r["filename"], r["subfolder"], r["type"]))).convert("RGB"))
                     for r in refs])


def saved_latent(server, entry, node_id):
    ref = entry["outputs"][node_id]["latents"][0]
    return load_file(str(server.base / "output" / ref["subfolder"] / ref["filename"]))["latent_tensor"]


def assert_images_close(got, expected):
    """PNG frames equal up to one level (float differences at truncation boundaries)."""
    assert got.shape == expected.shape, (got.shape, expected.shape)
    diff = np.abs(got.astype(int) - expected.astype(int))
    assert diff.max() <= 1, f"max difference {diff.max()} levels"


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = load_tiny(family)
        return cache[family]
    return get


# -- registration -------------------------------------------------------------------------------------


def test_object_info_lists_every_node_with_tooltips(comfy_server, object_info):
    comfy_server.assert_pack_imported()
    ours = {name for name, info in object_info.items() if info["python_module"] == "custom_nodes.StreamVAE"}
    assert ours == NODES
    for name in NODES:
        info = object_info[name]
        assert info["category"] == "StreamVAE" and info["display_name"].startswith("StreamVAE")
        inputs = {**info["input"]["required"], **info["input"].get("optional", {})}
        assert inputs, name
        for input_name, spec in inputs.items():
            tooltip = spec[1].get("tooltip", "")
            assert len(tooltip) > 20, f"{name}.{input_name} has no useful tooltip"
            assert len(tooltip.split()) <= 30, f"{name}.{input_name}: the long text belongs in docs/nodes.md"
            if spec[0] in ("INT", "FLOAT") and input_name not in ("batch_size",):
                assert any(word in tooltip for word in UNIT_WORDS), f"{name}.{input_name}: no unit in {tooltip!r}"
    loader = object_info["StreamVAELoader"]["input"]
    assert {vae_file(f) for f in FAMILIES} <= set(loader["required"]["vae_name"][1]["options"])
    choices = [choice.input for choice in families.load_choices()]  # in the order declared: widget values are positional
    assert object_info["StreamVAELoader"]["input_order"]["optional"] == ["kernels", *choices, "compile", "gpu_options",
                                                                         "devices"]
    assert object_info["StreamVAEEncode"]["input_order"]["required"][:3] == ["vae", "image", "batch_size"]
    assert object_info["StreamVAELoader"]["output"] == ["STREAMVAE", "VAE"]  # the one-node swap
    decode = object_info["StreamVAEDecode"]
    if comfy_server.tree.id.startswith("0.33"):  # expert inputs folded, and found by core's node names
        assert decode["input"]["required"]["tile_overlap"][1]["advanced"] is True
        assert "advanced" not in decode["input"]["required"]["tile_size"][1]
        assert {"VAE Decode", "tiled", "SeedVR2", "Wan"} <= set(decode["search_aliases"])


def test_node_reference_documents_every_input(object_info):
    """docs/nodes.md names every input in its node's section; a family's load choices (Load VAE's) are named in
    docs/families.md, which that section points to."""
    reference = (REPO / "docs" / "nodes.md").read_text()
    choices = {choice.input for choice in families.load_choices()}
    family_reference = (REPO / "docs" / "families.md").read_text()
    for name in NODES:
        info = object_info[name]
        heading = f"## {info['display_name']}\n"
        assert heading in reference, f"docs/nodes.md has no section {heading.strip()!r}"
        section = reference.split(heading, 1)[1].split("\n## ", 1)[0]
        for input_name in {**info["input"]["required"], **info["input"].get("optional", {})}:
            where = family_reference if input_name in choices else section
            assert f"`{input_name}`" in where, (f"docs/families.md lacks `{input_name}`" if input_name in choices else
                                                f"docs/nodes.md section {info['display_name']!r} lacks `{input_name}`")


def test_web_extension_and_templates_are_served(comfy_client):
    assert "/extensions/StreamVAE/streamvae.js" in comfy_client.get("/extensions").json()
    assert "registerExtension" in comfy_client.get("/extensions/StreamVAE/streamvae.js").text
    templates = comfy_client.get("/api/workflow_templates").json()
    assert set(templates["StreamVAE"]) == {path.stem for path in (REPO / "example_workflows").glob("*.json")}
    info = comfy_client.get("/api/streamvae/checkpoint", vae_name=vae_file("wan22")).json()
    assert info["family"] == "wan22" and info["latent_channels"] == 48 and info["spatial_factor"] == 16
    plan = comfy_client.get("/api/streamvae/plan", vae_name=vae_file("seedvr2"), op="decode", width=512, height=320,
                            frames=17, tile_size=256, tile_overlap=64, tiling="fast").json()
    rows, cols, chunks = plan["plan"]["grid"]
    assert plan["family"] == "seedvr2" and rows >= 2 and cols >= 2 and chunks >= 1  # 256 px tiles on 512 x 320
    assert plan["plan"]["kernel_choice"] == "measure" and plan["plan"]["kernels_on_record"] >= 0
    fixed = comfy_client.get("/api/streamvae/plan", vae_name=vae_file("seedvr2"), op="decode", width=512, height=320,
                             frames=17, kernels="defaults").json()["plan"]
    assert fixed["kernel_choice"] == "defaults" and fixed["kernels_on_record"] is None
    bad = requests.get(comfy_client.url + "/api/streamvae/plan", params={"vae_name": "nope.safetensors"}, timeout=30)
    assert bad.status_code == 400 and "in neither models/vae nor models/checkpoints" in bad.json()["error"]


# -- encode / decode end to end -------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_matches_the_library(family, comfy_server, comfy_client, object_info, uploaded_clip, clip, models):
    prompt = {
        "1": node(object_info, "LoadImage", image=uploaded_clip),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file(family)),
        "3": node(object_info, "StreamVAEEncode", vae=["2", 0], image=["1", 0]),
        "4": node(object_info, "SaveLatent", samples=["3", 0], filename_prefix=f"roundtrip_{family}"),
        "5": node(object_info, "StreamVAEDecode", vae=["2", 0], samples=["3", 0]),
        "6": node(object_info, "PreviewImage", images=["5", 0]),
    }
    entry = comfy_client.run(prompt, timeout=180)

    model = models(family)
    z = vae.encode(model, video_of(clip))
    latent = saved_latent(comfy_server, entry, "4")
    assert latent.shape == z.shape == (1, model.latent_channels, 3, math.ceil(HEIGHT / model.spatial_factor),
                                      math.ceil(WIDTH / model.spatial_factor))
    assert_exact(latent, core_latent(family, z), rtol=1e-4, atol=1e-4)
    images = saved_images(comfy_client, entry, "6")
    assert images.shape == (FRAMES, HEIGHT, WIDTH, 3)  # every frame back, padding trimmed
    assert_images_close(images, as_uint8(vae.decode(model, z, num_frames=FRAMES, height=HEIGHT, width=WIDTH)))
    run = entry["outputs"]["5"]["streamvae_run"][0]
    assert run["op"] == "decode" and run["clips"] == 1 and run["steps"] >= 1
    assert run["plan"]["kernel_choice"] == "measure" and run["kernels"].startswith("kernels: measured")
    assert "activations NDHWC; planned: conv3d onednn;" in run["kernels"]  # float32 on a CPU: automatic layout
    assert "conv3d onednn" in run["kernels"].split(";")[0]  # what this run ran, not what the process had measured
    doctor = {line.split(":", 1)[0]: line for line in run["doctor"]}  # vae doctor's lines for this run
    assert doctor["activation layout in fp32"].startswith("activation layout in fp32: NDHWC")
    assert doctor["memory model on cpu"].endswith(f"{family} decode untiled: measured")
    assert entry["outputs"]["2"]["streamvae_model"][0]["family"] == family


@pytest.mark.parametrize("batch_size, clips", [(5, [5, 2]), (1, [1] * FRAMES)])
def test_batch_size_splits_clips(batch_size, clips, comfy_server, comfy_client, object_info, uploaded_clip, clip, models):
    family = "wan22"
    prompt = {
        "1": node(object_info, "LoadImage", image=uploaded_clip),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file(family), kernels="defaults"),
        "3": node(object_info, "StreamVAEEncode", vae=["2", 0], image=["1", 0], batch_size=batch_size),
        "4": node(object_info, "SaveLatent", samples=["3", 0], filename_prefix=f"split_{batch_size}"),
        "5": node(object_info, "StreamVAEDecode", vae=["2", 0], samples=["3", 0]),
        "6": node(object_info, "PreviewImage", images=["5", 0]),
    }
    entry = comfy_client.run(prompt, timeout=180)

    model = models(family)
    latent = saved_latent(comfy_server, entry, "4")
    assert latent.shape[0] == len(clips)
    expected_frames, start = [], 0
    for i, frames in enumerate(clips):
        # Each clip alone (no bleeding through the causal cache); a short last clip repeats its last frame.
        index = np.minimum(np.arange(start, start + batch_size), start + frames - 1)
        z = vae.encode(model, video_of(clip[index]))
        assert_exact(latent[i:i + 1], z, rtol=1e-4, atol=1e-4)
        expected_frames.append(as_uint8(vae.decode(model, z, num_frames=frames, height=HEIGHT, width=WIDTH)))
        start += frames
    assert_images_close(saved_images(comfy_client, entry, "6"), np.concatenate(expected_frames))
    run = entry["outputs"]["5"]["streamvae_run"][0]  # the Load VAE setting reaches the plan and the run
    assert run["plan"]["kernel_choice"] == "defaults" and run["kernels"].startswith("kernels: defaults")
    if "2" in entry["outputs"]:  # Load VAE ran in this prompt (not answered from ComfyUI's cache)
        assert entry["outputs"]["2"]["streamvae_model"][0]["kernels"] == "defaults"


def test_decode_takes_core_empty_latents(comfy_client, object_info, models):
    prompt = {
        "1": node(object_info, "EmptyHunyuanLatentVideo", width=32, height=48, length=5, batch_size=2),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file("wan21")),
        "3": node(object_info, "StreamVAEDecode", vae=["2", 0], samples=["1", 0]),
        "4": node(object_info, "PreviewImage", images=["3", 0]),
    }
    entry = comfy_client.run(prompt, timeout=120)
    expected = vae.decode(models("wan21"), torch.zeros(1, 16, 2, 6, 4))
    images = saved_images(comfy_client, entry, "4")
    assert images.shape == (10, 48, 32, 3)  # two clips of 5 frames
    assert_images_close(images, np.concatenate([as_uint8(expected)] * 2))


@pytest.mark.parametrize("layout", ["folded", "channels_last"])
def test_decode_takes_seedvr2_latents_in_other_layouts(layout, comfy_server, comfy_client, models):
    """Core's folded B,16*T,H,W and a channels-last B,T,H,W,16 SeedVR2 LATENT decode like core's B,16,T,H,W,
    and the run report says which layout was read."""
    z = torch.randn(1, 16, 3, 4, 5, generator=torch.Generator().manual_seed(1))
    samples = core_latent("seedvr2", z)
    samples = samples.reshape(1, 48, 4, 5) if layout == "folded" else samples.permute(0, 2, 3, 4, 1)
    name = f"streamvae_seedvr2_{layout}.latent"
    save_file({"latent_tensor": samples.contiguous(), "latent_format_version_0": torch.tensor([])},
              str(comfy_server.base / "input" / name))
    info = comfy_client.object_info()
    prompt = {
        "1": node(info, "LoadLatent", latent=name),
        "2": node(info, "StreamVAELoader", vae_name=vae_file("seedvr2")),
        "3": node(info, "StreamVAEDecode", vae=["2", 0], samples=["1", 0]),
        "4": node(info, "PreviewImage", images=["3", 0]),
    }
    entry = comfy_client.run(prompt, timeout=120)
    assert_images_close(saved_images(comfy_client, entry, "4"), as_uint8(vae.decode(models("seedvr2"), z)))
    read = entry["outputs"]["3"]["streamvae_run"][0]["latent_layout"]
    assert read.startswith("B,C*T,H,W" if layout == "folded" else "B,T,H,W,C"), read


def test_latent_of_another_family_is_named_clearly(comfy_client, object_info):
    prompt = {
        "1": node(object_info, "EmptyHunyuanLatentVideo", width=32, height=32, length=1, batch_size=1),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file("wan22")),
        "3": node(object_info, "StreamVAEDecode", vae=["2", 0], samples=["1", 0]),
        "4": node(object_info, "PreviewImage", images=["3", 0]),
    }
    entry = comfy_client.run(prompt, timeout=60, check=False)
    assert entry["status"]["status_str"] == "error"
    error = next(data for kind, data in entry["status"]["messages"] if kind == "execution_error")
    assert error["node_type"] == "StreamVAEDecode"
    assert "16 channels" in error["exception_message"] and "48-channel" in error["exception_message"]


@pytest.mark.comfy_trees("0.3.75")
@pytest.mark.heavy  # minutes of CPU: run once per version of its code (tests/heavy.py)
def test_settings_nodes_feed_the_loader(comfy_client, object_info, uploaded_clip, clip, models):
    """Compile settings + GPU options wired in: on CPU compilation falls back to eager (or compiles),
    the GPU switches are no-ops, and the result is still the library's. One tree: the wiring is the
    pack's, and tracing takes 25 s on 2 cores (the older tree, which the old-torch run uses too)."""
    prompt = {
        "1": node(object_info, "LoadImage", image=uploaded_clip),
        "2": node(object_info, "StreamVAETorchCompileSettings", backend="eager"),
        "3": node(object_info, "StreamVAEGPUOptimizations", attention_backend="math"),
        "4": node(object_info, "StreamVAELoader", vae_name=vae_file("wan22"), compile=["2", 0], gpu_options=["3", 0]),
        "5": node(object_info, "StreamVAEEncode", vae=["4", 0], image=["1", 0], temporal_chunk=2),
        "6": node(object_info, "StreamVAEDecode", vae=["4", 0], samples=["5", 0], temporal_chunk=1),
        "7": node(object_info, "PreviewImage", images=["6", 0]),
    }
    entry = comfy_client.run(prompt, timeout=300)
    model = models("wan22")
    expected = vae.decode(model, vae.encode(model, video_of(clip)), num_frames=FRAMES, height=HEIGHT, width=WIDTH)
    assert_images_close(saved_images(comfy_client, entry, "7"), as_uint8(expected))
    notes = entry["outputs"]["6"]["streamvae_run"][0]["notes"]
    compiled = [n for n in notes if n.startswith("compile: ")]
    assert compiled and compiled[0].startswith(("compile: compiled", "compile: eager (fallback")), notes
    assert "recompile limit" not in compiled[0], notes  # every block stays within its own limit


def test_core_vae_adapter_gives_core_latent_sizes(comfy_server, comfy_client, object_info, models):
    """6 frames of 28 x 44 through VAE Encode with the adapter: core's SeedVR2 VAE makes 2 x 3 x 5 latents
    (the 6th frame dropped, floor(size / 8)); the adapter crops the top left to match and warns."""
    prompt = {
        "1": node(object_info, "EmptyImage", width=44, height=28, batch_size=6, color=0x3366CC),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file("seedvr2")),
        "3": node(object_info, "StreamVAEToCoreVAE", vae=["2", 0]),
        "4": node(object_info, "VAEEncode", pixels=["1", 0], vae=["3", 0]),
        "5": node(object_info, "SaveLatent", samples=["4", 0], filename_prefix="core_adapter_sizes"),
    }
    log_before = len(comfy_server.log)
    entry = comfy_client.run(prompt, timeout=120)
    colour = torch.tensor([0x33, 0x66, 0xCC]) / 255.0 * 2 - 1
    video = colour.view(1, 3, 1, 1, 1).expand(1, 3, 5, 24, 40)
    expected = core_latent("seedvr2", vae.encode(models("seedvr2"), video.contiguous()))
    assert_exact(saved_latent(comfy_server, entry, "5"), expected, rtol=1e-4, atol=1e-4)
    assert "44x28 frames cropped to 40x24 (top left)" in comfy_server.log[log_before:]


# -- validation and interrupts ---------------------------------------------------------------------------


@pytest.mark.parametrize("class_type, values, widget, message", [
    ("StreamVAEDecode", {"tile_size": 8, "tile_overlap": 0}, "tile_size", "is below 16 px"),
    ("StreamVAEEncode", {"tile_size": 100_000}, "tile_size", "between 0 (automatic) and 8192"),
    ("StreamVAEDecode", {"tile_size": "abc"}, "tile_size", "tile_size must be a whole number; got 'abc'"),
    ("StreamVAEDecode", {"memory_budget_gb": -1.0}, "memory_budget_gb", "smaller than min of 0.0"),
    ("StreamVAEDecode", {"memory_budget_gb": "abc"}, "memory_budget_gb", "could not convert string to float: 'abc'"),
    ("StreamVAEEncode", {"temporal_chunk": 10**9}, "temporal_chunk", "bigger than max of 4096"),
])
def test_bad_values_get_a_validation_error_on_their_widget_only(class_type, values, widget, message, comfy_client,
                                                                object_info):
    """Queued values are checked per widget, and each error is shown on the widget at fault alone (a
    validate_inputs error is shown on every input the function takes, so the nodes' take tile_size only);
    a value of the wrong type gets a message, never a Python error from comparing it."""
    source = ("EmptyImage", "image") if class_type == "StreamVAEEncode" else ("EmptyHunyuanLatentVideo", "samples")
    prompt = {
        "1": node(object_info, source[0], width=32, height=32),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file("wan21")),
        "3": node(object_info, class_type, vae=["2", 0], **{source[1]: ["1", 0]}, **values),
        "4": node(object_info, "PreviewImage" if class_type == "StreamVAEDecode" else "SaveLatent",
                  **({"images": ["3", 0]} if class_type == "StreamVAEDecode" else {"samples": ["3", 0]})),
    }
    with pytest.raises(PromptRejected) as rejected:
        comfy_client.queue(prompt)
    assert rejected.value.error["type"] == "prompt_outputs_failed_validation"
    errors = rejected.value.node_errors["3"]["errors"]
    assert {e["extra_info"]["input_name"] for e in errors} == {widget}, errors
    assert any(message in e["message"] + e["details"] for e in errors), errors
    assert "not supported between" not in str(errors)


def test_interrupt_stops_a_tiled_decode_within_one_tile(comfy_client, object_info):
    prompt = {
        "1": node(object_info, "EmptyHunyuanLatentVideo", width=256, height=256, length=1, batch_size=1),
        "2": node(object_info, "StreamVAELoader", vae_name=vae_file("wan21")),
        "3": node(object_info, "StreamVAEDecode", vae=["2", 0], samples=["1", 0], tile_size=64, tile_overlap=16,
                  tiling="fast"),
        "4": node(object_info, "PreviewImage", images=["3", 0]),
    }
    prompt_id = comfy_client.queue(prompt)
    first = comfy_client.wait_for(prompt_id, lambda m: m["type"] == "progress" and m["data"]["node"] == "3", timeout=120)
    seen_at_interrupt = first.progress[-1]["value"]
    comfy_client.interrupt(prompt_id)
    events = comfy_client.wait(prompt_id, timeout=120)

    entry = comfy_client.history(prompt_id)
    assert entry["status"]["status_str"] == "error"
    interrupted = [data for kind, data in entry["status"]["messages"] if kind == "execution_interrupted"]
    assert len(interrupted) == 1 and interrupted[0]["node_type"] == "StreamVAEDecode"
    steps = [p for p in events.progress if p["node"] == "3"]
    total = steps[0]["max"]
    assert total == 25  # 5 x 5 tiles of 64 px (16 px overlap) over 256 x 256, one chunk
    # The interrupt lands at the next tile boundary: at most the tile running when it was sent, plus
    # one for the websocket round trip, and far from the end.
    assert steps[-1]["value"] <= seen_at_interrupt + 2 < total, [p["value"] for p in steps]
    assert "4" not in entry["outputs"]
