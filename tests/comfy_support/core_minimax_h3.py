"""ComfyUI 0.33.0's own MiniMax-H3 video VAE (`comfy/ldm/minimax/vae.py`, `MiniMaxH3VideoVAE`) on
StreamVAE's test checkpoints, in a process of its own (one ComfyUI per process, bench/core_vae.py), in
float32 on the CPU.

Core's Load VAE builds this VAE at the released widths only (comfy/sd.py), so each job builds core's
class at the file's widths, with its decoder at the file's depth and heads, and loads the file strictly
(`bench.bench_minimax_h3.build_core`).
Core's `decode` clamps its frames to [0, 1], which hides most of a decode with random weights; inputs
named `decode:` run core's decode with that clamp alone taken out (its `_finalize_pixels` without
`clamp_`), `decode_clamped:` core's decode as it is. `encode:` inputs give core's LATENT.
A job with `geometry` instead reports core's tile splits and output frame counts.

    python tests/comfy_support/core_minimax_h3.py jobs.json
    jobs: [{"checkpoint": path, "config": {...}, "inputs": path, "outputs": path}]
          or [{"geometry": {"lengths": [...], "latent_frames": [...], "tiles": [[size, overlap], ...]},
               "outputs": path}]
    inputs: a safetensors file of tensors named decode:<name> (core's LATENTs), decode_clamped:<name>
    and encode:<name> (videos in [-1, 1]); outputs: the same names, core's results.
"""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "comfy_support" / "stubs")]  # torchvision/torchaudio stand-ins

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from bench.bench_minimax_h3 import build_core  # noqa: E402
from bench.core_vae import _import_core  # noqa: E402


def _unclamped(core):
    """Core's `_finalize_pixels` less its clamp to [0, 1]."""
    def finalize(part):
        return part * core.pixel_std.to(device=part.device, dtype=torch.float32) + core.pixel_mean.to(
            device=part.device, dtype=torch.float32)

    return finalize


def run(job: dict) -> None:
    core = build_core(job["config"], load_file(job["checkpoint"]))
    stock = core._finalize_pixels
    results = {}
    for name, value in load_file(job["inputs"]).items():
        op = name.split(":")[0]
        with torch.no_grad():
            if op == "encode":
                results[name] = core.encode(value).contiguous()
                continue
            core._finalize_pixels = stock if op == "decode_clamped" else _unclamped(core)
            results[name] = core.decode(value).contiguous()
    save_file(results, job["outputs"])


def geometry(job: dict) -> None:
    """Core's `split_tiles` for each length and (tile, overlap), and `decode_output_shape`'s frames."""
    import comfy.ldm.minimax.vae as core_vae

    spec, out = job["geometry"], {"split": {}, "frames": {}}
    for size, overlap in spec["tiles"]:
        core = core_vae.MiniMaxH3VideoVAE(ch=32, ch_mult=(1,) * 6, num_res_blocks=1, tile_size=size,
                                          tile_overlap_min=overlap)
        out["split"][f"{size}/{overlap}"] = {n: core.split_tiles(n) for n in spec["lengths"]}
    out["frames"] = {t: core.decode_output_shape((1, 24, t, 1, 1))[2] for t in spec["latent_frames"]}
    Path(job["outputs"]).write_text(json.dumps(out))


if __name__ == "__main__":
    _import_core("0.33.0", "comfy.ldm.minimax.vae", cpu=True)
    for job in json.loads(Path(sys.argv[1]).read_text()):
        if "geometry" in job:
            geometry(job)
        else:
            run(job)
