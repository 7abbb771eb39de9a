"""Every example workflow in the real frontend, on both ComfyUI trees: served by the templates route with
its thumbnail, loaded without a missing node or a changed widget, its links valid against the server's
/object_info, its note naming every model file with its download page, converted with graphToPrompt,
and the VAE part of the converted prompt executed by the server. Also the web extension (4n+1
snapping, tile-grid/peak prediction) and the pictures: the README screenshot (docs/nodes.png) and the
template thumbnails (example_workflows/<name>.jpg).

The examples are real tasks (Wan2.1/2.2 text and image to video, SeedVR2 upscale, ...) that name the
released files. The test installs the tiny VAE fixtures under the released VAE names (LTX-2's: a full
checkpoint, tests/ltx2_fixtures.py) and empty placeholders under the diffusion-model and text-encoder
names, so the frontend finds every file; what runs is the VAE part (`vae_part`): each sampler is taken
out (its latent input goes straight on), each text encoder gives an empty conditioning and an audio VAE
decode (LTX-2's, MiniMax-H3's) a tone (test probe nodes), and what only fed them is dropped. Frame sizes
are shrunk for the CPU (`cpu_sized`).
"""
import copy
import io
import json
import os
import re
import shutil

import av
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from comfy_support.environment import REPO
from hv10_fixtures import save_small_checkpoint as save_small_hv10
from hv15_fixtures import save_small_checkpoint as save_small_hv15
from ltx2_fixtures import model as ltx2_model, save_full_checkpoint
from ltx25_fixtures import model as ltx25_model, save_split as save_ltx25
from minimax_h3_fixtures import model as minimax_h3_model, save as save_minimax_h3
from vae.video_codecs import resolve
from vae.video_writer import VideoWriter

pytestmark = pytest.mark.comfy  # runs a real ComfyUI: CI's second lane (.ci/run)

EXAMPLES = sorted((REPO / "example_workflows").glob("*.json"))
RELEASED_VAES = {
    "seedvr2_ema_vae_fp16.safetensors": "streamvae_tiny_seedvr2.safetensors",
    "wan_2.1_vae.safetensors": "streamvae_tiny_wan21.safetensors",
    "wan2.2_vae.safetensors": "streamvae_tiny_wan22.safetensors",
}
# Released VAE names with no shared fixture: a small seeded checkpoint is written under the name instead.
WRITTEN_VAES = {"hunyuanvideo15_vae_fp16.safetensors": save_small_hv15,
                "hunyuan_video_vae_bf16.safetensors": save_small_hv10,
                "minimax_h3_video_vae_fp16.safetensors": lambda path: save_minimax_h3(minimax_h3_model(), path),
                "ltx-2.5-video-vae-bf16.safetensors": lambda path: save_ltx25(ltx25_model("released_windows"), path)}
RELEASED_CHECKPOINTS = {"ltx-2-19b-dev.safetensors": "ltx2"}  # made by ltx2_fixtures.save_full_checkpoint
# Core 0.33.0 added native SeedVR2; on 0.3.75 its example can only load with exactly these missing.
# 0.3.75 has LTX-Video's nodes but not LTX-2's audio-video ones (its text encoder, audio VAE and AV latents),
# nor LTXVImgToVideoInplace (nor ManualSigmas, LTX-2.5's); nor Kandinsky 5's nodes, nor MiniMax-H3's.
NEEDS_0_33 = {"seedvr2_upscale_1080p": {"SeedVR2Preprocess", "SeedVR2PostProcessing", "SeedVR2Conditioning"},
              "ltx2_image_to_video": {"LTXAVTextEncoderLoader", "LTXVAudioVAELoader", "LTXVEmptyLatentAudio",
                                      "LTXVConcatAVLatent", "LTXVSeparateAVLatent", "LTXVAudioVAEDecode",
                                      "LTXVImgToVideoInplace"},
              "ltx25_image_to_video": {"LTXVEmptyLatentAudio", "LTXVConcatAVLatent", "LTXVSeparateAVLatent",
                                       "LTXVAudioVAEDecode", "LTXVImgToVideoInplace", "ManualSigmas"},
              "hv10_kandinsky_text_to_video": {"Kandinsky5ImageToVideo"},
              "minimax_h3_text_to_video": {"MiniMaxH3ImageToVideo"}}
