"""Soak run (not part of CI): many mixed StreamVAE prompts of random small sizes through a real ComfyUI
server, with interrupts and injected out-of-memory errors sprinkled in.

    PYTHONPATH=tests .venv/bin/python -m bench.soak [--prompts 200] [--seed 0] [--timeout 180]

Needs what the server tests need (.ci/setup: ComfyUI in .cache/ComfyUI, the shared tiny checkpoints), and
their harness: the tests' folder on the import path, as pytest puts it there (tests/conftest.py).
Each prompt is an encode (IMAGE -> SaveLatent), a decode (LoadLatent -> PreviewImage) or a round trip,
on a random family, clip (1-9 frames, 16-96 px, any size) and tiling (untiled / 64 px exact / fast,
any temporal chunk). One prompt in eight is interrupted after its first progress step and one in eight
gets out-of-memory errors injected in the middle (tests/comfy_support/faults.py, via STREAMVAE_FAULTS; usually one,
which the engine recovers from, sometimes endless, which must end in a clear error). Checks:
- every successful output has the right frame count and matches the library's direct output (latents
  to 1e-4, images to one 8-bit level);
- a failed prompt failed for the reason we caused (interrupt, or out of memory at the smallest
  setting with the message saying what was tried), never anything else;
- no prompt hangs (each must end within --timeout seconds);
- afterwards (models unloaded, caches freed) the server's resident memory is within 5% of what it
  was after a warm-up (--warmup prompts of the same random mix, same settling).
Prints the counts; exits 1 if any check failed.
"""
import argparse
import io
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

from bench import models

try:  # the tests' ComfyUI harness, imported as pytest imports it (top-level names from tests/)
    from comfy_support.server import ComfyServer, build_base_directory, unlink_working_tree
    from reference import TINY_FAMILIES
    from test_bad_inputs_server import interrupt_at_first_step
    from test_nodes_server import as_uint8, node, saved_images, saved_latent, vae_file, video_of
except ModuleNotFoundError as error:
    raise SystemExit(f"bench.soak drives the tests' ComfyUI harness ({error}): run it from the repository root as "
                     "`PYTHONPATH=tests .venv/bin/python -m bench.soak`") from None

