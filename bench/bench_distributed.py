"""Scaling model of row bands over several GPUs (`distributed.RowBands`, `workers`): what is exchanged,
measured by running the real decoder with the real band strategy on the meta device, and predicted
times on 2/4/8 GPUs.

Only one GPU is ever available here, so nothing in the predicted columns is measured on several GPUs:
- measured (exactly, no GPU needed): bytes each rank sends per conv layer and per latent chunk, and how
  many exchanges a chunk makes, from `TrafficCount` — `RowBands` with its sends counted instead
  of made, on meta tensors of the full released configs (the busiest rank: the middle one);
- from bench/RESULTS.md section 0 (one H100, bf16, measured): the single-GPU time T1 of a workload,
  or T1 scaled by pixels where that workload was not run (marked);
- assumed: link bandwidth per direction and a fixed cost per exchange (NCCL launch + Python), below.

Predicted time on N GPUs = T1 x (the largest band's share of the rows) + sum over exchanges of
(fixed cost + bytes the busiest rank sends / bandwidth) + the output gathered on rank 0. The
exchanges are not overlapped with compute (this implementation waits for them), and compute is taken
as perfectly proportional to the rows (smaller convs run less efficiently: optimistic for 8 GPUs at
low resolution). Memory per GPU: the memory model's untiled peak for a band-sized frame.

    python -m bench.bench_distributed                 # the table (markdown) and one JSON line per row
    python -m bench.bench_distributed --layers wan21  # bytes per layer of one chunk, Wan2.1 720p on 4 GPUs
"""
import argparse
import json
import platform
from collections import defaultdict
from functools import lru_cache

import torch

from bench import models
from bench.common import git_commit
from vae.run import memory
from vae.run.run_context import RunContext
from vae.run.causal_cache import CausalCache
from vae.run.planning import clip_of
from vae.distributed.row_bands import Bands, RowBands
from vae.model.layers import FrameGroupNorm
from vae.kernels import Optimizations

# (name, family, frames, height, width, T1 seconds on one H100 in bf16, how T1 is known)
WORKLOADS = [
    ("Wan2.1 81x720x1280", "wan21", 81, 720, 1280, 1.47 * (720 * 1280) / (480 * 832), "scaled from 81x480x832 1.47 s"),
    ("Wan2.1 81x480x832", "wan21", 81, 480, 832, 1.47, "measured"),
    ("Wan2.2 81x704x1280", "wan22", 81, 704, 1280, 3.24, "measured"),
    ("SeedVR2 21x1080x1920", "seedvr2", 21, 1080, 1920, 3.0, "measured"),
    ("SeedVR2 21x2160x3840", "seedvr2", 21, 2160, 3840, 3.0 * 4, "scaled from 21x1080x1920 3.0 s"),
]
# Per direction, per GPU; fixed cost per exchange (one batch of sends/receives or one all-gather).
LINKS = {"NVLink (H100, 450 GB/s)": (450e9, 40e-6), "PCIe 5 (50 GB/s)": (50e9, 60e-6), "PCIe 4 (25 GB/s)": (25e9, 60e-6)}
PEERS = "xDiT DistVAE / SGLang / FastVAE, Wan2.1 720p decode on A800s: 9.26 / 5.45 / 3.27 / 2.16 s on 1/2/4/8, 11.8 -> 3.0 GB per GPU"
GPUS = (2, 4, 8)


class TrafficCount(RowBands):
    """`RowBands` of `rank` of `world` without a process group: every exchange is counted (bytes this
    rank sends, per layer) and replaced by uninitialised tensors of the right shape (meta device)."""

    def __init__(self, bands: Bands, rank: int, world: int, names: dict):
        self.bands, self.group, self.rank, self.world, self.gather = bands, None, rank, world, True
        self.peers, self.sent_bytes, self.names = list(range(world)), 0, names
        self.layer, self.per_layer, self.exchanges = "", defaultdict(int), 0

    def _count(self, n_bytes: int) -> None:
        self.sent_bytes += n_bytes
        self.per_layer[self.layer] += n_bytes
        self.exchanges += 1

    def conv(self, conv, ctx, shape, like, fill):
        self.layer = self.names.get(conv, type(conv).__name__)
        return super().conv(conv, ctx, shape, like, fill)

    def _exchange(self, window, first_row, scale, wants):
        lo, hi = self.bands.rows(self.rank, scale)
        sent_rows = sum(max(0, min(b, hi) - max(a, lo)) for r, (a, b) in enumerate(wants) if r != self.rank)
        a, b = wants[self.rank]
        if sent_rows or a < lo or b > hi:
            self._count(sent_rows * window[..., :1, :].numel() * window.element_size())

    def local(self, fn, x, scale, halo):
        self.layer = self.names.get(getattr(fn, "__self__", None), "local") + " (2x upsample)"
        return super().local(fn, x, scale, halo)

    def norm_stats(self, norm, x, ctx):
        if isinstance(norm, FrameGroupNorm):
            b, _, t = x.shape[:3]
            self._count(2 * b * norm.num_groups * t * 4 * (self.world - 1))
        return norm.stats(x, ctx)

    def _all_rows(self, x, scale):
        self.layer = "attention (all-gather)"
        self._count(x.numel() * x.element_size() * (self.world - 1))
        return x.new_empty(x.shape[:-2] + (scale * self.bands.latent_rows, x.shape[-1]))


