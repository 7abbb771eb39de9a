"""MiniMax-H3 against ComfyUI 0.33.0's own `MiniMaxH3VideoVAE` (comfy/ldm/minimax/vae.py), loaded by core and by
`vae.load` from the same real safetensors file (core's key names), seeded random weights at the tiny model's
reduced widths, run through the public API (`vae.encode`, `vae.decode`): encode (core's LATENT) and decode (core's
frames = (y + 1) / 2, compared before core's clamp, and once with it) within 1e-4 x max(1, |ref|), and the
benchmarks' wrapper of core's VAE (`bench.core_vae.CoreMiniMaxH3`, raw latents in and out, frames in [-1, 1])
against `vae.decode` and `vae.encode` as they are, over tile grids from 1x1 to 4x3, 1 to 3 clips, odd sizes, a
padded last clip, one and two latent frames, batch 2; and core's tile splits and output frame counts against
`tiles.py` for every length and latent length in range. Core's tiles are 256 px with 64 px of overlap; smaller
tiles (64 px, 32 px overlap: core's constructor takes them) reach larger grids cheaply.

Core runs in a process of its own (one ComfyUI per process); it needs the 0.33.0 tree of .ci/setup, so the module
runs in CI's second lane (about 90 s on 2 shared cores: core's process is most of it).
"""
import json

import pytest
from safetensors.torch import save_file

from minimax_h3_fixtures import SMALL, core_input, core_outputs, load, model, run_core, save, skip_without_core
from reference import assert_exact
import vae
from vae.model.minimax_h3.tiles import decode_plan, split_axis

pytestmark = pytest.mark.comfy  # runs ComfyUI 0.33.0's own VAE: CI's second lane (.ci/run)

TILES = {"t256": (256, 64), "t64": (64, 32)}
# name -> (tiles, op, input shape): decode takes core's LATENT B,24,T',h,w, encode pixels B,3,T,H,W
CASES = {
    "decode 2x1 tiles, 1 clip": ("t256", "decode", (1, 24, 7, 20, 16)),
    "decode 1 latent frame, odd": ("t256", "decode", (1, 24, 1, 5, 3)),
    "decode 4x3 tiles, 2 clips, odd": ("t64", "decode", (1, 24, 12, 9, 7)),
    "decode 1x2 tiles, 3 clips, padded, batch 2": ("t64", "decode", (2, 24, 14, 3, 5)),
    "decode 2 latent frames": ("t64", "decode", (1, 24, 2, 6, 4)),
    "decode_clamped 1x2 tiles": ("t64", "decode_clamped", (1, 24, 7, 4, 6)),
    "encode 1 frame, 2x1 tiles": ("t256", "encode", (1, 3, 1, 272, 48)),
    "encode 2 clips, odd": ("t256", "encode", (1, 3, 22, 48, 32)),
    "encode 3 clips": ("t64", "encode", (1, 3, 39, 32, 48)),
    "encode 1 clip, padded, 2x3 tiles": ("t64", "encode", (1, 3, 7, 96, 112)),
    "raw_decode 2x2 tiles, 2 clips": ("t64", "raw_decode", (1, 24, 9, 6, 6)),
    "raw_encode 2 clips, 2x1 tiles": ("t64", "raw_encode", (1, 3, 22, 96, 48)),
}
GEOMETRY = {"lengths": list(range(16, 4097, 16)), "latent_frames": list(range(1, 81)), "tiles": list(TILES.values())}


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    """(our model per tile setting, the inputs, core's outputs), every case in one core process."""
    skip_without_core()
    folder = tmp_path_factory.mktemp("minimax-h3-core")
    checkpoint = save(model(SMALL, seed=3), folder / "small.safetensors")
    ours, jobs = {}, [{"geometry": GEOMETRY, "outputs": str(folder / "geometry.json")}]
    inputs = {key: {} for key in TILES}
    for i, (name, (key, op, shape)) in enumerate(CASES.items()):
        inputs[key][f"{op}:{name}"] = core_input(op, shape, seed=100 + i)
    for key, (size, overlap) in TILES.items():
        ours[key] = load(checkpoint, size, overlap)
        save_file(inputs[key], str(folder / f"{key}-in.safetensors"))
        jobs.append({"checkpoint": str(checkpoint), "config": {"tile_size": size, "tile_overlap_min": overlap},
                     "inputs": str(folder / f"{key}-in.safetensors"), "outputs": str(folder / f"{key}-out.safetensors")})
    run_core(jobs, folder)
    outputs = {key: core_outputs(job) for key, job in zip(TILES, jobs[1:])}
    return ours, inputs, outputs, json.loads((folder / "geometry.json").read_text())


@pytest.mark.parametrize("case", list(CASES))
def test_matches_core(core, case):
    ours, inputs, outputs = core[:3]
    key, op, _ = CASES[case]
    m, given, expected = ours[key], inputs[key][f"{op}:{case}"], outputs[key][f"{op}:{case}"]
    if op == "encode":
        got = m.to_comfy_latent(vae.encode(m, given))
    elif op.startswith("raw_"):  # the benchmarks' wrapper: StreamVAE's own conventions
        got = vae.encode(m, given) if op == "raw_encode" else vae.decode(m, given)
    else:
        got = (vae.decode(m, m.from_comfy_latent(given)) + 1) / 2
        if op == "decode_clamped":
            got = got.clamp(0, 1)
    assert got.shape == expected.shape
    assert_exact(got, expected, atol=1e-4)


@pytest.mark.parametrize("tiles", list(TILES.values()), ids=list(TILES))
def test_tile_splits_are_cores(core, tiles):
    size, overlap = tiles
    for length, (starts, sizes, overlaps) in core[3]["split"][f"{size}/{overlap}"].items():
        axis = split_axis(int(length), size, overlap, SMALL.spatial_factor)
        assert (list(axis.starts), [axis.size] * len(axis.starts), list(axis.overlaps)) == (starts, sizes, overlaps), length


def test_output_frames_are_cores(core):
    assert {t: decode_plan(int(t), SMALL).frames for t in core[3]["frames"]} == {t: int(n) for t, n in core[3]["frames"].items()}
