"""Calibrate the memory model (each family's vae/model/<family>/memory_calibration.json) by measuring peak memory.

    python -m bench.calibrate_memory                    # all families, CPU (peak RSS) or CUDA
    python -m bench.calibrate_memory --families seedvr2 --check
    python -m bench.calibrate_memory --modes caches      # only the causal-cache profiles (seconds)
    python -m bench.calibrate_memory --families hv15 --meta  # CUDA streamed decode from the meta-device count
    python -m bench.calibrate_memory --own-tiles         # a decode over the model's own tiles (meta count)
    python -m bench.calibrate_memory --untiled-chunks    # a decode in temporal chunks of whole frames (meta count)

On the CPU each measurement runs one encode/decode of the full released config (random weights,
float32) in a fresh process (bench.memory_worker) and records the activation peak of the call
after a warm-up (which leaves the CPU Winograd filter cache resident; `vae.run.memory` computes that
from the weights): peak RSS of live tensors (VmHWM reset after the model, buffers and warm-up). On
CUDA one process per family measures every point (the allocator's statistics are exact per call):
the caching allocator's reserved peak (cuDNN workspaces and fragmentation included), at larger
sizes and in the precision a GPU runs by default (decode bf16, encode fp32).
A least-squares fit of activations / element size = per_pixel * chunk pixel-frames
+ per_tile_pixel * tile pixel-frames + fixed (all in elements) gives the coefficients `vae.run.memory` uses; the causal
caches' share of that (`vae.run.memory.cache_profile`: elements per video pixel, all and the largest, from
a short run of the same model) is stored too, for plans that offload them. `--check` compares the
stored model with fresh measurements at other sizes instead.
"""
import argparse
import json

import torch

import vae
from bench import models
from bench.common import run_worker
from vae import families
from vae.model.family_spec import Capability
from vae.run import memory
from vae.kernels.backend import DTYPES

FAMILIES = models.FAMILIES
# (video size in pixels, tile in pixels or None); 5 frames with temporal_chunk 1, so the measured
# peak is that of a steady 4-frame chunk. "streamed": frames streamed one at a time, the caches and
# the waiting frames offloaded (disk on the CPU, pinned host memory on CUDA).
FIT_POINTS = {
    "untiled": [(96, None), (160, None)],
    "exact": [(96, 48), (128, 64), (160, 64)],
    "streamed": [(128, 64), (256, 64), (256, 128), (320, 96)],
}
CHECK_POINTS = {"untiled": [(128, None), (224, None)], "exact": [(160, 48), (256, 128)], "fast": [(160, 64), (256, 128)],
                "streamed": [(192, 96), (384, 128)]}
CUDA_FIT_POINTS = {"untiled": [(256, None), (512, None)], "exact": [(384, 128), (512, 192), (640, 256)],
                   "streamed": [(512, 256), (768, 256), (768, 512), (1024, 512)]}
CUDA_CHECK_POINTS = {"untiled": [(384, None), (768, None)], "exact": [(768, 256)], "fast": [(768, 256)],
                     "streamed": [(1024, 256)]}
CUDA_DTYPES = {"decode": "bf16", "encode": "fp32"}


def points(family: str, mode: str, check: bool, cuda: bool) -> list:
    """The (size, tile) points a mode is fitted on (or checked at) for a family on this device type: on the
    CPU the family's own where its spec has them (`Calibration`: LTX-2's, with the reasons), else the above."""
    if cuda:
        return (CUDA_CHECK_POINTS if check else CUDA_FIT_POINTS)[mode]
    own = families.spec(family).bench.calibration
    table = (own.check_points if check else own.points) or (CHECK_POINTS if check else FIT_POINTS)
    return table[mode]


def point_spec(family: str, op: str, size: int, tile, mode: str, device: str) -> dict:
    own = families.spec(family).bench.calibration
    spec = dict(family=family, op=op, frames=own.frames, height=size, width=size, tile_size=tile,
                tiling="fast" if mode == "fast" else "exact", temporal_chunk=1, device=device,
                drop_other_half=own.decoder_only, kept_stage_bytes=0)  # a chunk's peak: no statistics pass keeps
    if mode == "streamed":
        # The default kernels: streamed frames in small tiles make many distinct conv shapes, and
        # measuring each (kernel_choice.py) would take most of the calibration.
        spec.update(stream_frames=True, cache_offload="disk" if torch.device(device).type == "cpu" else "host",
                    kernel_choice="defaults")
    return spec


