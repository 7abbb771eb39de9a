"""Bad setups and inputs, rounds two and three, as ComfyUI users meet them, through the session's real
server (both trees): the web extension's routes answer 4xx with the nodes' message, never 500, a flood
of them off the event loop, and a foreign page not at all; a checkpoint replaced under its name is loaded
again, and one written over while it decodes leaves the server and its queue; the rules across several
inputs, and budgets below what a run needs, fail when the node starts, in the node's words; so do
Multi-GPU devices the machine or the frame cannot take, before a worker starts; a run's warnings are in
its report once; damaged weights, an image model's latent and a cut-off video are named. Queue-time
errors on their widget alone: test_nodes_server.py; library-level counterparts: test_bad_inputs.py,
test_bad_files.py, test_bad_videos.py.
"""
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from safetensors.torch import save, save_file

import vae
from reference import load_tiny, tensors
from test_bad_inputs_server import decode_prompt, encode_prompt, execution_error, latent_file, random_latent, rejection
from test_bad_videos import write_clip
from test_nodes_server import as_uint8, assert_images_close, node, object_info, saved_images, vae_file  # noqa: F401

pytestmark = pytest.mark.comfy  # runs a real ComfyUI: CI's second lane (.ci/run)


@pytest.fixture(scope="module")
def vae_folder(comfy_server):
    """models/vae with this module's files added (names sort after the fixtures); removed afterwards."""
    folder = comfy_server.base / "models" / "vae"
    save_file(dict(tensors("seedvr2", "tiny_vae.safetensors")), str(folder / "zz_setup_seedvr2_no_groups.safetensors"))
    damaged = {k: v.clone() for k, v in tensors("wan21", "tiny_vae.safetensors").items()}
    damaged["decoder.head.2.weight"].view(-1)[0] = float("nan")
    save_file(damaged, str(folder / "zz_setup_nan_weight.safetensors"))
    yield folder
    for path in folder.glob("zz_setup_*"):
        path.unlink()


def route(client, path: str, **params) -> requests.Response:
    return requests.get(client.url + "/api/streamvae/" + path, params=params, timeout=30)


def test_routes_answer_a_bad_checkpoint_or_value_with_4xx_and_the_nodes_message(vae_folder, comfy_client, object_info):
    """A SeedVR2 file whose group count its shapes cannot tell answered HTTP 500 with a traceback, while a
    prompt refused it cleanly; now both give the same message, which says how to fix the file."""
    response = route(comfy_client, "checkpoint", vae_name="zz_setup_seedvr2_no_groups.safetensors")
    assert response.status_code == 400, response.text
    message = response.json()["error"]
    assert "not divisible by 32 GroupNorm groups" in message and "fixed.safetensors" in message, message
    assert message in rejection(comfy_client, decode_prompt(object_info, "zz_setup_seedvr2_no_groups.safetensors"), "2")
    response = route(comfy_client, "plan", vae_name=vae_file("wan21"), memory_budget_gb="abc")
    assert response.status_code == 400 and response.json()["error"] == "memory_budget_gb must be a number"


def test_a_checkpoint_replaced_under_its_name_is_loaded_again(vae_folder, comfy_server, comfy_client, object_info):
    """Wan2.1 weights, then SeedVR2's under the same name (both 16 latent channels): the look-up and the
    run both see the new file (its size and modification time), not the model loaded before."""
    path = vae_folder / "zz_setup_swapped.safetensors"
    shutil.copyfile(vae_folder / vae_file("wan21"), path)
    z = random_latent((1, 16, 2, 4, 4), seed=41)
    samples = node(object_info, "LoadLatent", latent=latent_file(comfy_server, "swapped.latent", z))
    prompt = decode_prompt(object_info, path.name, samples)
    first = comfy_client.run(prompt, timeout=120)
    assert route(comfy_client, "checkpoint", vae_name=path.name).json()["family"] == "wan21"
    assert_images_close(saved_images(comfy_client, first, "4"), as_uint8(vae.decode(load_tiny("wan21"), z)))

    vae.save_checkpoint(dict(tensors("seedvr2", "tiny_vae.safetensors")), path, config={"norm_num_groups": 8})
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # a clearly later mtime
    assert route(comfy_client, "checkpoint", vae_name=path.name).json()["family"] == "seedvr2"
    second = comfy_client.run(prompt, timeout=120)
    assert second["outputs"]["2"]["streamvae_model"][0]["family"] == "seedvr2"
    seedvr2 = load_tiny("seedvr2")
    assert_images_close(saved_images(comfy_client, second, "4"),
                        as_uint8(vae.decode(seedvr2, seedvr2.from_comfy_latent(z))))


