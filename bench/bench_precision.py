"""Quality and speed of bf16 decode against fp32 on the tiny reference checkpoints (`auto` precision).

    python -m bench.bench_precision [results.json]

For each family with upstream fixtures: the tiny checkpoint of ../shared/reference/<family>/ (the
upstream fixtures' weights) decodes the latent of its fixture video, encoded in fp32, in fp32 and in
bf16, both optimized; PSNR of the bf16 output against the fp32 one over the [-1, 1]
range, and the median time of 3 runs. Full-size configs: bench.bench_vae's bf16 rows (PSNR column).
Whether `auto` decodes in bf16 here is vae.kernels.backend.auto_dtype's answer for this CPU.
"""
import json
import sys
from pathlib import Path

import torch

from bench import models
from bench.common import machine_summary, median_time, print_table, psnr
from tests.reference import TINY_FAMILIES, fixture_clip
from vae.kernels import backend
from vae.kernels.backend import DTYPES


def latent(family: str, model) -> torch.Tensor:
    """The latent of the family's fixture video, encoded by `model`."""
    with torch.inference_mode():
        return models.run(model, "encode", fixture_clip(family)[0])


def main():
    rows = []
    for family in TINY_FAMILIES:
        by_dtype = {name: models.build(family, DTYPES[name], tiny=True) for name in ("fp32", "bf16")}
        z = latent(family, by_dtype["fp32"])
        outputs = {}
        for name, model in by_dtype.items():
            with torch.inference_mode():
                median, _ = median_time(lambda: models.run(model, "decode", z), repeats=3)
                outputs[name] = models.run(model, "decode", z).float()
            rows.append(dict(family=family, dtype=name, time=median,
                             psnr=psnr(outputs[name], outputs["fp32"]) if name != "fp32" else None))
    auto = backend.auto_dtype("cpu", "decode")
    machine = machine_summary()
    print(f"machine: {machine}\n`auto` decode dtype on this CPU: {auto}\n")
    print_table(rows, [("family", "family", "s"), ("dtype", "dtype", "s"), ("time", "median s", ".3f"),
                       ("psnr", "PSNR vs fp32 dB", ".1f")])
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps({"machine": machine, "auto_decode": str(auto), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
