"""Quality and speed of bf16 decode against fp32 on the tiny reference checkpoints (`auto` precision).

    python bench/bench_precision.py

For each family: the tiny checkpoint of ../shared/reference/<family>/ (the upstream fixtures'
weights) decodes its fixture latent (SeedVR2: the latent of its fixture video, encoded in fp32) in
fp32 and in bf16, both optimized; PSNR of the bf16 output against the fp32 one over the [-1, 1]
range, and the median time of 3 runs. Full-size configs: bench/bench_vae.py's bf16 rows (PSNR column).
Whether `auto` decodes in bf16 here is vae.devices.auto_dtype's answer for this CPU.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import vae  # noqa: E402
from bench.common import machine_summary, median_time, print_table, psnr  # noqa: E402
from tests.reference import load_tiny, tensors  # noqa: E402
from vae import devices  # noqa: E402


def latent(family: str, model) -> torch.Tensor:
    """The family's fixture latent; SeedVR2's is its fixture video encoded by `model`."""
    if family == "seedvr2":
        with torch.inference_mode():
            return vae.encode(model, tensors(family, "tiny_inputs.safetensors")["video"])
    return tensors(family, "reference_io.safetensors")["dec_in_z_raw"]


def main():
    rows = []
    for family in ("seedvr2", "wan21", "wan22"):
        models = {"fp32": load_tiny(family), "bf16": load_tiny(family, decode_dtype=torch.bfloat16)}
        z = latent(family, models["fp32"])
        outputs = {}
        for name, model in models.items():
            with torch.inference_mode():
                median, _ = median_time(lambda: vae.decode(model, z), repeats=3)
                outputs[name] = vae.decode(model, z).float()
            rows.append(dict(family=family, dtype=name, time=median,
                             psnr=psnr(outputs[name], outputs["fp32"]) if name != "fp32" else None))
    auto = devices.auto_dtype("cpu", "decode")
    machine = machine_summary()
    print(f"machine: {machine}\n`auto` decode dtype on this CPU: {auto}\n")
    print_table(rows, [("family", "family", "s"), ("dtype", "dtype", "s"), ("time", "median s", ".3f"),
                       ("psnr", "PSNR vs fp32 dB", ".1f")])
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps({"machine": machine, "auto_decode": str(auto), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
