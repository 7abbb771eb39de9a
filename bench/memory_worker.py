"""One peak-memory measurement in a fresh process (used by calibrate_memory.py and the tests).

    python -m bench.memory_worker '{"family": "seedvr2", "op": "decode", "frames": 5, "height": 64, ...}'

A warm-up on a tiny input first fills what persists between calls (the CPU Winograd filter cache), then,
with kernels chosen by measurement (spec "kernel_choice", default "measure" as a user runs), the measured
call runs once untimed so that each layer shape's one-time kernel timing is not part of the measured peak.
Prints one JSON line: retained_bytes (what the warm-up left resident), activation_bytes (peak during
the measured op minus what was resident just before it), peak_bytes (peak minus the process's
footprint before the model existed) and predicted_bytes (the peak of `vae.plan` for the same
settings, if calibrated). `measure` does the same for a model already built (the CUDA calibration
measures every point in one process: the allocator's statistics are exact there).
"""
import ctypes
import dataclasses
import json
import math
import sys
import time

import torch

import vae

from bench import models
from bench.common import dump_stacks_when_asked, peak_rss_bytes, reset_peak_rss, rss_bytes
from vae.kernels.backend import DTYPES
from vae.kernels.conv import WINOGRAD_MIN_FRAME_PIXELS


def fixed_mmap_threshold(threshold: int = 1 << 16) -> None:
    """glibc: serve every allocation >= 64 KiB with mmap and give it back on free (no dynamic
    threshold), so peak RSS follows the peak of live tensors instead of what malloc kept around."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def run(spec: dict) -> dict:
    """Build the family's full config in float32 (or spec["dtype"]) on spec["device"], then `measure`.
    With spec["drop_other_half"] the weights of the half the op does not run are dropped first
    (`models.drop_other_half`): a calibration of activations needs only the half that runs."""
    device = torch.device(spec.get("device", "cpu"))
    measure_now = (lambda: torch.cuda.memory_allocated(device)) if device.type == "cuda" else rss_bytes
    start = measure_now()
    model = models.build(spec["family"], DTYPES[spec.get("dtype", "fp32")], device)
    if spec.get("drop_other_half"):
        models.drop_other_half(model, spec["op"])
    result = measure(model, spec)
    result["peak_bytes"] += result.pop("base_bytes") - start
    return result


def measure(model, spec: dict) -> dict:
    """One encode/decode of `model` (on its device) as `spec` says, after a warm-up; returns
    activation_bytes (peak during the op minus what was resident just before it: live tensors on
    the CPU, the caching allocator's reserved memory on CUDA, which includes cuDNN workspaces and
    fragmentation), retained_bytes, peak_bytes (from base_bytes, what was resident before the input
    was made), predicted_bytes (the plan's, if calibrated), the plan in words, its temporal_chunk (latent
    frames; the whole clip where the family sees it whole) and the op's seconds.

    With spec["memory_budget"] (bytes) the planner picks the settings within it (on CUDA the process
    is also limited to it: `torch.cuda.set_per_process_memory_fraction`, a card of that size); with
    spec["kept_stage_bytes"] the plan's (`vae.run.clip_statistics`: 0 measures a chunk's peak alone); with
    spec["compare_untiled"] the output is compared with the untiled op's afterwards (max_err)."""
    device = model.device
    cuda = device.type == "cuda"
    opts = vae.Optimizations(kernel_choice=spec.get("kernel_choice", "measure"))
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    measure_now = (lambda: torch.cuda.memory_reserved(device)) if cuda else rss_bytes
    base = measure_now()
    x = models.make_input(model.family, spec).to(device)
    if spec["op"] == "encode":
        x = x.to(model.encode_dtype)
    settings = dict(temporal_chunk=spec.get("temporal_chunk"), tile_size=spec.get("tile_size"),
                    tiling=spec.get("tiling", "exact"), tile_overlap=spec.get("tile_overlap", 0),
                    cache_offload=spec.get("cache_offload", "none"), stream_frames=spec.get("stream_frames", False),
                    memory_budget=spec.get("memory_budget"))
    if settings["memory_budget"] is not None:  # the planner decides: the settings above become upper limits
        settings.update(cache_offload=spec.get("cache_offload", "auto"), stream_frames=spec.get("stream_frames"))
        if cuda:
            torch.cuda.set_per_process_memory_fraction(
                min(1.0, settings["memory_budget"] / torch.cuda.get_device_properties(device).total_memory), device)
    plan = models.plan(model, spec["op"], tuple(x.shape), settings, opts)
    if "kept_stage_bytes" in spec:  # the stage inputs statistics passes keep (host memory on a GPU): not a chunk's
        plan = dataclasses.replace(plan, kept_stage_bytes=spec["kept_stage_bytes"])
    phases = Phases(device)
    phases.say(f"{spec['family']} {spec['op']} {tuple(x.shape)}: {plan.describe()}")
    io = {}
    if spec["op"] == "decode":
        of = model.spatial_factor * model.decode_upscale
        io["out"] = torch.zeros((x.shape[0], model.out_channels, (x.shape[2] - 1) * model.temporal_factor + 1,
                                 x.shape[3] * of, x.shape[4] * of), device=device)
    # Warm up on the smallest latent whose frames every layer runs by Winograd (8x8 cells: 64 pixels, the
    # dispatch's floor): fills what persists between calls (the Winograd filter cache). With kernels
    # chosen by measurement, the measured call once more: each new layer shape is timed on its first use
    # (kernel_choice.py), which belongs to the warm-up, not to the steady-state peak being measured.
    before_warmup = measure_now()
    cells = math.isqrt(WINOGRAD_MIN_FRAME_PIXELS - 1) + 1
    warm = models.make_input(model.family, dict(spec, height=cells * model.spatial_factor,
                                                width=cells * model.spatial_factor)).to(device)
    models.run(model, spec["op"], warm.to(model.encode_dtype) if spec["op"] == "encode" else warm, dict(temporal_chunk=1), opts)
    phases.done("warm-up")
    if opts.kernel_choice == "measure":
        models.run(model, spec["op"], x, plan, opts, **io)
        phases.done("run that measures the kernels")
    del warm
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_peak_rss()
    retained = measure_now() - before_warmup
    before = measure_now()
    start = time.perf_counter()
    got = models.run(model, spec["op"], x, plan, opts, **io)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    phases.done("timed run")
    peak = torch.cuda.max_memory_reserved(device) if cuda else peak_rss_bytes()
    # the prediction after the run: the kernels it measured are on record (memory.resident_cache_bytes)
    predicted = models.plan(model, spec["op"], tuple(x.shape), settings, opts).peak_bytes
    result = {"activation_bytes": peak - before, "retained_bytes": retained, "peak_bytes": peak - base,
              "base_bytes": base, "predicted_bytes": predicted, "plan": plan.describe(), "temporal_chunk": plan.temporal_chunk,
              "fits": plan.fits, "seconds": round(seconds, 3)}
    if spec.get("compare_untiled"):
        if cuda:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        # untiled, one latent frame per chunk: as exact as one chunk (causal chunks: tests/test_engine.py), and
        # on a GPU it fits where the whole clip at once would not (SeedVR2 1080p: 49 GiB, several times that)
        whole = models.run(model, spec["op"], x, dict(temporal_chunk=1), opts)
        result["max_err"] = float((got.float() - whole.float()).abs().max())
        result["max_abs"] = float(whole.float().abs().max())
        phases.done("untiled comparison")
    result["phase_seconds"] = phases.seconds
    return result


class Phases:
    """Seconds of each phase of a measurement, said on stderr as each ends: where a slow run spends its
    time shows in the log even when the run is stopped before its result."""

    def __init__(self, device: torch.device):
        self.device, self.seconds, self.start = device, {}, time.perf_counter()

    def say(self, text: str) -> None:
        print(f"[memory_worker] {text}", file=sys.stderr, flush=True)

    def done(self, name: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.seconds[name] = round(now - self.start, 3)
        self.say(f"{name}: {now - self.start:.1f} s")
        self.start = now


if __name__ == "__main__":
    dump_stacks_when_asked()
    fixed_mmap_threshold()
    print(json.dumps(run(json.loads(sys.argv[1]))))
