"""The LTX-2.5 diffusion-decoder VAE at its released widths (0.74 B parameters: LTX-2's encoder at base 128,
the 2.5 block list; a decoder of stages 2048, 1024, 512, 512 and 256 channels wide, 4, 6, 4, 2 and 8 blocks,
heads of 64), seeded random weights in real safetensors files in the released key layout (core's names,
upstream's `CausalDiffusionVAE` config in the metadata `config` -> `vae`; float32, 2.9 GB each): a split VAE
file and a full LTX-2.5 checkpoint (the same tensors under `vae.`, beside a diffusion model's, an audio VAE's
and a vocoder's). StreamVAE (`vae.load` of each file, float32, CPU, through `vae.decode` and `vae.encode`)
against ComfyUI 0.33.0's own `CausalDiffusionVAE` (with comfy-kitchen's `na3d` and `rms_rope_`) loading
the same files in a process of its own (tests/comfy_support/core_ltx25.py), within 1e-4 x max(1, |ref|).

The smallest inputs that reach stage 5's 11 x 11 x 11 windows with their border shifts on every axis: a
decode of a latent 1 x 128 x 3 x 2 x 2 with core's seed (0, core's own `decode`) to 17 frames of 64 x 64
(stage 5's grid 17 x 16 x 16), and an encode of 17 frames of 64 x 64. Other windows, strides, seeds and
sampling run the same code at every width: test_ltx25_core.py, at reduced widths.

The weights are drawn a tensor at a time and written straight into the split file; the full checkpoint is
that file's tensor bytes copied as they are under a header that renames them `vae.*` (the other models'
tensors after them). No process holds more than one float32 copy of its own: core's maps each file (its
loader) and copies it into its model, this one reads each file's tensors into the model `vae.load` builds,
one file at a time.
Measured (`/usr/bin/time -v python -m pytest -q --run-heavy tests/test_ltx25_released.py`, 2 cores of an
Intel Xeon with AVX-512 and native bf16, 24 GiB, shared with other engineers' jobs): 1 min 35 s at load
average 1.4 before the run (75 s user, 52 s system); 3 min 25 s at load average 3.5-4.8 (pytest starting and
writing both files about 80 s, core on both about 78 s, StreamVAE's loads, decodes and encodes about 43 s,
its first use measuring the kernel choices); 4 min 58 s at 4.3-5.2.
Maximum RSS 6.2 GB: core's process, 3.3 GB of its own memory and 2.9 GB of the mapped file's pages; this
one's peaked at 3.4 GB (3.3 GB its own: one file's weights), sampled every 2 s. Worst errors: decode 9.5e-5
(|core| up to 4.5), encode 6e-6 (|core| up to 1.3), the same for both files."""
import json
import math
import shutil
from collections.abc import Iterator
from itertools import chain
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import vae
from bench.core_vae import TREES
from comfy_support import environment
from ltx2_fixtures import close
from ltx25_fixtures import metadata, run_core
from reference import cut_pool
from vae.model.ltx25 import LTX25Config, LTX25VAE

# minutes of CPU and GB of RAM: run once per version of its code (tests/heavy.py); core's comfy-kitchen
# comes with the 0.33.0 tree of .ci/setup, as for test_ltx25_core.py (CI's second lane)
pytestmark = [pytest.mark.heavy, pytest.mark.comfy]

POOL = 16_777_259  # drawn values the weights are cut from (a length no layer's rows divide)
DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16"}
COPY = 1 << 26  # bytes copied at a time from the split file into the full checkpoint
# A full LTX-2.5 checkpoint's other models, a tensor each (as ltx25_fixtures.save_full_checkpoint has them)
OTHER_MODELS = {"model.diffusion_model.patchify_proj.weight": torch.zeros(1024, dtype=torch.bfloat16),
                "audio_vae.encoder.conv_in.conv.weight": torch.zeros(8, 2, 3, 3),
                "vocoder.conv_pre.weight": torch.zeros(4, 8, 7)}
# The latent statistics a released file holds beside the network's, which core keeps but does not use
UNUSED_STATISTICS = {"per_channel_statistics.channel": torch.arange(128, dtype=torch.float32),
                     "per_channel_statistics.mean-of-stds": torch.ones(128)}
FILES = ("split", "full")
OPS = ("decode:0", "encode")


def released_shapes() -> dict[str, tuple[int, ...]]:
    """The released network's state dict (core's names): name -> shape, in the network's order."""
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in LTX25VAE(LTX25Config()).state_dict().items()}