@pytest.mark.parametrize("case, node_type, says", [
    ("fast_overlap", "StreamVAEDecode", "must be smaller than tile_size 64 (and not negative) with fast tiling"),
    ("batch_size", "StreamVAEEncode", "use 5 or 9"),
    ("tiny_budget", "StreamVAEDecode", "set memory_budget_gb to at least"),
    ("image_latent", "StreamVAEDecode", "an image model's latent (SD 1.x / SD 2.x / SDXL)"),
    ("nan_weight", "StreamVAELoader", "NaN/Inf weights: decoder.head.2.weight (1 of"),
])
def test_what_only_a_run_can_check_fails_at_its_start_in_the_nodes_words(case, node_type, says, vae_folder, comfy_server,
                                                                          comfy_client, object_info):
    """Rules across inputs (fast tiles' overlap, 4n+1 clips), a budget below the run's floor (1e-12 GiB
    passed the queue and then failed with "positive number of bytes, got 0"), an SD latent, a NaN weight."""
    if case == "batch_size":
        prompt = encode_prompt(object_info)
        prompt["3"]["inputs"]["batch_size"] = 8
    elif case == "image_latent":
        samples = node(object_info, "LoadLatent", latent=latent_file(comfy_server, "sd.latent", torch.zeros(1, 4, 8, 8)))
        prompt = decode_prompt(object_info, vae_file("wan21"), samples)
    else:
        settings = {"fast_overlap": dict(tile_size=64, tile_overlap=64, tiling="fast"),
                    "tiny_budget": dict(memory_budget_gb=1e-12)}.get(case, {})
        name = "zz_setup_nan_weight.safetensors" if case == "nan_weight" else vae_file("wan21")
        prompt = decode_prompt(object_info, name, **settings)
    error = execution_error(comfy_client, prompt)
    assert error["node_type"] == node_type and says in error["exception_message"], error["exception_message"]
    if case == "tiny_budget":
        assert "or 0 for automatic" in error["exception_message"] and "bytes" not in error["exception_message"]


def test_small_exact_tiles_run_with_the_default_overlap(comfy_client, object_info):
    """tile_size 16 at the default tile_overlap 64: exact tiles do not use the overlap (it was refused)."""
    z_prompt = decode_prompt(object_info, vae_file("wan21"), tile_size=16)
    entry = comfy_client.run(z_prompt, timeout=120)
    plan = entry["outputs"]["3"]["streamvae_run"][0]["plan"]
    assert plan["tile_size"] == [16, 16] and plan["grid"][:2] == [2, 2], plan
    assert saved_images(comfy_client, entry, "4").shape == (5, 32, 32, 3)


def test_a_runs_warnings_are_in_its_report_once(comfy_server, comfy_client, object_info):
    """nonfinite = zero warns: in the node's run notes once, in the server log once (the library's log
    record; not again as a Python warning attributed to whatever called the engine)."""
    z = random_latent((1, 16, 3, 4, 4), seed=43)
    z[:, 2, 1] = float("nan")
    samples = node(object_info, "LoadLatent", latent=latent_file(comfy_server, "nan_zero.latent", z))
    log_before = len(comfy_server.log)
    entry = comfy_client.run(decode_prompt(object_info, vae_file("wan21"), samples, nonfinite="zero"), timeout=120)
    said = "latent frame(s) [1] have NaN/Inf values; decoding with them set to 0"
    notes = entry["outputs"]["3"]["streamvae_run"][0]["notes"]
    assert notes.count(said) == 1, notes
    log = comfy_server.log[log_before:]
    assert log.count(said) == 1 and "RuntimeWarning" not in log, log[-2000:]
    assert_images_close(saved_images(comfy_client, entry, "4"),
                        as_uint8(vae.decode(load_tiny("wan21"), z.nan_to_num(0, 0, 0))))


# -- round three: files replaced or cut, the routes flooded, Multi-GPU beyond the machine ----------------------


def test_a_checkpoint_written_over_while_it_decodes_leaves_the_server_and_its_queue(comfy_server, comfy_client,
                                                                                    object_info):
    """A Wan2.1 file (float32, the compute dtype) in models/checkpoints, written over in place by a shorter
    file (other weights, in float16) while a decode runs with it: the loaded weights were views of the
    mapped file, so the decode died with SIGBUS and took the server and its queue along (exit code 135).
    Now the run ends with the weights it loaded, and the prompt queued meanwhile loads the new file (the
    fingerprint ignored models/checkpoints)."""
    folder = comfy_server.base / "models" / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "zz_setup_written_over.safetensors"
    shutil.copyfile(comfy_server.base / "models" / "vae" / vae_file("wan21"), path)
    halved = {k: (v * 0.5).half() for k, v in tensors("wan21", "tiny_vae.safetensors").items()}
    replacement = save({k: v.contiguous() for k, v in halved.items()})
    assert len(replacement) < path.stat().st_size / 1.5
    z = random_latent((1, 16, 6, 4, 4), seed=45)
    samples = node(object_info, "LoadLatent", latent=latent_file(comfy_server, "written_over.latent", z))
    prompt = decode_prompt(object_info, path.name, samples, temporal_chunk=1)
    first = comfy_client.queue(prompt)
    comfy_client.wait_for(first, lambda m: m["type"] == "progress" and m["data"]["node"] == "3", timeout=120)
    with open(path, "r+b") as file:  # the same inode, shorter: the pages of the weights loaded before are gone
        file.truncate(0)
        file.write(replacement)
    second = comfy_client.queue(prompt)
    entries = []
    for prompt_id in (first, second):
        comfy_client.wait(prompt_id, timeout=180)
        entries.append(comfy_client.history(prompt_id))
        assert entries[-1]["status"]["status_str"] == "success", entries[-1]["status"]
    assert_images_close(saved_images(comfy_client, entries[0], "4"), as_uint8(vae.decode(load_tiny("wan21"), z)))
    assert_images_close(saved_images(comfy_client, entries[1], "4"), as_uint8(vae.decode(vae.load(halved), z)))
    path.unlink()


