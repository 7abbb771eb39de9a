"""Every example workflow in the real frontend: served by the templates route, loaded without a
problem, converted with graphToPrompt, and the converted prompt executed by the server. Also the web
extension (4n+1 snapping, tile-grid/peak prediction) and the README screenshot (docs/nodes.png).

The examples name the released checkpoints (ema_vae_fp16.safetensors, wan_2.1_vae.safetensors,
wan2.2_vae.safetensors); the test installs the tiny fixtures under those names. Their frame sizes are
meant for GPUs; `cpu_sized` shrinks only the generator nodes' sizes so the suite runs on CPU, keeping
every other value as shipped (the exact-vs-fast example still gets a 2-tile grid).
"""
import json
import os
import re
import shutil

import pytest
from PIL import Image, ImageStat

from comfy_support.environment import REPO

EXAMPLES = sorted((REPO / "example_workflows").glob("*.json"))
RELEASED_NAMES = {
    "ema_vae_fp16.safetensors": "streamvae_tiny_seedvr2.safetensors",
    "wan_2.1_vae.safetensors": "streamvae_tiny_wan21.safetensors",
    "wan2.2_vae.safetensors": "streamvae_tiny_wan22.safetensors",
}
CPU_SIZES = {
    "StreamVAETestPattern": {"width": 96, "height": 64},
    "EmptyHunyuanLatentVideo": {"width": 64, "height": 48, "length": 9},
}
TILED_EXAMPLE_SIZE = {"width": 320, "height": 192, "frames": 5}  # 256 px tiles -> a 1 x 2 grid
SCREENSHOT = REPO / "docs" / "nodes.png"

# The frontend's "Introducing Nodes 2.0" banner would cover the top of the screenshot: press its close button.
JS_DISMISS_BANNER = """() => {
    const text = Array.from(document.querySelectorAll("span")).find((e) => (e.innerText || "").startsWith("Introducing"));
    const buttons = text?.parentElement?.parentElement?.querySelectorAll("button") ?? [];
    buttons[buttons.length - 1]?.click();
}"""


@pytest.fixture(scope="module")
def page(comfy_server, comfy_browser):
    """The frontend, reloaded after the tiny checkpoints were installed under their released names."""
    vae_dir = comfy_server.base / "models" / "vae"
    for released, tiny in RELEASED_NAMES.items():
        shutil.copyfile(vae_dir / tiny, vae_dir / released)
    comfy_browser.open()  # new node definitions: the vae_name lists now hold the released names
    return comfy_browser


def cpu_sized(prompt: dict, example: str) -> dict:
    for node in prompt.values():
        sizes = CPU_SIZES.get(node["class_type"], {})
        if example == "tiled_exact_vs_fast" and node["class_type"] == "StreamVAETestPattern":
            sizes = TILED_EXAMPLE_SIZE
        node["inputs"].update(sizes)
    return prompt


def test_examples_are_listed_as_templates(comfy_client):
    assert EXAMPLES, "no example workflows"
    listed = comfy_client.get("/api/workflow_templates").json()["StreamVAE"]
    assert sorted(listed) == [p.stem for p in EXAMPLES]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_loads_converts_and_runs(path, page, comfy_client):
    workflow = comfy_client.get(f"/api/workflow_templates/StreamVAE/{path.name}").json()
    assert workflow == json.loads(path.read_text())
    assert "prompt" not in workflow and {"nodes", "links", "version"} <= set(workflow)  # UI format, not API
    page.load_workflow(workflow).assert_clean()

    prompt = page.graph_to_prompt()
    known = comfy_client.object_info()
    assert {n["class_type"] for n in prompt.values()} <= set(known)
    assert any(n["class_type"].startswith("StreamVAE") for n in prompt.values())
    entry = comfy_client.run(cpu_sized(prompt, path.stem), timeout=300)

    previews = {id: out["images"] for id, out in entry["outputs"].items() if "images" in out}
    assert previews and all(previews.values())
    if path.stem == "video_roundtrip":
        frames = next(n["inputs"]["frames"] for n in prompt.values() if n["class_type"] == "StreamVAETestPattern")
        assert [len(images) for images in previews.values()] == [frames]  # no frame lost (30, not 4n+1)
    if path.stem == "long_video_to_file":  # through a file and back: every frame, at the pattern's size
        frames = next(n["inputs"]["frames"] for n in prompt.values() if n["class_type"] == "StreamVAETestPattern")
        written = next(out["streamvae_video"][0] for out in entry["outputs"].values() if "streamvae_video" in out)
        assert (written["frames"], written["width"], written["height"]) == (frames, 96, 64)
        assert frames in [len(images) for images in previews.values()]
    if path.stem == "tiled_exact_vs_fast":
        runs = [out["streamvae_run"][0] for out in entry["outputs"].values() if "streamvae_run" in out]
        assert sorted(run["plan"]["grid"][:2] for run in runs if run["op"] == "decode") == [[1, 2], [1, 2]]