SAMPLERS = {"KSampler", "KSamplerAdvanced", "SamplerCustomAdvanced"}  # each takes `latent_image`
MODEL_LOADERS = {"UNETLoader", "CLIPLoader", "DualCLIPLoader", "CLIPVisionLoader", "CheckpointLoaderSimple",
                 "LTXAVTextEncoderLoader", "LTXVAudioVAELoader"}
# Nodes kept though they then feed nothing: StreamVAE Decode to Video reads LTXVConditioning's frame_rate
# from the prompt.
READ_FROM_PROMPT = {"LTXVConditioning"}
AUDIO_TONE = {"hz": 440.0, "seconds": 2.0, "sample_rate": 44100}  # StreamVAETestTone for an audio VAE decode
CPU_SIZES = {
    "EmptyHunyuanLatentVideo": {"width": 64, "height": 48, "length": 9},
    "EmptyLTXVLatentVideo": {"width": 96, "height": 64, "length": 9},
    "WanImageToVideo": {"width": 64, "height": 48, "length": 5},
    "HunyuanVideo15ImageToVideo": {"width": 96, "height": 64, "length": 5},
    "Kandinsky5ImageToVideo": {"width": 64, "height": 48, "length": 9},
    "MiniMaxH3ImageToVideo": {"width": 96, "height": 64, "length": 5},  # 2 latent frames: 5 frames
    "Wan22ImageToVideoLatent": {"width": 64, "height": 64, "length": 9},
    "ImageScale": {"width": 96, "height": 64},
    "StreamVAEEncodeFromVideo": {"width": 96, "height": 64},
}
# Input files the examples name (LoadImage, LoadVideo, LoadLatent), made small.
START_IMAGE, CLIP_VIDEO, SAVED_LATENT = "example.png", "streamvae_example.mp4", "streamvae_example.latent"
SCREENSHOT = REPO / "docs" / "nodes.png"
THUMBNAIL_WIDTH = 512

# The frontend's "Introducing Nodes 2.0" banner would cover the top of a picture: press its close button.
JS_DISMISS_BANNER = """() => {
    const text = Array.from(document.querySelectorAll("span")).find((e) => (e.innerText || "").startsWith("Introducing"));
    const buttons = text?.parentElement?.parentElement?.querySelectorAll("button") ?? [];
    buttons[buttons.length - 1]?.click();
}"""
# Scale and move the canvas so every node is in view with a margin of `pad` CSS pixels, nodes drawn in
# full at any scale, the menus hidden (focus mode) and no minimap: the picture is the graph. Returns the
# settings it changed, for JS_UNFIT_GRAPH: the page is shared by the session's later tests, and focus
# mode hides the panel where the frontend reports missing nodes.
JS_FIT_GRAPH = """async (pad) => {
    const settings = app.extensionManager.setting;
    const changed = {"LiteGraph.Canvas.MinFontSizeForLOD": 0, "Comfy.Minimap.Visible": false};
    const before = Object.fromEntries(Object.keys(changed).map((key) => [key, settings.get(key)]));
    for (const [key, value] of Object.entries(changed)) await settings.set(key, value);
    await app.extensionManager.command.execute("Workspace.ToggleFocusMode");
    await new Promise((resolve) => setTimeout(resolve, 300));
    const title = LiteGraph.NODE_TITLE_HEIGHT, rect = app.canvas.canvas.getBoundingClientRect();
    const nodes = app.graph.nodes;
    const left = Math.min(...nodes.map((n) => n.pos[0])), top = Math.min(...nodes.map((n) => n.pos[1] - title));
    const right = Math.max(...nodes.map((n) => n.pos[0] + n.size[0])), bottom = Math.max(...nodes.map((n) => n.pos[1] + n.size[1]));
    const scale = Math.min((rect.width - 2 * pad) / (right - left), (rect.height - 2 * pad) / (bottom - top));
    app.canvas.ds.scale = scale;
    app.canvas.ds.offset = [pad / scale - left, pad / scale - top];
    app.graph.setDirtyCanvas(true, true);
    return before;
}"""