class Measurer:
    """Measurements of one family: a fresh process per point on the CPU, one model in this process
    on CUDA (built on first use, in the op's GPU default precision)."""

    def __init__(self, family: str, device: str):
        self.family, self.device, self.model = family, device, None

    def __call__(self, op: str, size: int, tile, mode: str) -> dict:
        spec = point_spec(self.family, op, size, tile, mode, self.device)
        if torch.device(self.device).type != "cuda":
            return run_worker("bench.memory_worker", spec)
        from bench.memory_worker import measure

        if self.model is None:
            self.model = models.build(self.family, torch.float32, self.device)
        self.model.set_dtypes(**{op: DTYPES[CUDA_DTYPES[op]]})
        result = measure(self.model, spec)
        result["peak_bytes"] += memory.weight_bytes(self.model)  # resident before `measure` began
        return result

    def element_size(self, op: str) -> int:
        """Bytes per activation element of the runs (the model's coefficients count elements)."""
        return 2 if torch.device(self.device).type == "cuda" and CUDA_DTYPES[op] == "bf16" else 4


# The coefficients of each mode, in the order of `features` (then "fixed").
COEFFICIENTS = {"untiled": ("per_pixel",), "exact": ("per_pixel", "per_tile_pixel"),
                "streamed": ("per_pixel", "per_tile_pixel"), "own_tiles": memory.OWN_TILE_COEFFICIENTS,
                "untiled_chunks": memory.UNTILED_CHUNK_COEFFICIENTS}


def features(mode: str, size: int, tile, chunk_frames: int = 4) -> list[float]:
    """What the mode's coefficients multiply (`vae.run.memory.estimate`): pixels of a chunk (`chunk_frames`
    pixel frames: the temporal factor times the latent frames the plan ran per chunk, one unless the family
    sees the whole clip) and of its tile; streamed, of one frame and of its tile."""
    if mode == "streamed":
        side = min(tile or size, size)
        return [size * size, side * side]
    return [chunk_frames * size * size, chunk_frames * min(tile, size) ** 2 if tile else 0.0][:len(COEFFICIENTS[mode])]


def sample(family: str, op: str, mode: str, size: int, tile, result: dict, element_size: int) -> tuple[list, float]:
    """One measurement (`bench.memory_worker`'s result) as a point of the fit: (features, activation elements the
    coefficients must give). The chunk is the plan's: one latent frame, or the whole clip's where the family sees
    it whole (`memory.estimate` counts `temporal_factor` pixel frames per latent frame of the plan's chunk)."""
    chunk_frames = models.meta_model(family).temporal_factor * result["temporal_chunk"]
    fitted = result["activation_bytes"] / element_size - known_elements(family, op, mode, size, tile)
    return features(mode, size, tile, chunk_frames), fitted


def known_elements(family: str, op: str, mode: str, size: int, tile) -> float:
    """What the model computes rather than fits: streamed, the offloaded caches' bands on the device
    (`memory.cache_band_elements`: the running conv's old and new band of rows)."""
    if mode != "streamed":
        return 0.0
    largest = memory.coefficients(family, op, "caches", "cpu")["largest"]
    return memory.cache_band_elements(largest, min(tile or size, size), size)


def fit(samples: list[tuple[list[float], float]], mode: str) -> dict:
    """Non-negative least squares for act = the mode's coefficients . features + fixed (all in elements):
    the best fit over every subset of the terms whose solution is non-negative (at most 16 subsets).
    Clipping a plain fit's negative terms to 0 instead would leave the others fitted to a model that
    is not the one stored."""
    names = (*COEFFICIENTS[mode], "fixed")
    a = torch.tensor([[*x, 1.0] for x, _ in samples], dtype=torch.float64)
    y = torch.tensor([[v] for _, v in samples], dtype=torch.float64)
    best, best_error = {name: 0.0 for name in names}, float(y.square().sum())
    for mask in range(1, 2 ** len(names)):
        used = [i for i in range(len(names)) if mask >> i & 1]
        sol = torch.linalg.lstsq(a[:, used], y).solution.flatten()
        if bool((sol < 0).any()):
            continue
        error = float((a[:, used] @ sol.view(-1, 1) - y).square().sum())
        if error < best_error:
            best, best_error = {name: 0.0 for name in names}, error
            best.update({names[i]: float(v) for i, v in zip(used, sol)})
    return {"per_tile_pixel": 0.0, **best}


