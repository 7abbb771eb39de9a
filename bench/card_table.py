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
from vae import families
from vae.model.video_vae import ClipExtent
from vae.run.geometry import input_shape

GB = 10**9
GIB = 2**30
CARDS = (8, 12, 16, 24)
CARD_RESERVE = 0.8 * GIB  # the CUDA context and what else a card holds (display, other processes)
# (family, its `CardRow`): the rows the families' specs declare, in the registry's order
WORKLOADS = [(spec.name, row) for spec in families.SPECS for row in spec.bench.cards]


def decode_latent_frames(model, frames: int) -> int:
    """The fewest latent frames `model` decodes to at least `frames` frames, by its own frame rule."""
    return next(t for t in range(1, frames + 1) if model.frames_made("decode", t) >= frames)


def cell(model, op: str, shape, card_gb: int) -> str:
    budget = int(card_gb * GB - CARD_RESERVE)
    placement = dict(device="cuda", io_on_device=(False, False), opts=vae.Optimizations(kernel_choice="defaults"))
    plan = vae.plan(model, op, shape, vae.Settings(memory_budget=budget), **placement)
    if plan.peak_bytes is None:
        return "no calibration"
    how = "untiled" if plan.tile_size is None else f"{plan.tile_size[0]} px tiles"
    how += ", frames streamed" if plan.frames_streamed else ""
    if model.clip_extent(op) is ClipExtent.UNTILED_CHUNKS:  # untiled always: how long its chunks, where its state waits
        how = f"{plan.temporal_chunk} latent frame(s) a chunk" + (
            f", caches to {plan.cache_offload}" if plan.cache_offload != "none" else "")
    if plan.own_tiles is not None:  # the model's own tiles: how many at once, where the weights are
        how = f"{plan.own_tiles.batch} own tiles at once" + (", weights streamed" if plan.own_tiles.weights_streamed else "")
    verdict = "" if plan.fits else " (does not fit)"
    return f"{how}, {plan.peak_bytes / GIB:.1f} GiB{verdict}"


def main() -> None:
    print("| workload | " + " | ".join(f"{c} GB card" for c in CARDS) + " |")
    print("|---|" + "---|" * len(CARDS))
    for family, row in WORKLOADS:
        model = models.meta_model(family)
        model.set_dtypes(encode=torch.float32, decode=torch.bfloat16)
        clip = row.clip
        shape = input_shape(row.op, clip.frames, clip.height, clip.width, model.latent_channels, model.spatial_factor,
                            model.temporal_factor)
        if row.op == "decode":  # by the network's own frame rule
            shape = shape[:2] + (decode_latent_frames(model, clip.frames),) + shape[3:]
        print(f"| {row.label} | " + " | ".join(cell(model, row.op, shape, c) for c in CARDS) + " |")


if __name__ == "__main__":
    main()