JS_UNFIT_GRAPH = """async (before) => {
    await app.extensionManager.command.execute("Workspace.ToggleFocusMode");
    for (const [key, value] of Object.entries(before)) await app.extensionManager.setting.set(key, value);
}"""


def picture(page, path, width: int, height: int):
    """The loaded graph fitted into a `width` x `height` page (see JS_FIT_GRAPH) as a PNG at `path`; the
    page is left as it was."""
    page.page.set_viewport_size({"width": width, "height": height})
    before = None
    try:
        before = page.evaluate(JS_FIT_GRAPH, 16)
        page.page.wait_for_timeout(800)
        return page.screenshot(path)
    finally:
        if before is not None:
            page.evaluate(JS_UNFIT_GRAPH, before)
        page.page.set_viewport_size({"width": 1280, "height": 800})


def update_pictures() -> bool:
    return os.environ.get("STREAMVAE_UPDATE_SCREENSHOT") == "1"


def models_of(workflow: dict) -> list[dict]:
    """The model files the workflow's loaders name: {name, url, directory} (the frontend's downloader)."""
    return [model for node in workflow["nodes"] for model in node.get("properties", {}).get("models", [])]


@pytest.fixture(scope="module")
def page(comfy_server, comfy_browser):
    """The frontend, reloaded after every file the examples name was put in place: the tiny VAEs under
    the released names (HunyuanVideo 1.0's and 1.5's and MiniMax-H3's written here, LTX-2's inside a full
    checkpoint), empty placeholders for the diffusion models, text encoders and MiniMax-H3's audio VAE
    (never loaded: `vae_part` takes them out), and small input files."""
    models = comfy_server.base / "models"
    for released, tiny in RELEASED_VAES.items():
        shutil.copyfile(models / "vae" / tiny, models / "vae" / released)
    for released, write in WRITTEN_VAES.items():
        write(models / "vae" / released)
    for released, variant in RELEASED_CHECKPOINTS.items():
        (models / "checkpoints").mkdir(parents=True, exist_ok=True)
        save_full_checkpoint(ltx2_model(variant), models / "checkpoints" / released)
    for model in (m for path in EXAMPLES for m in models_of(json.loads(path.read_text()))):
        target = models / model["directory"] / model["name"]
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
    inputs = comfy_server.base / "input"
    frames = np.random.default_rng(3).integers(0, 256, (9, 64, 96, 3), dtype=np.uint8)
    Image.fromarray(frames[0]).save(inputs / START_IMAGE)
    with VideoWriter(inputs / CLIP_VIDEO, resolve("h264", fps=15), 96, 64, len(frames), overwrite=True) as writer:
        writer.write(frames)
        writer.finish()
    latent = torch.randn(1, 16, 3, 6, 8, generator=torch.Generator().manual_seed(3))  # a Wan2.1 LATENT, 9 frames
    save_file({"latent_tensor": latent, "latent_format_version_0": torch.tensor([])}, str(inputs / SAVED_LATENT))
    comfy_browser.open()  # new node definitions: the file lists now hold the names above
    comfy_browser.evaluate(JS_DISMISS_BANNER)
    return comfy_browser


