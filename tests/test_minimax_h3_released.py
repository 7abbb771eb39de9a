"""MiniMax-H3 at its released widths (2.6 B parameters: a 6-level encoder of 128-1024 channels, two residual
blocks each, and a decoder of 36 blocks of 2048 channels, 32 heads of 64), seeded random weights in one real
safetensors file in the released key layout (core's names; float32, 10.4 GB): StreamVAE (`vae.load`, float32,
CPU, through `vae.decode` and `vae.encode`) against ComfyUI 0.33.0's own `MiniMaxH3VideoVAE`
(comfy/ldm/minimax/vae.py) loading the same file in a process of its own, within 1e-4 x max(1, |ref|).

The smallest inputs with core's own tiles and clips: a decode of one clip (7 latent frames -> 22 frames)
of 272 x 32 px, which core cuts into 2 x 1 of its 256 px tiles (240 px of overlap, 229 tokens each), and
an encode of one 17-frame clip of the same size (2 x 1 tiles, 2 latent frames). Tile grids, clip counts,
odd sizes and padded clips run the same code at every width: test_minimax_h3_core.py, at reduced widths.

One float32 copy of the weights on the machine: the file, written a tensor at a time, and mapped into
memory by both processes (safetensors' `load_file`), core's first (`bench.core_vae.core_model`
takes float32 tensors as they are), then this one's: `vae.load` of the file's tensors keeps them as they
are. The weights are page-cache pages, which the kernel can drop and read again, not 10.4 GB of each
process's own memory (two such copies, or one beside a benchmark, run a 24 GiB machine out of memory).
Measured (`/usr/bin/time -v python -m pytest -q --run-heavy tests/test_minimax_h3_released.py`, 2 cores of
an Intel Xeon with AVX-512 and native bf16, 24 GiB, shared with another engineer's benchmarks, load average
about 4): 4 min 9 s (writing the file about 70 s, core about 86 s, StreamVAE's load, decode and encode about
88 s); maximum RSS 11.4 GB, of which each process's own memory peaked at 1.1 GB (this one) and 0.8 GB
(core's), sampled every 2 s, and the rest the mapped file's pages (10.1 GB).
A first version, in which each process cast a bf16 file to its own float32 copy, had core's process killed
by the kernel for memory while a benchmark beside it held 13 GB."""
import json
import math
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import vae
from minimax_h3_fixtures import NEAR_ONE, core_input, core_outputs, run_core, skip_without_core
from reference import assert_exact, cut_pool
from vae.model.minimax_h3 import MiniMaxH3Config, MiniMaxH3VAE

pytestmark = pytest.mark.heavy  # minutes of CPU and 10 GB of RAM: run once per version of its code (tests/heavy.py)

POOL = 16_777_259  # drawn values the weights are cut from (a length no layer's rows divide)
# name -> input: core's LATENT (decode) or a video in [-1, 1] (encode); 272 x 32 px is 2 x 1 of core's tiles
CASES = {"decode:2x1 tiles, 1 clip": (1, 24, 7, 17, 2), "encode:2x1 tiles, 1 clip": (1, 3, 17, 272, 32)}


def released_shapes() -> dict[str, tuple[int, ...]]:
    """The released network's state dict (core's key names): name -> shape, in the network's order."""
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in MiniMaxH3VAE(MiniMaxH3Config()).state_dict().items()}


def released_weights(shapes: dict[str, tuple[int, ...]], seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights of `shapes` (`released_shapes`), float32, a tensor at a time, of unit-ish gain so
    that activations stay O(1) through 36 blocks: weights of fan-in n uniform with standard deviation n^-1/2
    (the register tokens 1), biases 0.1, norm scales and the residual branches' scales 1 + 0.1, each tensor
    cut at a random offset from one pool of drawn values (drawing 2.6 B values would take much of the
    test's time; the weights still differ from row to row and layer to layer); the latent statistics near
    core's kind."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.empty(POOL).uniform_(-3 ** 0.5, 3 ** 0.5, generator=g)  # unit variance
    for name, shape in shapes.items():
        w = cut_pool(pool, math.prod(shape), int(torch.randint(POOL, (1,), generator=g))).view(shape)
        if name == "latents_mean":
            w = 0.1 * torch.randn(shape, generator=g)
        elif name == "latents_std":
            w = 1 + 0.2 * torch.rand(shape, generator=g)
        elif name.endswith(NEAR_ONE):
            w.mul_(0.1).add_(1)
        elif len(shape) > 1:
            w.mul_(1 if name == "decoder.register_tokens" else math.prod(shape[1:]) ** -0.5)
        else:
            w.mul_(0.1)
        yield name, w


def write_safetensors(path: Path, shapes: dict[str, tuple[int, ...]],
                      tensors: Iterable[tuple[str, torch.Tensor]]) -> Path:
    """A float32 safetensors file of `shapes`, written a tensor at a time as `tensors` yields them (in the
    same order): 8 bytes of header length, the JSON header padded to 8 bytes, the tensors' bytes. The
    library's `save_file` needs every tensor in memory at once (10.4 GB here)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as file:
        file.write(len(text).to_bytes(8, "little") + text)
        for (name, tensor), expected in zip(tensors, shapes, strict=True):
            assert name == expected and tuple(tensor.shape) == shapes[name] and tensor.dtype == torch.float32, name
            file.write(tensor.contiguous().numpy().data)
    return path


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """(the config StreamVAE read, the inputs, core's outputs, StreamVAE's), no weights kept."""
    skip_without_core()
    folder = tmp_path_factory.mktemp("minimax-h3-released")
    path = folder / "minimax-h3-vae.safetensors"
    shapes = released_shapes()
    write_safetensors(path, shapes, released_weights(shapes, seed=51))
    inputs = {name: core_input(name.split(":")[0], shape, seed=60 + i) for i, (name, shape) in enumerate(CASES.items())}
    save_file(inputs, str(folder / "in.safetensors"))
    job = {"checkpoint": str(path), "config": {}, "inputs": str(folder / "in.safetensors"),
           "outputs": str(folder / "out.safetensors")}
    run_core([job], folder)
    expected = core_outputs(job)
    ours = vae.load(load_file(str(path)))  # the file's tensors mapped, as core's are: one copy, the page cache's
    got = {}
    for name, given in inputs.items():
        if name.startswith("encode:"):
            got[name] = ours.to_comfy_latent(vae.encode(ours, given))
        else:
            got[name] = (vae.decode(ours, ours.from_comfy_latent(given)) + 1) / 2  # core's frames, before its clamp
    config = ours.config
    del ours
    shutil.rmtree(folder)  # 10.4 GB: CI's disk is shared by the whole run
    return config, inputs, expected, got


def test_the_released_config_is_read(released):
    assert released[0] == MiniMaxH3Config()


@pytest.mark.parametrize("case", list(CASES))
def test_released_widths_match_core(released, case):
    _, inputs, expected, got = released
    assert got[case].shape == expected[case].shape
    assert expected[case].abs().max() > 0.1 and expected[case].std() > 0.05  # O(1) frames, not a vanished signal
    print(f"{case}: max |ours - core| {(got[case] - expected[case]).abs().max().item():.1e}, "
          f"max |core| {expected[case].abs().max().item():.2f}")
    assert_exact(got[case], expected[case], atol=1e-4)
