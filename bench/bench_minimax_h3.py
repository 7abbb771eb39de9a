"""MiniMax-H3 decode on the CPU: StreamVAE against ComfyUI 0.33.0's own `MiniMaxH3VideoVAE` with the same
weights, side by side in one process (the variants of a table take turns within each repeat; medians).

    python -m bench.bench_minimax_h3                     # all three tables
    python -m bench.bench_minimax_h3 --tables block --repeats 5
    python -m bench.bench_minimax_h3 --dim 2048 --grid 2 1 --json out.json   # decoder blocks at the released width

Tables:
- decode: a whole decode (`vae.decode`) at reduced widths (encoder 32-64 channels; decoder `--dim`, `--layers`)
  of one clip (7 latent frames) on a `--grid` of core's 256 px tiles: StreamVAE's default plan on the CPU (one
  tile at a time), its tiles batched (one attention call per layer for all tiles of the clip), its weights
  streamed (layer by layer over the clip's tiles), with SDPA's math kernel, in bf16; core's decode.
- block: one decoder block at the released width (2048 channels, 32 heads of 64) on one tile (1797 tokens;
  `--block-tiles` more at once): StreamVAE's block (SDPA: PyTorch's choice, math; bf16 where the CPU has
  native bf16) and core's `TransformerBlock` (on a CPU core attends with its sub-quadratic attention,
  comfy/ldm/modules/attention.py).
- attention: the attention alone at the released heads, the same kernels and core's.
Error columns: max |ours - core| of the same input, in the output's units (bf16 rows against fp32 core).
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import vae

from bench.common import machine_summary, print_table
from bench.core_vae import _import_core, core_model
from bench.models import random_state_dict
from vae.kernels import cpu_has_native
from vae.model.minimax_h3 import MiniMaxH3Config, MiniMaxH3VAE, tiled
from vae.model.minimax_h3.vit3d import MiniMaxH3Block, MiniMaxH3Rope, token_positions

KERNELS = {"auto": None, "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
TILE_TOKENS = (7, 16, 16)  # a 256 px tile of one clip: 7 latent frames of 16 x 16


def _random(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """`module` with `bench.models.random_state_dict`'s weights, eval mode."""
    module.load_state_dict(random_state_dict(module, seed))
    return module.eval()


def _race(variants: dict, repeats: int) -> dict:
    """name -> (median s, output, the rounds' s): every variant once per round, `repeats` rounds after one
    warm-up round."""
    times, outputs = {name: [] for name in variants}, {}
    for round_ in range(repeats + 1):
        for name, run in variants.items():
            start = time.perf_counter()
            with torch.no_grad():
                outputs[name] = run()
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), outputs[name], times[name]) for name in variants}


def _rows(table: str, shape: str, results: dict, reference: str, baseline: str) -> list[dict]:
    ref, base = results[reference][1].float(), results[baseline][0]
    return [{"table": table, "shape": shape, "variant": name, "time": t, "speedup": base / t,
             "max_err": (out.float() - ref).abs().max().item(), "times": times}
            for name, (t, out, times) in results.items()]


def decode_table(args, core_module) -> list[dict]:
    cfg = MiniMaxH3Config(base_channels=32, multipliers=(1, 1, 1, 1, 1, 2), res_blocks=(1,) * 6, dim=args.dim,
                          layers=args.layers)
    ours = _random(MiniMaxH3VAE(cfg), 1)
    core = core_model("0.33.0", MiniMaxH3VAE.family, cfg, ours.state_dict(), torch.float32)  # shares ours' weights
    rows, cols = args.grid
    # the smallest frame core cuts into rows x cols tiles of 256 px: 192 px more per tile (64 px overlap)
    z = torch.randn(1, 24, 7, (256 + 192 * (rows - 1)) // 16, (256 + 192 * (cols - 1)) // 16,
                    generator=torch.Generator().manual_seed(2))
    latent = ours.to_comfy_latent(z)
    bf16 = _random(MiniMaxH3VAE(cfg), 1).to(torch.bfloat16)
    variants = {
        "core 0.33.0": lambda: core.frames(latent) * 2 - 1,
        "ours (the CPU's default: one tile at a time)": lambda: vae.decode(ours, z),
        "ours, tiles batched": lambda: vae.decode(ours, z, vae.Settings(own_tile_batch=rows * cols)),
        "ours, weights streamed": lambda: vae.decode(ours, z, vae.Settings(stream_weights=True)),
        "ours, SDPA math": lambda: _in("math", lambda: vae.decode(ours, z)),
        "ours bf16": lambda: vae.decode(bf16, z.to(torch.bfloat16)),
    }
    results = _race(variants, args.repeats)
    shape = f"{rows}x{cols} tiles, dim {cfg.dim}, {cfg.layers} layers"
    # core clamps to [0, 1]: errors are against core's clamped frames, ours clamped the same way
    for name in list(results)[1:]:
        results[name] = (results[name][0], results[name][1].clamp(-1, 1), results[name][2])
    return _rows("decode", shape, results, "core 0.33.0", "core 0.33.0")