def vae_part(prompt: dict, object_info: dict) -> dict:
    """The API prompt without its diffusion part: each sampler's consumers take the sampler's latent
    input instead (both outputs of SamplerCustomAdvanced), each text encoder is an empty conditioning
    (the StreamVAETestEmptyConditioning probe) and each CLIPLoader a CLIP that encodes every prompt to one
    (StreamVAETestClip: MiniMax H3 Image to Video takes the text encoder itself), CLIP vision outputs are
    dropped (WanImageToVideo takes them optionally), an audio VAE decode is a tone (StreamVAETestTone:
    LTX-2's tiny checkpoint's audio VAE is a stand-in tensor, MiniMax-H3's audio VAE file a placeholder),
    an LTXVSeparateAVLatent that now splits an LTXVConcatAVLatent's output gives the
    concat's inputs, and every node that then feeds nothing is dropped, but output nodes and those a node
    reads from the prompt (READ_FROM_PROMPT)."""
    prompt = copy.deepcopy(prompt)

    def replace_links(old, new):
        for node in prompt.values():
            for name, value in list(node["inputs"].items()):
                if value == old:
                    if new is None:
                        del node["inputs"][name]
                    else:
                        node["inputs"][name] = new

    for node_id, node in list(prompt.items()):
        if node["class_type"] in SAMPLERS:
            for output in (0, 1):  # SamplerCustomAdvanced: output, denoised_output
                replace_links([node_id, output], node["inputs"]["latent_image"])
            del prompt[node_id]
        elif node["class_type"] == "CLIPLoader":
            prompt[node_id] = {"class_type": "StreamVAETestClip", "inputs": {}}
        elif node["class_type"] in ("LTXVAudioVAEDecode", "VAEDecodeAudio"):
            prompt[node_id] = {"class_type": "StreamVAETestTone", "inputs": dict(AUDIO_TONE)}
        elif node["class_type"] == "CLIPTextEncode":
            prompt[node_id] = {"class_type": "StreamVAETestEmptyConditioning", "inputs": {}}
        elif node["class_type"] == "CLIPVisionEncode":
            replace_links([node_id, 0], None)
            del prompt[node_id]
    for node_id, node in list(prompt.items()):
        joined = prompt.get(node["inputs"].get("av_latent", [None])[0], {})
        if node["class_type"] == "LTXVSeparateAVLatent" and joined.get("class_type") == "LTXVConcatAVLatent":
            replace_links([node_id, 0], joined["inputs"]["video_latent"])
            replace_links([node_id, 1], joined["inputs"]["audio_latent"])
            del prompt[node_id]
    while True:
        used = {value[0] for node in prompt.values() for value in node["inputs"].values() if isinstance(value, list)}
        unused = [node_id for node_id, node in prompt.items()
                  if node_id not in used and not object_info[node["class_type"]].get("output_node")
                  and node["class_type"] not in READ_FROM_PROMPT]
        if not unused:
            break
        for node_id in unused:
            del prompt[node_id]
    assert not {node["class_type"] for node in prompt.values()} & (MODEL_LOADERS | SAMPLERS)
    return prompt


def cpu_sized(prompt: dict) -> dict:
    for node in prompt.values():
        node["inputs"].update(CPU_SIZES.get(node["class_type"], {}))
    return prompt


def input_types(info: dict, name: str) -> str:
    spec = {**info["input"].get("required", {}), **info["input"].get("optional", {})}[name]
    return "COMBO" if isinstance(spec[0], list) else spec[0]


def assert_links_match(workflow: dict, object_info: dict) -> None:
    """Every link joins an output and an input of the type it carries, as the server defines them."""
    nodes = {node["id"]: node for node in workflow["nodes"]}
    for link_id, source, slot, target, target_slot, kind in workflow["links"]:
        made = object_info[nodes[source]["type"]]["output"][slot]
        taken = input_types(object_info[nodes[target]["type"]], nodes[target]["inputs"][target_slot]["name"])
        assert made == kind == taken or "*" in (made, taken), (
            f"link {link_id}: {nodes[source]['type']} output {slot} ({made}) -> {nodes[target]['type']} "
            f"{nodes[target]['inputs'][target_slot]['name']} ({taken}), labelled {kind}")


def assert_note_names_downloads(workflow: dict) -> None:
    """The workflow's note names every model file its loaders use, with a Hugging Face download page."""
    notes = "\n".join(node["widgets_values"][0] for node in workflow["nodes"] if node["type"] == "MarkdownNote")
    assert "https://huggingface.co/" in notes
    for model in models_of(workflow):
        assert model["name"] in notes, f"the note does not name {model['name']}"
        assert model["url"].startswith("https://huggingface.co/"), model


