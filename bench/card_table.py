"""What fits on an 8/12/16/24 GB card: the plan the planner picks for common workloads within each card's
memory, and its predicted peak, from the memory model's CUDA coefficients (shapes only, no GPU).

    python -m bench.card_table            # markdown, as the README shows it

A card's budget is its memory less what a desktop and the CUDA context keep (CARD_RESERVE); decode in
bf16 and encode in fp32 (the GPU defaults), frames to host memory as the nodes run them. Where the
CUDA coefficients of a mode were not measured on a GPU the model scales the CPU's (`vae.run.memory`),
so a cell is a prediction until the GPU session's calibration and sweep parts (bench/gpu_session.py) have
run on a GPU.
"""
import torch

import vae
from bench import models
from vae.run.geometry import input_shape

GB = 10**9
GIB = 2**30
CARDS = (8, 12, 16, 24)
CARD_RESERVE = 0.8 * GIB  # the CUDA context and what else a card holds (display, other processes)
# (label, family, op, frames, height, width)
WORKLOADS = [
    ("SeedVR2 upscale to 1080p, decode", "seedvr2", "decode", 21, 1080, 1920),
    ("SeedVR2 upscale to 1080p, encode", "seedvr2", "encode", 21, 1080, 1920),
    ("SeedVR2 upscale to 4K, decode", "seedvr2", "decode", 21, 2160, 3840),
    ("Wan2.1 720p, 81 frames, decode", "wan21", "decode", 81, 720, 1280),
    ("Wan2.1 1080p, 81 frames, decode", "wan21", "decode", 81, 1080, 1920),
    ("Wan2.2-5B 720p, 121 frames, decode", "wan22", "decode", 121, 704, 1280),
    ("LTX-2 720p, 241 frames, decode", "ltx2", "decode", 241, 720, 1280),
    ("LTX-2 1088p, 241 frames, decode", "ltx2", "decode", 241, 1088, 1920),
    ("LTX-2 4K, 121 frames, decode", "ltx2", "decode", 121, 2176, 3840),
    ("HunyuanVideo 1.5 720p, 121 frames, decode", "hv15", "decode", 121, 720, 1280),
    ("HunyuanVideo 1.5 1080p, 121 frames, decode", "hv15", "decode", 121, 1080, 1920),
]


def cell(model, op: str, shape, card_gb: int) -> str:
    budget = int(card_gb * GB - CARD_RESERVE)
    placement = dict(device="cuda", io_on_device=(False, False), opts=vae.Optimizations(kernel_choice="defaults"))
    plan = vae.plan(model, op, shape, vae.Settings(memory_budget=budget), **placement)
    if plan.peak_bytes is None:
        return "no calibration"
    how = "untiled" if plan.tile_size is None else f"{plan.tile_size[0]} px tiles"
    how += ", frames streamed" if plan.frames_streamed else ""
    verdict = "" if plan.fits else " (does not fit)"
    return f"{how}, {plan.peak_bytes / GIB:.1f} GiB{verdict}"


def main() -> None:
    print("| workload | " + " | ".join(f"{c} GB card" for c in CARDS) + " |")
    print("|---|" + "---|" * len(CARDS))
    for label, family, op, frames, height, width in WORKLOADS:
        model = models.meta_model(family)
        model.set_dtypes(encode=torch.float32, decode=torch.bfloat16)
        shape = input_shape(op, frames, height, width, model.latent_channels, model.spatial_factor, model.temporal_factor)
        print(f"| {label} | " + " | ".join(cell(model, op, shape, c) for c in CARDS) + " |")


if __name__ == "__main__":
    main()