def block_table(args, core_module) -> list[dict]:
    cfg = MiniMaxH3Config()
    ours = _random(MiniMaxH3Block(cfg), 3)
    core = core_module.TransformerBlock(heads=cfg.heads, dim_head=cfg.head_dim)
    core.load_state_dict(ours.state_dict(), strict=True)
    core.eval()
    rope_ours = MiniMaxH3Rope(cfg)(token_positions(*TILE_TOKENS, cfg.register_tokens + 1, "cpu"))
    ids = core_module.create_token_ids(TILE_TOKENS, "cpu", torch.float32)
    ids = torch.cat([ids, ids.new_zeros(1, cfg.register_tokens + 1, 3)], dim=1)
    rope_core = core_module.RotaryEmbeddingND(cfg.rope_dims, cfg.rope_theta, n_dim=3)(ids)
    bf16 = _random(MiniMaxH3Block(cfg), 3).to(torch.bfloat16) if cpu_has_native(torch.bfloat16) else None
    rows = []
    for tiles in args.block_tiles:
        x = torch.randn(tiles, rope_ours[0].shape[0], cfg.dim, generator=torch.Generator().manual_seed(4))
        variants = {"core 0.33.0": lambda: core(x.clone(), rope_core.expand(tiles, -1, -1, -1, -1, -1)),
                    "ours, SDPA auto": lambda: ours(x, rope_ours),
                    "ours, SDPA math": lambda: _in("math", lambda: ours(x, rope_ours))}
        if bf16 is not None:  # bf16 GEMMs without native bf16 (AVX2) are slower than float32: not a choice there
            variants["ours bf16, SDPA auto"] = lambda: bf16(x.to(torch.bfloat16), rope_ours)
        rows += _rows("block", f"{tiles} tile(s) x {x.shape[1]} tokens, dim {cfg.dim}", _race(variants, args.repeats),
                      "core 0.33.0", "core 0.33.0")
    return rows


def _in(kernel: str, run):
    if KERNELS[kernel] is None:
        return run()
    with sdpa_kernel([KERNELS[kernel]]):
        return run()


def attention_table(args, core_module) -> list[dict]:
    from comfy.ldm.modules.attention import attention_sub_quad

    cfg, g = MiniMaxH3Config(), torch.Generator().manual_seed(5)
    tokens = TILE_TOKENS[0] * TILE_TOKENS[1] * TILE_TOKENS[2] + cfg.register_tokens + 1
    q, k, v = (torch.randn(1, cfg.heads, tokens, cfg.head_dim, generator=g) for _ in range(3))
    variants = {"core 0.33.0 (sub-quadratic)": lambda: attention_sub_quad(q, k, v, cfg.heads, skip_reshape=True)}
    for kernel in KERNELS:
        variants[f"SDPA {kernel}"] = lambda kernel=kernel: _in(
            kernel, lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))
    bf = [t.to(torch.bfloat16) for t in (q, k, v)]
    variants["SDPA auto bf16"] = lambda: torch.nn.functional.scaled_dot_product_attention(*bf).transpose(1, 2).flatten(2)
    return _rows("attention", f"1 tile, {cfg.heads} heads x {tokens} tokens x {cfg.head_dim}", _race(variants, args.repeats),
                 "core 0.33.0 (sub-quadratic)", "core 0.33.0 (sub-quadratic)")


TABLES = {"attention": attention_table, "block": block_table, "decode": decode_table}
COLUMNS = [("table", "table", "s"), ("shape", "shape", "s"), ("variant", "variant", "s"), ("time", "median s", ".3f"),
           ("speedup", "vs core", ".2f"), ("max_err", "max err", ".1e")]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", nargs="+", choices=list(TABLES), default=list(TABLES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dim", type=int, default=512, help="decode table: decoder width (heads of 64)")
    parser.add_argument("--layers", type=int, default=2, help="decode table: decoder blocks")
    parser.add_argument("--grid", type=int, nargs=2, default=(2, 2), help="decode table: tile rows, cols")
    parser.add_argument("--block-tiles", type=int, nargs="+", default=(1,), help="block table: tiles per call")
    parser.add_argument("--json", help="also write the rows (with each round's time), the machine and the loads here")
    args = parser.parse_args(argv)
    core_module = _import_core("0.33.0", "comfy.ldm.minimax.vae", cpu=True)
    machine, loads, rows = machine_summary(), {"before": os.getloadavg()}, []
    print(f"load average before: {loads['before']}")
    print(machine)
    for table in args.tables:
        rows += TABLES[table](args, core_module)
        print_table([row for row in rows if row["table"] == table], COLUMNS)
        loads[f"after {table}"] = os.getloadavg()
        print(f"load average after {table}: {loads[f'after {table}']}", flush=True)
        if args.json:  # after every table, so a run stopped early keeps what it measured
            given = sys.argv[1:] if argv is None else argv
            Path(args.json).write_text(json.dumps({"machine": machine, "argv": given, "load_average": loads, "rows": rows},
                                                  indent=1))


if __name__ == "__main__":
    main()
