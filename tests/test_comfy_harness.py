"""Proof that the harness drives a real ComfyUI server and frontend, using core ComfyUI nodes only."""

import io

import pytest
from PIL import Image

from comfy_support.client import PromptFailed, PromptRejected
from comfy_support.environment import FIXTURE_VAES

pytestmark = pytest.mark.comfy  # runs a real ComfyUI: CI's second lane (.ci/run)

RED = 0xFF0000


def scale_prompt(width=64, height=32, scaled=(96, 48), prefix="harness"):
    """EmptyImage (solid red) -> ImageScale -> SaveImage, in API format."""
    return {
        "1": {"class_type": "EmptyImage",
              "inputs": {"width": width, "height": height, "batch_size": 1, "color": RED}},
        "2": {"class_type": "ImageScale",
              "inputs": {"image": ["1", 0], "upscale_method": "nearest-exact",
                         "width": scaled[0], "height": scaled[1], "crop": "disabled"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": prefix}},
    }


def blur_chain(blurs, size=256, first_sigma=2.0):
    """EmptyImage -> `blurs` x ImageBlur -> PreviewImage: a few seconds of CPU work without weights.

    Node ids are "1" (EmptyImage), "2".."blurs+1" (blurs) and "blurs+2" (PreviewImage); distinct
    sigmas keep ComfyUI's cache from skipping the work.
    """
    prompt = {"1": {"class_type": "EmptyImage",
                    "inputs": {"width": size, "height": size, "batch_size": 1, "color": RED}}}
    for i in range(2, blurs + 2):
        prompt[str(i)] = {"class_type": "ImageBlur",
                          "inputs": {"image": [str(i - 1), 0], "blur_radius": 31, "sigma": first_sigma + i}}
    prompt[str(blurs + 2)] = {"class_type": "PreviewImage", "inputs": {"images": [str(blurs + 1), 0]}}
    return prompt


def ui_workflow():
    """The same graph as `scale_prompt()` in the frontend's UI format (version 0.4: widgets_values in widget
    order, links [id, source, slot, target, slot, type])."""
    def node(id, type, order, pos, widgets, inputs=(), outputs=()):
        return {"id": id, "type": type, "pos": [pos, 100], "size": [300, 130], "flags": {}, "order": order,
                "mode": 0, "properties": {"Node name for S&R": type}, "widgets_values": widgets,
                "inputs": list(inputs), "outputs": list(outputs)}

    return {
        "last_node_id": 3, "last_link_id": 2, "version": 0.4,
        "links": [[1, 1, 0, 2, 0, "IMAGE"], [2, 2, 0, 3, 0, "IMAGE"]],
        "nodes": [
            node(1, "EmptyImage", 0, 0, [64, 32, 1, RED],
                 outputs=[{"name": "IMAGE", "type": "IMAGE", "links": [1], "slot_index": 0}]),
            node(2, "ImageScale", 1, 350, ["nearest-exact", 96, 48, "disabled"],
                 inputs=[{"name": "image", "type": "IMAGE", "link": 1}],
                 outputs=[{"name": "IMAGE", "type": "IMAGE", "links": [2], "slot_index": 0}]),
            node(3, "SaveImage", 2, 700, ["harness_ui"],
                 inputs=[{"name": "images", "type": "IMAGE", "link": 2}]),
        ],
    }


def without_meta(prompt):
    """An API prompt without the `_meta` titles, for comparing graphs."""
    return {id: {k: v for k, v in node.items() if k != "_meta"} for id, node in prompt.items()}


def saved_image(client, entry, node_id="3"):
    """The first image an output node saved, opened with PIL."""
    ref = entry["outputs"][node_id]["images"][0]
    return Image.open(io.BytesIO(client.view(ref["filename"], ref["subfolder"], ref["type"])))


# -- server --------------------------------------------------------------------------------------


@pytest.mark.comfy
def test_object_info_lists_core_nodes_and_fixture_vaes(comfy_client):
    info = comfy_client.object_info()
    assert {"EmptyImage", "ImageScale", "SaveImage", "VAELoader", "VAEDecodeTiled"} <= info.keys()
    assert comfy_client.object_info("EmptyImage")["output"] == ["IMAGE"]
    vae_names = comfy_client.object_info("VAELoader")["input"]["required"]["vae_name"][0]
    assert set(FIXTURE_VAES) <= set(vae_names)


@pytest.mark.comfy
def test_prompt_runs_end_to_end(comfy_client):
    entry = comfy_client.run(scale_prompt(), timeout=60)

    assert entry["status"]["status_str"] == "success"
    image = saved_image(comfy_client, entry)
    assert image.size == (96, 48)
    assert image.convert("RGB").getpixel((10, 10)) == (255, 0, 0)
    seen = comfy_client.events(entry["prompt_id"]).types
    assert {"execution_start", "executing", "progress_state", "executed", "execution_success"} <= set(seen)
    assert seen[-1] == "executing"  # with node null: the end of the prompt


@pytest.mark.comfy
def test_invalid_prompt_returns_validation_error(comfy_client):
    with pytest.raises(PromptRejected) as rejected:
        comfy_client.queue(scale_prompt(width=20000))

    assert rejected.value.error["type"] == "prompt_outputs_failed_validation"
    errors = [e for node in rejected.value.node_errors.values() for e in node["errors"]]
    assert any(e["type"] == "value_bigger_than_max" and e["extra_info"]["input_name"] == "width"
               for e in errors), rejected.value.node_errors


@pytest.mark.comfy
def test_uploaded_image_is_loadable(comfy_client):
    png = io.BytesIO()
    Image.new("RGB", (20, 10), (0, 0, 255)).save(png, format="PNG")
    ref = comfy_client.upload_image(png.getvalue(), "harness_upload.png")

    entry = comfy_client.run({
        "1": {"class_type": "LoadImage", "inputs": {"image": ref["name"]}},
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }, timeout=60)
    image = saved_image(comfy_client, entry, node_id="2")
    assert image.size == (20, 10)
    assert entry["outputs"]["2"]["images"][0]["type"] == "temp"


@pytest.mark.comfy
def test_interrupt_stops_a_running_prompt(comfy_client):
    prompt = blur_chain(blurs=5)
    prompt_id = comfy_client.queue(prompt)
    # Core nodes have no progress bar, so interrupt while the first blur runs; ComfyUI checks the flag
    # at the next node boundary (our nodes will check it at every tile).
    comfy_client.wait_for(prompt_id, lambda m: m["type"] == "executing" and m["data"]["node"] == "2")
    comfy_client.interrupt(prompt_id)
    comfy_client.wait(prompt_id, timeout=60)

    entry = comfy_client.history(prompt_id)
    assert entry["status"]["status_str"] == "error"
    interrupted = [data for kind, data in entry["status"]["messages"] if kind == "execution_interrupted"]
    assert len(interrupted) == 1 and interrupted[0]["node_type"] == "ImageBlur", entry["status"]
    assert not entry["outputs"]  # the PreviewImage at the end never ran
    assert "execution_interrupted" in str(PromptFailed(entry))  # what `run(check=True)` would raise


@pytest.mark.comfy
def test_idle_interrupt_does_not_poison_the_next_prompt(comfy_client):
    comfy_client.interrupt()  # nothing runs: ComfyUI sets its flag and clears it when a prompt starts
    entry = comfy_client.run(scale_prompt(prefix="after_interrupt"), timeout=60)
    assert entry["status"]["status_str"] == "success"


@pytest.mark.comfy
def test_pack_is_imported(comfy_server):
    """ComfyUI found custom_nodes/StreamVAE (our symlink) and imported it without error."""
    assert comfy_server.pack_import_line() is not None, comfy_server.log_tail()
    comfy_server.assert_pack_imported()


# -- frontend ------------------------------------------------------------------------------------


@pytest.mark.browser
def test_frontend_converts_ui_workflow_to_the_api_prompt(comfy_browser, comfy_client):
    workflow = ui_workflow()
    comfy_browser.load_workflow(workflow).assert_clean()

    prompt = comfy_browser.graph_to_prompt()
    expected = scale_prompt(prefix="harness_ui")
    assert without_meta(prompt) == expected

    extra = {"extra_pnginfo": {"workflow": comfy_browser.graph_to_workflow()}}
    prompt_id = comfy_client.queue(prompt, extra_data=extra)
    comfy_client.wait(prompt_id, timeout=60)
    entry = comfy_client.history(prompt_id)
    assert entry["status"]["status_str"] == "success"
    image = saved_image(comfy_client, entry)
    assert image.size == (96, 48)
    assert "workflow" in image.info  # SaveImage embedded the UI workflow, as for a frontend run


@pytest.mark.browser
def test_frontend_reports_missing_node_types(comfy_browser, tmp_path):
    workflow = ui_workflow()
    workflow["nodes"][1]["type"] = "StreamVAENoSuchNode"
    report = comfy_browser.load_workflow(workflow)

    assert report.missing_node_types == ["StreamVAENoSuchNode"]
    # 1.32.9: "This workflow has missing nodes" dialog; 1.48.7: "Missing node: StreamVAENoSuchNode" panel.
    assert any("missing node" in dialog.lower() for dialog in report.dialogs), report.dialogs
    with pytest.raises(AssertionError, match="StreamVAENoSuchNode"):
        report.assert_clean()
    assert comfy_browser.screenshot(tmp_path / "missing.png").stat().st_size > 0
    comfy_browser.close_dialogs()
    assert not comfy_browser.open_dialogs()
    assert comfy_browser.log.blocked_requests  # the page tried to go online and was stopped


@pytest.mark.browser
def test_frontend_reports_schema_errors(comfy_browser):
    workflow = ui_workflow()
    workflow["definitions"] = None  # e.g. a workflow saved with nulls where the schema wants an object
    report = comfy_browser.load_workflow(workflow)

    assert any("zod schema" in toast for toast in report.toasts), report.toasts
    assert any(problem.startswith("notification:") for problem in report.problems)
    assert not comfy_browser.load_workflow(ui_workflow()).toasts  # the old notification is not reported again


@pytest.mark.browser
def test_frontend_reports_wrong_widget_values(comfy_browser):
    workflow = ui_workflow()
    workflow["nodes"][0]["widgets_values"] = [64]  # width only: the frontend fills in defaults
    report = comfy_browser.load_workflow(workflow)

    assert report.widget_mismatches == ["1 EmptyImage: [64] loaded as [64, 512, 1, 0]"]
    assert not report.missing_node_types and not report.dialogs