def released_weights(shapes: dict[str, tuple[int, ...]], seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of `shapes`, float32, a tensor at a time, drawn as ltx25_fixtures.model draws the small
    ones (activations O(1) through every stage): matrices and conv kernels of unit gain (fan-in n, standard
    deviation n^-1/2), the modulation tables and biases 0.1, RMS gains 1 + 0.1, q/k norm gains 2 + 0.5 (each
    query's softmax peaked, so a window off by one position changes the frames), the latent statistics near
    (0, 1); each tensor cut at a random offset from one pool of drawn values of unit variance (drawing 0.74 B
    values would take much of the test's time; the weights still differ from row to row and layer to layer)."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.empty(POOL).uniform_(-3 ** 0.5, 3 ** 0.5, generator=g)
    for name, shape in shapes.items():
        w = cut_pool(pool, math.prod(shape), int(torch.randint(POOL, (1,), generator=g))).view(shape)
        if name == "per_channel_statistics.std-of-means":
            w.mul_(0.1).add_(1.1)  # 1.1 +- 0.17
        elif name.endswith(("q_norm.weight", "k_norm.weight")):
            w.mul_(0.5).add_(2)
        elif name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight")):
            w.mul_(0.1).add_(1)
        elif len(shape) > 1 and not name.endswith("scale_shift_table"):
            w.mul_(math.prod(shape[1:]) ** -0.5)
        else:
            w.mul_(0.1)
        yield name, w


def _bytes(tensor: torch.Tensor) -> memoryview:
    return tensor.contiguous().view(-1).view(torch.uint8).numpy().data


def _entries(tensors: dict[str, tuple[torch.dtype, tuple[int, ...]]], offset: int = 0) -> dict[str, dict]:
    """Safetensors header entries of `tensors` (name -> dtype, shape), their bytes in this order from `offset`."""
    entries = {}
    for name, (dtype, shape) in tensors.items():
        size = dtype.itemsize * math.prod(shape)
        entries[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    return entries


def _write_header(file, entries: dict[str, dict], meta: dict[str, str]) -> None:
    """8 bytes of header length, then the JSON header padded to 8 bytes; the tensors' bytes follow."""
    text = json.dumps({"__metadata__": meta, **entries}).encode()
    text += b" " * (-len(text) % 8)
    file.write(len(text).to_bytes(8, "little") + text)


def write_split(path: Path, seed: int) -> Path:
    """The split VAE file, written a tensor at a time as `released_weights` draws them (safetensors'
    `save_file` needs every tensor in memory at once)."""
    network = released_shapes()
    shapes = {**network, **{k: tuple(t.shape) for k, t in UNUSED_STATISTICS.items()}}
    tensors = chain(released_weights(network, seed), UNUSED_STATISTICS.items())
    with open(path, "wb") as file:
        _write_header(file, _entries({k: (torch.float32, s) for k, s in shapes.items()}), metadata(LTX25Config()))
        for (name, tensor), expected in zip(tensors, shapes, strict=True):
            assert name == expected and tuple(tensor.shape) == shapes[name], name
            file.write(_bytes(tensor))
    return path


def write_full_checkpoint(split: Path, path: Path) -> Path:
    """The full checkpoint of the split file's VAE: its header's tensors renamed `vae.*` at the same offsets
    and the other models' after them, its metadata, its tensor bytes copied as they are, then the others'."""
    with open(split, "rb") as source, open(path, "wb") as file:
        header = json.loads(source.read(int.from_bytes(source.read(8), "little")))
        meta = header.pop("__metadata__")
        end = max(entry["data_offsets"][1] for entry in header.values())
        others = _entries({k: (t.dtype, tuple(t.shape)) for k, t in OTHER_MODELS.items()}, end)
        _write_header(file, {**{f"vae.{k}": entry for k, entry in header.items()}, **others}, meta)
        shutil.copyfileobj(source, file, COPY)
        for tensor in OTHER_MODELS.values():
            file.write(_bytes(tensor))
    return path


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """(core's outputs, StreamVAE's and the config StreamVAE read, each per file), no weights kept."""
    environment.require((TREES["0.33.0"].path / "comfy").is_dir(), f"ComfyUI 0.33.0 at {TREES['0.33.0'].path}")
    folder = tmp_path_factory.mktemp("ltx25-released")
    split = write_split(folder / "ltx-2.5-vae.safetensors", seed=52)
    files = {"split": split, "full": write_full_checkpoint(split, folder / "ltx-2.5.safetensors")}
    g = torch.Generator().manual_seed(9)
    inputs = {"decode:0": torch.randn(1, 128, 3, 2, 2, generator=g),
              "encode": torch.rand(1, 3, 17, 64, 64, generator=g) * 2 - 1}
    save_file(inputs, str(folder / "in.safetensors"))
    jobs = [{"checkpoint": str(path), "inputs": str(folder / "in.safetensors"),
             "outputs": str(folder / f"{name}-out.safetensors")} for name, path in files.items()]
    core = dict(zip(files, run_core(jobs, folder)))
    got, configs = {}, {}
    for name, path in files.items():
        ours = vae.load(path)
        configs[name] = ours.config
        got[name] = {"decode:0": vae.decode(ours, inputs["decode:0"]), "encode": vae.encode(ours, inputs["encode"])}
        del ours
    shutil.rmtree(folder)  # 5.9 GB: CI's disk is shared by the whole run
    return core, got, configs


@pytest.mark.parametrize("file", FILES)
def test_the_released_config_is_read(released, file):
    assert released[2][file] == LTX25Config()


@pytest.mark.parametrize("file, op", [(f, op) for f in FILES for op in OPS])
def test_released_widths_match_core(released, file, op):
    core, got, _ = released
    expected = core[file][op]
    assert expected.shape == ((1, 3, 17, 64, 64) if op.startswith("decode") else (1, 128, 3, 2, 2))
    assert expected.abs().max() > 0.1 and expected.std() > 0.05  # O(1) outputs, not a vanished signal
    error = close(got[file][op], expected, 1e-4)
    print(f"{file} {op}: max |ours - core| {error:.1e}, max |core| {expected.abs().max().item():.2f}")