FAMILIES = TINY_FAMILIES  # the families whose tiny checkpoints the server has (comfy_support.environment.FIXTURE_VAES)
MEMORY_TOLERANCE = 0.05
FAULTS = [None, None, None, "interrupt", None, None, None, "oom"]  # one prompt in 8 each, in a fixed rhythm


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class Soak:
    def __init__(self, server: ComfyServer, rng: random.Random, timeout: float, fault_file: Path):
        self.server, self.rng, self.timeout, self.fault_file = server, rng, timeout, fault_file
        self.client = server.client()
        self.info = self.client.object_info()
        self.models = {f: models.build(f, torch.float32, tiny=True) for f in FAMILIES}
        self.counts: Counter = Counter()
        self.failures: list[str] = []
        self.serial = 0

    # -- inputs ----------------------------------------------------------------------------------
    def upload_clip(self, frames: np.ndarray) -> str:
        data = io.BytesIO()
        images = [Image.fromarray(f) for f in frames]
        images[0].save(data, format="PNG", save_all=True, append_images=images[1:], duration=40, loop=0)
        self.serial += 1
        return self.client.upload_image(data.getvalue(), f"soak_{self.serial}.png")["name"]

    def latent_file(self, z: torch.Tensor) -> str:
        self.serial += 1
        name = f"soak_{self.serial}.latent"
        save_file({"latent_tensor": z.contiguous(), "latent_format_version_0": torch.tensor([])},
                  str(self.server.base / "input" / name))
        return name

    def tiling(self) -> dict:
        kind = self.rng.choice(["untiled", "exact", "fast"])
        settings = {"temporal_chunk": self.rng.choice([0, 1, 2])}
        if kind != "untiled":
            settings.update(tile_size=64, tile_overlap=16, tiling=kind)
        return settings

    # -- one prompt ----------------------------------------------------------------------------------
    def make(self, kind: str, family: str):
        """(prompt, output node id, check(entry) -> None)."""
        model, settings = self.models[family], self.tiling()
        lib = {k: v for k, v in settings.items() if k in ("tile_size", "tile_overlap", "tiling")}
        lib = lib if lib.get("tiling") == "fast" else {}  # exact tiles and chunks equal the untiled result
        if kind == "decode":
            t, h, w = self.rng.randint(1, 3), self.rng.randint(2, 12), self.rng.randint(2, 12)
            z = torch.randn(1, model.latent_channels, t, h, w, generator=torch.Generator().manual_seed(self.rng.randrange(1 << 30)))
            prompt = {"1": node(self.info, "LoadLatent", latent=self.latent_file(z)),
                      "2": node(self.info, "StreamVAELoader", vae_name=vae_file(family)),
                      "3": node(self.info, "StreamVAEDecode", vae=["2", 0], samples=["1", 0], **settings),
                      "4": node(self.info, "PreviewImage", images=["3", 0])}
            expected = as_uint8(models.run(model, "decode", z, lib))
            return prompt, "3", lambda entry: self.compare_images(entry, "4", expected)
        frames = self.rng.randint(1, 9)
        height, width = self.rng.randint(16, 96), self.rng.randint(16, 96)
        clip = np.random.default_rng(self.rng.randrange(1 << 30)).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
        prompt = {"1": node(self.info, "LoadImage", image=self.upload_clip(clip)),
                  "2": node(self.info, "StreamVAELoader", vae_name=vae_file(family)),
                  "3": node(self.info, "StreamVAEEncode", vae=["2", 0], image=["1", 0], **settings)}
        z = models.run(model, "encode", video_of(clip), lib)
        if kind == "encode":
            prompt["4"] = node(self.info, "SaveLatent", samples=["3", 0], filename_prefix="soak")
            return prompt, "3", lambda entry: self.compare_latent(entry, "4", z)
        prompt["5"] = node(self.info, "StreamVAEDecode", vae=["2", 0], samples=["3", 0], **settings)
        prompt["6"] = node(self.info, "PreviewImage", images=["5", 0])
        expected = as_uint8(models.run(model, "decode", z, dict(lib, num_frames=frames, height=height, width=width)))
        return prompt, self.rng.choice(["3", "5"]), lambda entry: self.compare_images(entry, "6", expected)

    def compare_images(self, entry, node_id, expected):
        got = saved_images(self.client, entry, node_id)
        if got.shape != expected.shape:
            raise AssertionError(f"shape {got.shape}, expected {expected.shape} (frame count or size)")
        diff = int(np.abs(got.astype(int) - expected.astype(int)).max())
        if diff > 1:
            raise AssertionError(f"images differ from the library by {diff} levels")

    def compare_latent(self, entry, node_id, expected):
        got = saved_latent(self.server, entry, node_id)
        if got.shape != expected.shape:
            raise AssertionError(f"latent shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)

    def run_one(self, index: int, kind: str, family: str, fault: str | None) -> None:
        prompt, target, check = self.make(kind, family)
        op = "decode" if prompt[target]["class_type"] == "StreamVAEDecode" else "encode"
        if fault == "oom":
            self.fault_file.write_text(json.dumps({"op": op, "oom_at_call": self.rng.randint(1, 24),
                                                   "times": self.rng.choice([1, 1, 1, 3, 10**6])}))
        label = f"#{index} {kind} {family} {fault or ''}".strip()
        log_start = len(self.server.log)
        try:
            if fault == "interrupt":
                _, _, entry = interrupt_at_first_step(self.client, prompt, target, self.timeout)
            else:
                entry = self.client.run(prompt, timeout=self.timeout, check=False)
        except TimeoutError:
            self.counts["hung"] += 1
            self.failures.append(f"{label}: no answer within {self.timeout} s")
            self.client.interrupt()
            return
        finally:
            self.fault_file.unlink(missing_ok=True)  # not consumed (the op never ran): do not leak it
        status = entry["status"]["status_str"]
        messages = {kind_: data for kind_, data in entry["status"]["messages"]}
        if status == "success":
            try:
                check(entry)
            except AssertionError as error:
                self.failures.append(f"{label}: {error}")
                self.counts["wrong_output"] += 1
                return
            self.counts["success_checked"] += 1
            if fault == "oom" and "injected out-of-memory" not in self.server.log[log_start:]:
                fault = "oom_not_reached"  # the run had fewer module calls than oom_at_call
            self.counts[{"interrupt": "interrupt_too_late", "oom": "oom_recovered"}.get(fault, fault or "plain")] += 1
        elif "execution_interrupted" in messages and fault == "interrupt":
            self.counts["interrupted"] += 1
        elif "execution_error" in messages and fault == "oom" and \
                "even at the smallest setting" in messages["execution_error"]["exception_message"]:
            self.counts["oom_clear_error"] += 1
        else:
            self.counts["unexpected_failure"] += 1
            self.failures.append(f"{label}: {status} {json.dumps(messages)[:800]}")

    def settle(self) -> int:
        """Unload models, drop ComfyUI's caches, let its idle loop collect garbage; the server's RSS."""
        self.client.post("/free", {"unload_models": True, "free_memory": True})
        time.sleep(12)  # ComfyUI collects garbage at most every 10 s while idle
        return rss_bytes(self.server._process.pid)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20, help="random prompts before the memory baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds before a prompt counts as hung")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="streamvae-soak-"))
    fault_file = work / "faults.json"
    os.environ["STREAMVAE_FAULTS"] = str(fault_file)  # the server installs the tests' fault hook (tests/comfy_support/faults.py)
    server = ComfyServer(build_base_directory(work / "comfyui")).start()
    rng = random.Random(args.seed)
    started = time.monotonic()
    try:
        soak = Soak(server, rng, args.timeout, fault_file)
        for i, (kind, family) in enumerate((k, f) for k in ("encode", "decode", "roundtrip") for f in FAMILIES):
            soak.run_one(-i - 1, kind, family, None)  # warm-up: every model loaded, every path run once
        # More warm-up of the same random mix: first-time allocations (kernel and allocator caches for
        # new shapes, lazily imported modules) are not what the memory check is after.
        for i in range(args.warmup):
            soak.run_one(-100 - i, rng.choice(["encode", "decode", "roundtrip"]), rng.choice(FAMILIES), FAULTS[i % 8])
        baseline = soak.settle()
        soak.counts.clear()
        soak.failures.clear()
        for i in range(args.prompts):
            soak.run_one(i, rng.choice(["encode", "decode", "roundtrip"]), rng.choice(FAMILIES), FAULTS[i % 8])
            if (i + 1) % 20 == 0:
                rss = rss_bytes(server._process.pid) / 2**20
                print(f"  {i + 1}/{args.prompts} prompts, {time.monotonic() - started:.0f} s, RSS {rss:.0f} MiB, "
                      f"{dict(soak.counts)}", flush=True)
        final = soak.settle()
    finally:
        server.stop()
        unlink_working_tree(server.base)
    drift = final / baseline - 1
    counts = soak.counts
    print(f"\nsoak: {args.prompts} prompts (seed {args.seed}) in {time.monotonic() - started:.0f} s")
    for key in ("success_checked", "plain", "interrupted", "interrupt_too_late", "oom_recovered", "oom_not_reached",
                "oom_clear_error", "wrong_output", "unexpected_failure", "hung"):
        print(f"  {key:20s} {counts.get(key, 0)}")
    print(f"  server RSS after warm-up {baseline / 2**20:.0f} MiB, at the end {final / 2**20:.0f} MiB ({drift:+.1%})")
    for failure in soak.failures:
        print("  FAIL", failure)
    ok = not soak.failures and abs(drift) <= MEMORY_TOLERANCE
    print("soak: OK" if ok else "soak: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