def test_the_plan_route_answers_while_a_flood_is_refused_off_the_event_loop(comfy_client):
    """Ten requests at once, seven beyond any card (2^20 px a side and frames, 16 px tiles) and three at the
    nodes' largest clip, planned with the memory they would have: planned on the server's event loop,
    such requests stalled /system_stats for 26 s. Now each is refused (400: beyond the bounds; 503: busy)
    or planned off the loop, one at a time; the server answers meanwhile, and a clip of a real size is
    planned in under a second afterwards. A foreign page's request is refused (403)."""
    hostile = [dict(width=2**20, height=2**20, frames=2**20, tile_size=16)] * 7 + \
        [dict(width=16384, height=16384, frames=16385)] * 3
    waits, done = [], threading.Event()

    def watch():  # at least three answers, however fast the flood is refused
        while not done.is_set() or len(waits) < 3:
            started = time.perf_counter()
            requests.get(comfy_client.url + "/system_stats", timeout=60).raise_for_status()
            waits.append(time.perf_counter() - started)
            time.sleep(0.05)

    with ThreadPoolExecutor(len(hostile) + 1) as pool:
        watcher = pool.submit(watch)
        answers = list(pool.map(lambda query: route(comfy_client, "plan", vae_name=vae_file("wan21"), **query), hostile))
        done.set()
        watcher.result()
    assert len(waits) > 2 and max(waits) < 1, waits
    assert all(a.status_code in (400, 503) for a in answers[:7]), [a.text for a in answers]
    assert "width must be between 1 and 16384" in next(a.text for a in answers if a.status_code == 400)
    assert all(a.status_code in (200, 503) for a in answers[7:]), [a.text for a in answers]
    started = time.perf_counter()
    answer = route(comfy_client, "plan", vae_name=vae_file("wan21"), width=512, height=512, frames=81)
    assert answer.status_code == 200 and time.perf_counter() - started < 1, answer.text
    foreign = requests.get(comfy_client.url + "/api/streamvae/plan", params={"vae_name": vae_file("wan21")},
                           headers={"Sec-Fetch-Site": "cross-site"}, timeout=30)
    assert foreign.status_code == 403


def test_multi_gpu_refuses_what_cannot_run_before_a_worker_starts(comfy_server, comfy_client, object_info):
    """"cpu" six times on a two-core machine started six torch processes and failed after 49 s ("cannot
    split 4 latent rows over 6 ranks"). More CPU ranks than cores are refused when queued; a frame of
    fewer latent rows than ranks when the run starts, before any worker."""
    cores = len(os.sched_getaffinity(0))  # the server's, a process on this machine
    prompt = decode_prompt(object_info, vae_file("seedvr2"))
    prompt["m"] = node(object_info, "StreamVAEMultiDevice", devices=", ".join(["cpu"] * (cores + 1)))
    prompt["2"]["inputs"]["devices"] = ["m", 0]
    assert f"{cores + 1} CPU workers, but this machine has {cores} CPU core" in rejection(comfy_client, prompt, "m")
    prompt["m"]["inputs"]["devices"] = "cpu, cpu"
    prompt["1"] = node(object_info, "LoadLatent", latent=latent_file(comfy_server, "one_row.latent",
                                                                      random_latent((1, 16, 2, 1, 4), seed=47)))
    message = execution_error(comfy_client, prompt)["exception_message"]
    assert "this frame is 1 latent row tall, too short to split over 2 devices" in message, message
    assert "worker processes were stopped" not in message  # none had started


def test_a_cut_off_video_through_load_video_is_refused_naming_both_counts(comfy_server, comfy_client, object_info):
    """Load Video -> Encode from Video encoded the frames before the cut without a word."""
    path = comfy_server.base / "input" / "zz_setup_cut.mkv"
    write_clip(path)
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    prompt = {"1": node(object_info, "LoadVideo", file=path.name),
              "2": node(object_info, "StreamVAELoader", vae_name=vae_file("wan21")),
              "3": node(object_info, "StreamVAEEncodeFromVideo", vae=["2", 0], video=["1", 0]),
              "4": node(object_info, "SaveLatent", samples=["3", 0], filename_prefix="cut")}
    error = execution_error(comfy_client, prompt)
    assert error["node_type"] == "StreamVAEEncodeFromVideo", error
    assert "is cut off: its container states 9 frames, but only" in error["exception_message"], error