def test_extension_snaps_to_4n1_and_shows_the_plan(page):
    page.load_workflow(REPO / "example_workflows" / "tiled_exact_vs_fast.json").assert_clean()
    snapped = page.evaluate("""() => {
        const encode = app.graph.nodes.find((n) => n.comfyClass === "StreamVAEEncode");
        const w = encode.widgets.find((w) => w.name === "batch_size");
        const results = [];
        for (const v of [8, 2, 0, 1, 13, 11]) { w.value = v; w.callback(v); results.push(w.value); }
        w.value = 0; w.callback(0);
        return results;
    }""")
    assert snapped == [9, 1, 0, 1, 13, 13]
    page.page.wait_for_function("""() => app.graph.nodes
        .filter((n) => n.comfyClass === "StreamVAEDecode")
        .every((n) => (n.streamvaePrediction || "").includes("tiles"))""", timeout=30_000)
    lines = page.evaluate("""() => app.graph.nodes
        .filter((n) => (n.comfyClass || "").startsWith("StreamVAE") && n.streamvaePrediction)
        .map((n) => [n.comfyClass, n.streamvaePrediction])""")
    grids = [re.match(r"(\d+)\u00d7(\d+)\u00d7(\d+) tiles \u00b7 peak ", text) for cls, text in lines if cls == "StreamVAEDecode"]
    assert len(grids) == 2 and all(g and int(g[1]) * int(g[2]) > 1 for g in grids), lines  # 256 px tiles on 768 x 512
    assert any(cls == "StreamVAELoader" and t.startswith("wan22") for cls, t in lines), lines


def test_screenshot_of_the_nodes_for_the_readme(page, tmp_path):
    """Run the round-trip example from the page itself (so the nodes show their run reports and the
    preview) and take the README's screenshot. It replaces docs/nodes.png only when that is missing or
    STREAMVAE_UPDATE_SCREENSHOT=1, so a test run does not dirty the working tree."""
    page.load_workflow(REPO / "example_workflows" / "video_roundtrip.json").assert_clean()
    page.evaluate(JS_DISMISS_BANNER)
    page.page.set_viewport_size({"width": 1600, "height": 900})
    page.evaluate("""async () => {
        const pattern = app.graph.nodes.find((n) => n.comfyClass === "StreamVAETestPattern");
        for (const [name, value] of [["width", 96], ["height", 64], ["frames", 9]])
            pattern.widgets.find((w) => w.name === name).value = value;
        app.canvas.ds.scale = 0.8;  // the whole graph, clear of the menus and the minimap
        app.canvas.ds.offset = [110, 150];
        await app.queuePrompt(0, 1);
    }""")
    page.page.wait_for_function("""() => {
        const preview = app.graph.nodes.find((n) => n.comfyClass === "PreviewImage");
        const decode = app.graph.nodes.find((n) => n.comfyClass === "StreamVAEDecode");
        return preview?.imgs?.length > 0 && (decode.streamvaeRun || "").startsWith("last run");
    }""", timeout=180_000)
    page.page.wait_for_timeout(500)
    page.evaluate("() => app.graph.setDirtyCanvas(true, true)")
    # Where each node is on the page: (class, left, top incl. title, right, bottom) in CSS pixels.
    boxes = page.evaluate("""() => {
        const rect = app.canvas.canvas.getBoundingClientRect(), ds = app.canvas.ds, title = LiteGraph.NODE_TITLE_HEIGHT;
        const at = (x, y) => [rect.left + (x + ds.offset[0]) * ds.scale, rect.top + (y + ds.offset[1]) * ds.scale];
        return app.graph.nodes.map((n) => [n.comfyClass, ...at(n.pos[0], n.pos[1] - title),
                                           ...at(n.pos[0] + n.size[0], n.pos[1] + n.size[1])]);
    }""")
    try:
        shot = page.screenshot(tmp_path / "nodes.png")
    finally:
        page.page.set_viewport_size({"width": 1280, "height": 800})
    image = Image.open(shot).convert("HSV")
    assert image.size == (1600, 900)
    for cls, left, top, right, bottom in boxes:  # the whole graph is in the picture
        assert 0 <= left < right <= 1600 and 0 <= top < bottom <= 900, (cls, left, top, right, bottom)
    # The preview shows the decoded frame (the tiny model's colour noise), not an empty node: the
    # nodes are grey, so its mean saturation is far above theirs (measured 39 against 1-1.3).
    saturation = {cls: ImageStat.Stat(image.crop((int(l), int(t), int(r), int(b)))).mean[1] for cls, l, t, r, b in boxes}
    grey = max(value for cls, value in saturation.items() if (cls or "").startswith("StreamVAE"))
    assert saturation["PreviewImage"] > 10 * grey, saturation
    if os.environ.get("STREAMVAE_UPDATE_SCREENSHOT") == "1" or not SCREENSHOT.exists():
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)