@lru_cache(maxsize=None)
def chunk_traffic(family: str, height: int, width: int, world: int, chunk: int = 1):
    """(bytes per steady latent chunk sent by the busiest rank, exchanges per chunk, bytes per layer)
    for a decode on `world` GPUs, measured on meta tensors of the released config in bf16."""
    model = models.meta_model(family).to(torch.bfloat16)
    h, w = height // model.spatial_factor, width // model.spatial_factor
    bands, rank = Bands.split(h, world), world // 2
    names = {m: n for n, m in model.named_modules()}
    counter = TrafficCount(bands, rank, world, names)
    ctx = RunContext(Optimizations(), counter, CausalCache("none", "meta"), frames_are_images=model.frames_are_images)
    lo, hi = bands.rows(rank, 1)
    z = torch.empty((1, model.latent_channels, chunk, hi - lo, w), device="meta", dtype=torch.bfloat16)
    with torch.inference_mode():
        for first, _ in ctx.chunks(2, 1, ending=False):  # the first chunk (one latent frame), then a steady one
            counter.sent_bytes, counter.exchanges, counter.per_layer = 0, 0, defaultdict(int)
            model.decode_chunk(z[:, :, :1] if first == 0 else z, ctx)
    return counter.sent_bytes, counter.exchanges, dict(counter.per_layer), model


def predict(workload, world: int, link: str) -> dict:
    name, family, frames, height, width, t1, t1_source = workload
    sent, exchanges, _, model = chunk_traffic(family, height, width, world)
    chunks = (frames - 1) // model.temporal_factor + 1
    bandwidth, fixed = LINKS[link]
    bands = Bands.split(height // model.spatial_factor, world)
    share = max(b - a for a, b in zip(bands.edges, bands.edges[1:])) / bands.latent_rows
    out_bytes = 2 * 3 * frames * height * width  # bf16 frames gathered on rank 0
    comm = chunks * (exchanges * fixed + sent / bandwidth) + out_bytes * (world - 1) / world / bandwidth
    band_shape = (1, model.latent_channels, chunks, max(1, round(share * height / model.spatial_factor)),
                  width // model.spatial_factor)
    peak = memory.estimate(model, clip_of(model, "decode", band_shape), 1, None, device="cuda", io_on_device=(False, False))
    return {"workload": name, "gpus": world, "link": link, "t1_s": round(t1, 2), "t1_source": t1_source,
            "compute_s": round(t1 * share, 3), "comm_s": round(comm, 3), "predicted_s": round(t1 * share + comm, 2),
            "speedup": round(t1 / (t1 * share + comm), 2), "sent_per_chunk_mb": round(sent / 1e6, 1),
            "exchanges_per_chunk": exchanges, "peak_gib_per_gpu": round(peak / 2**30, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", choices=["seedvr2", "wan21", "wan22"], help="bytes per layer of one chunk, 720p, 4 GPUs")
    args = parser.parse_args()
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, commit {git_commit() or 'unknown'}; "
          "times PREDICTED (no multi-GPU run), T1 from bench/RESULTS.md section 0 (one H100, bf16)")
    if args.layers:
        sent, exchanges, layers, _ = chunk_traffic(args.layers, 720, 1280, 4)
        print(f"{args.layers} 720x1280, 4 GPUs, busiest rank, one steady latent chunk: {sent / 1e6:.1f} MB in {exchanges} exchanges")
        for layer, n_bytes in sorted(layers.items(), key=lambda kv: -kv[1]):
            print(f"  {layer:48s} {n_bytes / 1e6:8.2f} MB")
        return
    print(f"peers: {PEERS}\n")
    print("| workload | T1 (1 H100) | link | " + " | ".join(f"{n} GPUs: s (speed-up)" for n in GPUS) +
          " | sent per chunk, 4 GPUs | GiB per GPU 1 / 2 / 4 / 8 |")
    print("|---|---|---|" + "---|" * len(GPUS) + "---|---|")
    rows = []
    for workload in WORKLOADS:
        single = models.meta_model(workload[1]).to(torch.bfloat16)
        sf = single.spatial_factor
        shape = (1, single.latent_channels, (workload[2] - 1) // 4 + 1, workload[3] // sf, workload[4] // sf)
        one_gpu = memory.estimate(single, clip_of(single, "decode", shape), 1, None, device="cuda",
                                  io_on_device=(False, False))
        for link in LINKS:
            cells = [predict(workload, n, link) for n in GPUS]
            rows += cells
            t1 = f"{workload[5]:.2f} s" + ("" if workload[6] == "measured" else " (scaled)")
            memory_cells = " / ".join([f"{one_gpu / 2**30:.1f}"] + [str(c["peak_gib_per_gpu"]) for c in cells])
            print(f"| {workload[0]} | {t1} | {link} | " + " | ".join(f"{c['predicted_s']} ({c['speedup']}x)" for c in cells) +
                  f" | {cells[1]['sent_per_chunk_mb']} MB in {cells[1]['exchanges_per_chunk']} exchanges | {memory_cells} |")
    print()
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