def take_thumbnail(page, path) -> None:
    """The loaded graph as a `THUMBNAIL_WIDTH` px JPEG at `path` (drawn at 1920 x 1080, where every
    example's nodes are large enough to show their widgets)."""
    shot = picture(page, path.with_suffix(".png"), 1920, 1080)
    image = Image.open(shot).convert("RGB")
    image.thumbnail((THUMBNAIL_WIDTH, THUMBNAIL_WIDTH))
    image.save(path, quality=85)
    shot.unlink()


def test_examples_are_listed_as_templates_with_thumbnails(comfy_client):
    assert len(EXAMPLES) >= 7, "the real-task examples are missing"
    listed = comfy_client.get("/api/workflow_templates").json()["StreamVAE"]
    assert sorted(listed) == [p.stem for p in EXAMPLES]
    for path in EXAMPLES:  # the template browser shows <name>.jpg
        thumbnail = comfy_client.get(f"/api/workflow_templates/StreamVAE/{path.stem}.jpg").content
        assert Image.open(io.BytesIO(thumbnail)).format == "JPEG", path.stem


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_loads_validates_and_runs(path, page, comfy_server, comfy_client, tmp_path):
    workflow = comfy_client.get(f"/api/workflow_templates/StreamVAE/{path.name}").json()
    assert workflow == json.loads(path.read_text())
    assert "prompt" not in workflow and {"nodes", "links", "version"} <= set(workflow)  # UI format, not API
    object_info = comfy_client.object_info()
    report = page.load_workflow(workflow)
    if path.stem in NEEDS_0_33 and comfy_server.tree.id == "0.3.75":
        assert set(report.missing_node_types) == NEEDS_0_33[path.stem], report.problems  # nothing else
        page.close_dialogs()
        return
    report.assert_clean()
    assert_links_match(workflow, object_info)
    assert_note_names_downloads(workflow)
    thumbnail = path.with_suffix(".jpg")
    if comfy_server.tree.id == "0.33.0" and (update_pictures() or not thumbnail.exists()):
        take_thumbnail(page, tmp_path / thumbnail.name)
        shutil.copyfile(tmp_path / thumbnail.name, thumbnail)

    prompt = vae_part(page.graph_to_prompt(), object_info)
    assert any(node["class_type"].startswith("StreamVAE") for node in prompt.values())
    entry = comfy_client.run(cpu_sized(prompt), timeout=300)
    for node_id, node in prompt.items():  # every output node made its output
        if object_info[node["class_type"]].get("output_node"):
            assert entry["outputs"].get(node_id), (node["class_type"], entry["outputs"].keys())
    written = [out["streamvae_video"][0] for out in entry["outputs"].values() if "streamvae_video" in out]
    if path.stem == "long_video_to_file":  # the source's 9 frames at its rate, at the size asked for
        assert [(w["frames"], w["fps"], w["width"], w["height"]) for w in written] == [(9, 15.0, 96, 64)]
    if path.stem == "wan22_5b_text_image_to_video":
        assert [w["fps"] for w in written] == [24.0]  # Wan2.2-5B's rate
    if path.stem in ("ltx2_image_to_video", "ltx25_image_to_video"):  # the LTXVConditioning's rate (fps 0), with sound
        rate = 25.0 if path.stem == "ltx2_image_to_video" else 24.0
        assert [(w["frames"], w["fps"], w["width"], w["height"]) for w in written] == [(9, rate, 96, 64)]
        with av.open(str(comfy_server.base / "output" / written[0]["subfolder"] / written[0]["filename"])) as container:
            assert len(container.streams.audio) == 1 and container.streams.audio[0].codec_context.sample_rate > 0
    if path.stem == "minimax_h3_text_to_video":  # core's SaveVideo: the network's 5 frames of 2 latent frames
        saved = [out["images"][0] for out in entry["outputs"].values() if "animated" in out]
        with av.open(str(comfy_server.base / "output" / saved[0]["subfolder"] / saved[0]["filename"])) as container:
            video = container.streams.video[0]
            shown = [(frame.width, frame.height) for frame in container.decode(video)]
            assert (shown, float(video.average_rate), len(container.streams.audio)) == ([(96, 64)] * 5, 24.0, 1)


