"""One measured benchmark variant, run in its own process by the bench scripts.

    python -m bench.worker '{"family": "seedvr2", "op": "decode", "frames": 9, "height": 256, ...}'

Builds the family's full released config with random weights, runs the op `repeats` times after a
warm-up, saves the output for error comparison and prints one JSON line: times, peak memory.
"""
import json
import sys

import torch
from safetensors.torch import save_file

from bench.common import DTYPES, build_random_model, median_time, peak_rss_bytes, reset_peak_rss, rss_bytes
from bench.families import FULL_CONFIGS, make_input
from optimizations import Optimizations


def options(spec: dict) -> Optimizations:
    path = spec.get("path", "optimized")
    if path == "optimized":
        return Optimizations()
    if path == "straightforward":
        return Optimizations.straightforward()
    return Optimizations().with_(**{path: False})  # one switch off: "fused_norm_act", ...


def run(spec: dict) -> dict:
    family_cls, cfg = FULL_CONFIGS[spec["family"]]()
    model = build_random_model(family_cls, cfg, DTYPES[spec["dtype"]])
    model.opts = options(spec)
    x = make_input(model, spec)
    kwargs = dict(temporal_chunk=spec.get("temporal_chunk"))
    fn = (lambda: model.encode(x, **kwargs)) if spec["op"] == "encode" else (lambda: model.decode(x, **kwargs))
    reset_peak_rss()
    base = rss_bytes()
    median, times = median_time(fn, spec.get("repeats", 3), spec.get("warmup", 1))
    peak = peak_rss_bytes()
    out = fn() if spec.get("out") else None
    if out is not None:
        save_file({"out": out.float().contiguous()}, spec["out"])
    return {"median_s": median, "times_s": times, "peak_rss": peak, "peak_activation": peak - base, "weights_rss": base}


if __name__ == "__main__":
    torch.manual_seed(0)
    print(json.dumps(run(json.loads(sys.argv[1]))))