def fit_above(samples: list[tuple[list[float], float]], mode: str, elements) -> dict:
    """`fit`, its fixed term then raised until no sample is predicted (`elements(entry, features)`) under its
    count: for a peak that is the larger of two phases, which one linear model does not follow."""
    entry = fit(samples, mode)
    entry["fixed"] += max(0.0, *(count - elements(entry, features) for features, count in samples))
    return entry


# HunyuanVideo 1.5's CPU points (5 frames, up to 320 px) peak at one transient: the 0.9 GB weight reorder
# of its 1024 -> 8192 channel upsampler conv at latent resolution, above the streamed activations of those
# sizes, so they fit no per-pixel term and would predict a 720p frame's 2.5 GiB of live tensors as none.
# `--meta` fits a family's CUDA streamed decode coefficients to the meta-device count of the GPU code path
# at the target sizes instead (bench.meta_peak: live tensors, bf16), keeping the CPU's fixed term where the CPU
# has one (HunyuanVideo 1.0's streamed CPU points take an hour: every point runs its statistics passes).
META_POINTS = [((720, 1280), 128), ((720, 1280), 256), ((720, 1280), None), ((1088, 1920), 256), ((1088, 1920), None)]


def meta_streamed(family: str) -> dict:
    """The streamed decode coefficients from `META_POINTS` counted on the meta device (a point without a
    tile: one frame-sized tile, residual blocks conv by conv, as an untiled streamed plan runs)."""
    from bench.meta_peak import count

    largest = memory.coefficients(family, "decode", "caches", "cpu")["largest"]
    samples = []
    for (height, width), tile in META_POINTS:
        side = tile or max(height, width)
        live = count(family, "decode", height, width, side, chain=tile is not None)
        rows, cols = min(side, height), min(side, width)
        samples.append(([height * width, rows * cols], live.peak / 2 - memory.cache_band_elements(largest, rows, width)))
        print(f"{family} decode streamed {height}x{width} tile {tile}: {live.peak / 2**30:.2f} GiB live (meta)", flush=True)
    entry = fit(samples, "streamed")
    if memory.calibration_source(family, "decode", "streamed", "cpu") == "measured":
        entry["fixed"] = max(entry["fixed"], memory.coefficients(family, "decode", "streamed", "cpu")["fixed"])
    return {**entry, "source": "meta"}


# `--own-tiles`: the encode and decode of a family that runs its own tiles (`ClipExtent.OWN_TILES`), counted on
# the meta device through the engine (bench.meta_peak.own_tiles_peak: the code path's live tensors, the released
# network, attention as flash attention) for each device type in its precision (the CPU float32; CUDA as
# CUDA_DTYPES): no CPU run of the released network (10 GB in float32) at 720p fits the machine beside core's.
# Points: (height, width), frames (latent frames of a decode, 7: one clip, 12: two; pixel frames of an
# encode, 17 a clip), tiles at a time, weights streamed. A run's peak is the larger of two phases (the tiles'
# run, the clip's blend) where the model adds terms: its fixed term is raised until no point is predicted
# under its count.
OWN_TILE_POINTS = {
    "decode": [((368, 640), 7, 1, False), ((480, 864), 7, 2, False), ((480, 864), 7, 15, False),
               ((720, 1280), 7, 1, False), ((720, 1280), 7, 4, False), ((720, 1280), 7, 16, False),
               ((720, 1280), 12, 1, False), ((1088, 1920), 7, 1, False), ((480, 864), 12, 1, True),
               ((720, 1280), 7, 4, True)],
    "encode": [((368, 640), 17, 1, False), ((480, 864), 34, 1, False), ((480, 864), 34, 3, False),
               ((720, 1280), 34, 1, False), ((720, 1280), 34, 4, False), ((1088, 1920), 17, 1, False)],
}


