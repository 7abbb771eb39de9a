"""ComfyUI 0.33.0's own MiniMax-H3 video VAE (`comfy/ldm/minimax/vae.py`, `MiniMaxH3VideoVAE`) on
StreamVAE's test checkpoints, in a process of its own (one ComfyUI per process, bench/core_vae.py), in
float32 on the CPU.

Core's Load VAE builds this VAE at the released widths only (comfy/sd.py), so each job builds core's
class at the file's widths, depth and heads, with the job's tiles, and loads the file strictly, as the
benchmarks do (`bench.core_vae.core_model`: the sizes StreamVAE's loader reads from the file's shapes).
Core's `decode` clamps its frames to [0, 1], which hides most of a decode with random weights; inputs
named `decode:` run core's decode with that clamp alone taken out (`CoreMiniMaxH3.frames`),
`decode_clamped:` core's decode as it is. `encode:` inputs give core's LATENT; `raw_decode:` (raw latents)
and `raw_encode:` inputs run the benchmarks' wrapper, StreamVAE's conventions (`CoreMiniMaxH3.decode`, `.encode`).
A job with `geometry` instead reports core's tile splits and output frame counts.

    python tests/comfy_support/core_minimax_h3.py jobs.json
    jobs: [{"checkpoint": path, "config": {"tile_size": px, "tile_overlap_min": px} or {}, "inputs": path,
            "outputs": path}]
          or [{"geometry": {"lengths": [...], "latent_frames": [...], "tiles": [[size, overlap], ...]},
               "outputs": path}]
    inputs: a safetensors file of tensors named decode:<name> (core's LATENTs), decode_clamped:<name>,
    raw_decode:<name> (raw latents), encode:<name> and raw_encode:<name> (videos in [-1, 1]); outputs: the same
    names, core's results.
"""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "comfy_support" / "stubs")]  # torchvision/torchaudio stand-ins

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from bench.core_vae import _import_core, core_model  # noqa: E402
from vae.loading import build_empty, read_shapes  # noqa: E402


def run(job: dict) -> None:
    config = build_empty(*read_shapes(job["checkpoint"]), config=job["config"])[0].config
    core = core_model("0.33.0", "minimax_h3", config, load_file(job["checkpoint"]), torch.float32)
    results = {}
    for name, value in load_file(job["inputs"]).items():
        op = name.split(":")[0]
        with torch.no_grad():
            run = {"encode": core.core.encode, "raw_encode": core.encode, "raw_decode": core.decode,
                   "decode": lambda x: core.frames(x, clamp=False), "decode_clamped": core.frames}[op]
            results[name] = run(value).contiguous()
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
