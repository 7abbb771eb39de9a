"""Where an LTX-2 decode's time goes, block by block: StreamVAE's decoder against ComfyUI core's LTX VAE
with the same weights, each block's wall time summed over one decode, in each side's median round (by
total time) of interleaved rounds.

    python -m bench.block_times --core 0.33.0 --frames 9 --size 256x256 --rounds 3 --threads 1

Blocks are the decoder's top-level modules by their checkpoint names, which StreamVAE and core share
(`conv_in`, `up_blocks.<i>`: a group of residual blocks or a depth-to-space upsampler, `conv_out`; core's
`conv_norm_out` and `conv_act` are counted with `conv_out`, which holds that norm in StreamVAE). StreamVAE's
are timed around its decode stages (`VideoVAE.decode_stages`), core's by forward hooks; "outside the
blocks" is the rest of the decode (the engine, the latent normalisation, unpatchify, the output
buffer). The released decoder (seeded random weights), fp32, StreamVAE's default optimizations.
`--threads 1` takes thread scheduling out of the picture on a shared machine; the default runs on
torch's threads. `--profile N`: then the N ops of one more StreamVAE decode and one more core decode
that took the most time of their own (torch.profiler, ops of the calling thread: run it with
`--threads 1`, else the Winograd convs' worker threads are not seen).
"""
import argparse
import time
from collections import defaultdict
from functools import partial

import torch

from bench import models
from bench.common import machine_summary, print_table
from bench.core_vae import TREES
from vae import families

FAMILY = families.LTX2.name  # the decoder this tool times, block by block
CORE_NORM_OUT = ("conv_norm_out", "conv_act")  # core's norm and SiLU before conv_out: StreamVAE's conv_out norm


def top_blocks(decoder: torch.nn.Module):
    """(name, module) of the decoder's top-level blocks: its children, a ModuleList's entries one by one."""
    for top, child in decoder.named_children():
        if isinstance(child, torch.nn.ModuleList):
            yield from ((f"{top}.{i}", block) for i, block in enumerate(child))
        else:
            yield top, child


def timed_ours(model, times: dict[str, float]):
    """`model` (StreamVAE's) with the decode stages of its decoder's blocks timed into `times` by block."""
    names = {id(m): name for name, block in top_blocks(model.decoder) for m in block.modules()}
    stages = model.decode_stages

    def wrap(stage):
        name = names.get(id(stage.func if isinstance(stage, partial) else stage))
        if name is None:  # the noised latent, unpatchify: outside the blocks
            return stage

        def run(x, ctx):
            start = time.perf_counter()
            y = stage(x, ctx)
            times[name] += time.perf_counter() - start
            return y
        return run

    model.decode_stages = lambda: [wrap(stage) for stage in stages()]
    return model


def timed_core(core, times: dict[str, float]):
    """Core's VAE (bench.core_vae's wrapper) with forward hooks timing its decoder's blocks into `times`."""
    for name, block in top_blocks(core.core.decoder):
        key = "conv_out" if name in CORE_NORM_OUT else name
        starts = []
        block.register_forward_pre_hook(lambda m, args, starts=starts: starts.append(time.perf_counter()))
        block.register_forward_hook(lambda m, args, out, starts=starts, key=key: times.__setitem__(
            key, times[key] + time.perf_counter() - starts.pop()))
    return core


def shape_of(block: torch.nn.Module) -> str:
    """"<n> convs <in>-><out>, ...": the 3D convs in `block` (5-dim weights) and their widths."""
    weights = [m.weight for m in block.modules() if isinstance(getattr(m, "weight", None), torch.Tensor)
               and m.weight.dim() == 5]
    widths = sorted({(w.shape[1], w.shape[0]) for w in weights})
    return f"{len(weights)} convs " + ", ".join(f"{i}->{o}" for i, o in widths)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=9, help="pixel frames (1 + 8k)")
    parser.add_argument("--size", default="256x256", help="HxW in pixels")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--core", default="0.33.0", choices=[v for v, t in TREES.items() if FAMILY in t.modules])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--profile", type=int, default=0, help="also list this many ops of each side's decode")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    height, width = (int(v) for v in args.size.lower().split("x"))
    z = models.make_input(FAMILY, dict(op="decode", frames=args.frames, height=height, width=width))
    per_round = {"ours": [], "core": []}
    current = {"ours": defaultdict(float), "core": defaultdict(float)}
    ours = timed_ours(models.drop_other_half(models.build(FAMILY, torch.float32), "decode"), current["ours"])
    core = timed_core(models.drop_other_half(models.build(FAMILY, torch.float32, core=args.core), "decode"),
                      current["core"])
    runs = {"ours": lambda: models.run(ours, "decode", z), "core": lambda: core.decode(z)}
    with torch.inference_mode():
        for run in runs.values():  # warm-up: kernel tuning, Winograd filter transforms, oneDNN primitives
            run()
        for _ in range(args.rounds):
            for name, run in runs.items():
                current[name].clear()
                start = time.perf_counter()
                run()
                current[name]["total"] = time.perf_counter() - start
                per_round[name].append(dict(current[name]))
    # each side's median round (by its total), so that its blocks add up to its total
    chosen = {name: sorted(rounds, key=lambda r: r["total"])[len(rounds) // 2] for name, rounds in per_round.items()}
    blocks = dict(top_blocks(ours.decoder))
    keys = [*blocks, "outside the blocks", "total"]
    for times in chosen.values():
        times["outside the blocks"] = times["total"] - sum(times.get(key, 0.0) for key in blocks)
    what = {name: f"{type(block).__name__}: {shape_of(block)}" for name, block in blocks.items()}
    rows = [dict(block=key, what=what.get(key, ""), ours=chosen["ours"].get(key, 0.0), core=chosen["core"].get(key, 0.0))
            for key in keys]
    for row in rows:
        row["ratio"] = row["core"] / row["ours"] if row["ours"] else None
    print(f"\nmachine: {machine_summary()}\nLTX-2 decode {args.frames}x{height}x{width} fp32, threads "
          f"{torch.get_num_threads()}, median round of {args.rounds} interleaved rounds (core {args.core})\n")
    print_table(rows, [("block", "block", "s"), ("what", "what", "s"), ("ours", "StreamVAE s", ".3f"),
                       ("core", f"core {args.core} s", ".3f"), ("ratio", "core / StreamVAE", ".2f")])
    for name, run in runs.items() if args.profile else ():
        with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            run()
        events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:args.profile]
        print(f"\n{'StreamVAE' if name == 'ours' else 'core ' + args.core}: the ops with the most time of their own")
        print_table([dict(op=e.key, s=e.self_cpu_time_total / 1e6, calls=e.count) for e in events],
                    [("op", "op", "s"), ("s", "own s", ".3f"), ("calls", "calls", "d")])


if __name__ == "__main__":
    main()