def own_tiles_entry(family: str, op: str, device_type: str) -> dict:
    """The "own_tiles" coefficients of `family`'s `op` on `device_type`, fitted to `OWN_TILE_POINTS`' counts."""
    from bench.meta_peak import own_tiles_peak

    model = models.meta_model(family)
    dtype = DTYPES[CUDA_DTYPES[op]] if device_type == "cuda" else torch.float32
    samples = []
    for (height, width), frames, batch, streamed in OWN_TILE_POINTS[op]:
        sf = model.spatial_factor
        shape = ((1, model.latent_channels, frames, height // sf, width // sf) if op == "decode"
                 else (1, model.in_channels, frames, height, width))
        settings = vae.Settings(own_tile_batch=batch, stream_weights=streamed)
        plan, peak = own_tiles_peak(family, op, shape, settings, dtype)
        features = memory.own_tile_features(model.own_tile_work(op, shape), plan.own_tiles)
        samples.append((features, peak / (torch.finfo(dtype).bits // 8)))
        print(f"{family} {op} own tiles {height}x{width}, {frames} frames in, {plan.own_tiles}: "
              f"{peak / 2**30:.3f} GiB live ({device_type} {dtype}, meta)", flush=True)
    return {**fit_above(samples, "own_tiles", memory.own_tile_elements), "source": "meta"}


# `--untiled-chunks`: the decode of a family in temporal chunks of whole frames (`ClipExtent.UNTILED_CHUNKS`:
# LTX-2.5), its layers' state on the device and offloaded, counted on the meta device through the engine
# (bench.meta_peak.untiled_chunks_count: the code path's live tensors, the released network) for each device
# type in its precision: its NA blocks keep about their windows' frames, so the peak follows a chunk's frames,
# one frame's and the clip's (the noise) in proportions no single size shows, and from about 512 px its blocks
# compute in bands of rows (`BAND_TOKENS`), so the points reach 1080p. Points: (height, width), pixel frames,
# latent frames per chunk. The fixed term is raised until no point is predicted under its count.
UNTILED_CHUNK_POINTS = [((256, 256), 65, 1), ((256, 256), 33, 2), ((512, 512), 65, 1), ((512, 512), 49, 2),
                        ((640, 640), 81, 1), ((576, 1024), 97, 2), ((736, 1280), 65, 1), ((736, 1280), 121, 1),
                        ((736, 1280), 49, 2), ((960, 1664), 73, 1), ((1088, 1920), 121, 1), ((1088, 1920), 41, 2)]


def untiled_chunks_entry(family: str, device_type: str, offloaded: bool, points=None) -> dict:
    """The "untiled_chunks" (or "untiled_chunks_offloaded") decode coefficients of `family` on `device_type`,
    fitted to the counts of `points` (default `UNTILED_CHUNK_POINTS`)."""
    from bench.meta_peak import untiled_chunks_count

    model = models.meta_model(family)
    dtype = DTYPES[CUDA_DTYPES["decode"]] if device_type == "cuda" else torch.float32
    offload = ("host" if device_type == "cuda" else "disk") if offloaded else "none"
    samples = []
    for (height, width), frames, chunk in points or UNTILED_CHUNK_POINTS:
        settings = vae.Settings(temporal_chunk=chunk, cache_offload=offload)
        plan, live = untiled_chunks_count(family, height, width, frames, dtype, settings)
        samples.append((memory.untiled_chunk_features(model, plan.clip, chunk), live.peak / (torch.finfo(dtype).bits // 8)))
        print(f"{family} decode {frames}x{height}x{width}, {chunk} latent frame(s) a chunk, caches {offload}: "
              f"{live.peak / 2**30:.3f} GiB live ({device_type} {dtype}, meta)", flush=True)
    entry = fit_above(samples, "untiled_chunks", memory.untiled_chunk_elements)
    return {**{name: entry[name] for name in (*memory.UNTILED_CHUNK_COEFFICIENTS, "fixed")}, "source": "meta"}


def save(device_type: str, family: str, op: str, mode: str, entry: dict) -> None:
    """Merge one fitted entry into the family's calibration file (in its folder) as it is now (other runs may
    write it too)."""
    path = memory.calibration_path(family)
    table = json.loads(path.read_text()) if path.is_file() else {}
    table.setdefault(device_type, {}).setdefault(op, {})[mode] = entry
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {family} {op} {mode} to {path}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--ops", nargs="+", default=["decode", "encode"])
    parser.add_argument("--modes", nargs="+", default=None, choices=[*CHECK_POINTS, "caches"],
                        help="default: untiled, exact (fitted) and caches; with --check untiled, exact and fast")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--check", action="store_true", help="compare predictions with measurements at new sizes")
    parser.add_argument("--meta", action="store_true", help="only the CUDA streamed decode coefficients, from the "
                        "meta-device count (META_POINTS; after the CPU calibration)")
    parser.add_argument("--own-tiles", action="store_true", help="only the coefficients of families that run their "
                        "own tiles, CPU and CUDA, from the meta-device count (OWN_TILE_POINTS)")
    parser.add_argument("--untiled-chunks", action="store_true", help="only the decode coefficients of families in "
                        "temporal chunks of whole frames, CPU and CUDA, caches on the device and offloaded, from the "
                        "meta-device count (UNTILED_CHUNK_POINTS)")
    args = parser.parse_args()
    if args.untiled_chunks:
        for family in (f for f in args.families if Capability.UNTILED_CHUNKS in families.spec(f).capabilities):
            for device_type in ("cpu", "cuda"):
                for offloaded in (False, True):
                    mode = "untiled_chunks_offloaded" if offloaded else "untiled_chunks"
                    save(device_type, family, "decode", mode, untiled_chunks_entry(family, device_type, offloaded))
        return
    if args.own_tiles:
        for family in (f for f in args.families if families.spec(f).capabilities & {Capability.OWN_TILES}):
            for op in args.ops:
                for device_type in ("cpu", "cuda"):
                    save(device_type, family, op, "own_tiles", own_tiles_entry(family, op, device_type))
        return
    if args.meta:
        for family in args.families:
            save("cuda", family, "decode", "streamed", meta_streamed(family))
        return
    device_type = torch.device(args.device).type
    args.modes = args.modes or list(CHECK_POINTS if args.check else [*FIT_POINTS, "caches"])
    cuda = device_type == "cuda"
    for family in args.families:
        if Capability.OWN_TILES in families.spec(family).capabilities:  # its own modes: --own-tiles
            print(f"{family}: runs its own tiles, calibrated with --own-tiles", flush=True)
            continue
        chunked = Capability.UNTILED_CHUNKS in families.spec(family).capabilities  # its decode: --untiled-chunks
        ops = [op for op in args.ops if not (chunked and op == "decode")]
        if "caches" in args.modes and not args.check:
            model = models.build(family, torch.float32, args.device)
            for op in ops:
                save(device_type, family, op, "caches", memory.cache_profile(model, op))
            del model
        measure = Measurer(family, args.device)
        for op in ops:
            for mode in (m for m in args.modes if m != "caches"):
                samples = []
                for size, tile in points(family, mode, args.check, cuda):
                    result = measure(op, size, tile, mode)
                    if not args.check:  # "fast" is checked, never fitted
                        samples.append(sample(family, op, mode, size, tile, result, measure.element_size(op)))
                    line = f"{family} {op} {mode} {size}px tile {tile}: activations {result['activation_bytes'] / 2**20:.1f} MiB"
                    if args.check and result["predicted_bytes"] is None:
                        line += ", not calibrated (the plan predicts nothing)"
                    elif args.check:
                        line += f", predicted total {result['predicted_bytes'] / 2**20:.1f} MiB vs measured {result['peak_bytes'] / 2**20:.1f} MiB" \
                                f" ({100 * (result['predicted_bytes'] / result['peak_bytes'] - 1):+.1f}%)"
                    print(line, flush=True)
                if not args.check:
                    save(device_type, family, op, mode, fit(samples, mode))


if __name__ == "__main__":
    main()
