"""One peak-memory measurement in a fresh process (used by calibrate_memory.py and the tests).

    python -m bench.memory_worker '{"family": "seedvr2", "op": "decode", "frames": 5, "height": 64, ...}'

Prints one JSON line: activation_bytes (peak during the op minus what was resident just before it),
peak_bytes (peak minus the process's footprint before the model existed) and predicted_bytes
(`vae.memory.estimate` for the same settings, if calibrated).
"""
import json
import sys

import torch

from bench.common import build_random_model, peak_rss_bytes, reset_peak_rss, rss_bytes
from bench.families import FULL_CONFIGS, make_input
from vae import memory


def run(spec: dict) -> dict:
    device = torch.device(spec.get("device", "cpu"))
    cuda = device.type == "cuda"
    start = torch.cuda.memory_allocated(device) if cuda else rss_bytes()
    family_cls, cfg = FULL_CONFIGS[spec["family"]]()
    model = build_random_model(family_cls, cfg, torch.float32, device=str(device))
    x = make_input(model, spec).to(device)
    kwargs = dict(temporal_chunk=spec.get("temporal_chunk"), tile_size=spec.get("tile_size"), tiling=spec.get("tiling", "exact"))
    if spec["op"] == "decode":
        out = torch.zeros((x.shape[0], 3, (x.shape[2] - 1) * model.temporal_factor + 1,
                           x.shape[3] * model.spatial_factor, x.shape[4] * model.spatial_factor), device=device)
        fn = lambda: model.decode(x, out=out, **kwargs)  # noqa: E731
    else:
        fn = lambda: model.encode(x, **kwargs)  # noqa: E731
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        reset_peak_rss()
        base = rss_bytes()
    fn()
    peak = torch.cuda.max_memory_allocated(device) if cuda else peak_rss_bytes()
    try:
        predicted = memory.estimate(model, spec["op"], tuple(x.shape), spec.get("temporal_chunk") or 1,
                                    spec.get("tile_size"), spec.get("tiling", "exact"), device)
    except KeyError:
        predicted = None
    return {"activation_bytes": peak - base, "peak_bytes": peak - start, "predicted_bytes": predicted}


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
