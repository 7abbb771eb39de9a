"""One measured benchmark variant, run in its own process by bench.bench_vae and bench.bench_tiling.

    python -m bench.worker '{"family": "seedvr2", "op": "decode", "frames": 9, "height": 256, "width": 256,
                             "dtype": "fp32", "variant": "optimized", "repeats": 3, "warmup": 1, "out": "..."}'

Builds the family's full released config with random weights (bench.models), sets it up for the
variant (bench.variants; spec "engine" adds plan settings such as tiles), runs the op `repeats` times
after `warmup` runs (the first one under torch's FLOP counter when `count_flops`), saves the last
output for the error comparison and prints one JSON line: times, memory and FLOPs. Memory: "peak
activation" is the most the timed runs allocate above the RSS they start from (VmHWM reset after the
warm-up), "retained" what the warm-up left resident (caches such as the Winograd filter transforms).
"""
import json
import sys
import time

import torch
from safetensors.torch import save_file

from bench import models
from bench.common import count_flops, dump_stacks_when_asked, peak_rss_bytes, reset_peak_rss, rss_bytes, timed_runs
from bench.variants import prepared, variant

from vae.kernels.backend import DTYPES
from vae.kernels import kernel_choice


def build(spec: dict):
    """(model, fn): the variant's model and the op to time (called with the variant's optimizations)."""
    core, dtype = variant(spec["variant"]).core, DTYPES[spec["dtype"]]
    model = models.build(spec["family"], dtype, seed=spec.get("seed", 0), core=core,
                         config=variant(spec["variant"]).model_config)
    x = models.make_input(spec["family"], spec)
    if core is not None:
        op = model.encode if spec["op"] == "encode" else model.decode
        return model, lambda opts: op(x.to(dtype))
    settings = dict(temporal_chunk=spec.get("temporal_chunk"), **variant(spec["variant"]).settings, **spec.get("engine", {}))
    return model, lambda opts: models.run(model, spec["op"], x, settings, opts)


def run(spec: dict) -> dict:
    model, op = build(spec)
    weights = rss_bytes()
    with torch.inference_mode(), prepared(model, spec["variant"]) as setup:
        def fn():
            with setup.per_run():
                return op(setup.opts)

        weight_bytes = sum(p.nbytes for p in model.parameters())

        flops, first_run = None, None
        if spec.get("count_flops") or spec.get("warmup", 1) > 0:
            # The first run, timed: it pays for kernel tuning (unless cached) and the filter transforms.
            start = time.perf_counter()
            if spec.get("count_flops"):  # counted (FLOPs on worker threads are not seen)
                flops = count_flops(fn)
            else:
                fn()
            first_run = time.perf_counter() - start
            timed_runs(fn, 0, spec.get("warmup", 1) - 1)
        retained = rss_bytes() - weights
        before = rss_bytes()
        reset_peak_rss()
        times, out = timed_runs(fn, spec.get("repeats", 3), 0)
        peak = peak_rss_bytes() - before
        kernels = kernel_choice.choices_for("cpu").summary() if setup.opts.kernel_choice == "measure" else None
        compiled = setup.compile_report.status if setup.compile_report is not None else None
    if spec.get("out"):
        save_file({"out": out.float().contiguous()}, spec["out"])
    return {"times_s": times, "peak_activation": peak, "retained": retained, "weight_bytes": weight_bytes,
            "flops": flops, "first_run_s": first_run, "kernels": kernels, "compile": compiled}


if __name__ == "__main__":
    dump_stacks_when_asked()
    torch.manual_seed(0)
    print(json.dumps(run(json.loads(sys.argv[1]))))