def test_extension_snaps_to_4n1_and_shows_the_plan(page):
    page.load_workflow(REPO / "example_workflows" / "wan21_text_to_video.json").assert_clean()
    snapped = page.evaluate("""() => {
        const encode = LiteGraph.createNode("StreamVAEEncode");
        app.graph.add(encode);
        const w = encode.widgets.find((w) => w.name === "batch_size");
        const results = [];
        for (const v of [8, 2, 0, 1, 13, 11]) { w.value = v; w.callback(v); results.push(w.value); }
        app.graph.remove(encode);
        const decode = app.graph.nodes.find((n) => n.comfyClass === "StreamVAEDecode");
        const tile = decode.widgets.find((w) => w.name === "tile_size");
        tile.value = 256; tile.callback(256);
        return results;
    }""")
    assert snapped == [9, 1, 0, 1, 13, 13]
    # the readout before the tile change already says "1×1×1 tiles": wait for the one after it
    page.page.wait_for_function("""() => app.graph.nodes
        .filter((n) => n.comfyClass === "StreamVAEDecode")
        .every((n) => {
            const grid = /^(\\d+)\u00d7(\\d+)\u00d7\\d+ tiles/.exec(n.streamvaePrediction || "");
            return grid && grid[1] * grid[2] > 1;
        })""", timeout=30_000)
    lines = page.evaluate("""() => app.graph.nodes
        .filter((n) => (n.comfyClass || "").startsWith("StreamVAE") && n.streamvaePrediction)
        .map((n) => [n.comfyClass, n.streamvaePrediction])""")
    grids = [re.match(r"(\d+)\u00d7(\d+)\u00d7(\d+) tiles \u00b7 peak ", text)
             for cls, text in lines if cls == "StreamVAEDecode"]
    # 256 px tiles on the 832 x 480 latent the sampler makes (found upstream through KSampler)
    assert len(grids) == 1 and grids[0] and int(grids[0][1]) * int(grids[0][2]) > 1, lines
    assert any(cls == "StreamVAELoader" and t.startswith("wan21") for cls, t in lines), lines


@pytest.mark.comfy_trees("0.33.0")
def test_screenshot_of_a_real_task_for_the_readme(page, comfy_client, tmp_path):
    """The Wan2.1 text-to-video example after a run of its VAE part, queued from the page itself (so the
    nodes show their run reports and the output), as the README's screenshot. It replaces
    docs/nodes.png only when that is missing or STREAMVAE_UPDATE_SCREENSHOT=1, so a test run does not
    dirty the working tree."""
    page.load_workflow(REPO / "example_workflows" / "wan21_text_to_video.json").assert_clean()
    prompt = cpu_sized(vae_part(page.graph_to_prompt(), comfy_client.object_info()))
    for node in prompt.values():  # not the example test's clip: nothing may come from the cache
        if node["class_type"] == "EmptyHunyuanLatentVideo":
            node["inputs"]["length"] = 13
    queued = page.evaluate("async (prompt) => (await app.api.queuePrompt(0, {output: prompt, workflow: "
                           "(await app.graphToPrompt()).workflow})).prompt_id", prompt)
    page.page.wait_for_function("""() => (app.graph.nodes.find((n) => n.comfyClass === "StreamVAEDecode")
        .streamvaeRun || "").startsWith("last run")""", timeout=180_000)
    for _ in range(60):  # the saved animation reaches the page after the prompt's history entry
        if comfy_client.history(queued):
            break
        page.page.wait_for_timeout(500)
    assert comfy_client.history(queued)["status"]["status_str"] == "success"
    shot = picture(page, tmp_path / "nodes.png", 1600, 900)
    assert Image.open(shot).size == (1600, 900)
    if update_pictures() or not SCREENSHOT.exists():
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)
