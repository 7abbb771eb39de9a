"""How deep the library's Python is under one conv: the stack of the deepest conv call of an untiled decode.

    python -m bench.call_depth                 # tiny Wan2.1 (the reference fixture), 3 latent frames, 64x64 px
    python -m bench.call_depth --family seedvr2

Every C call into torch whose name holds "conv" (aten.mkldnn_convolution, F.conv3d, ...) during one
`vae.decode` (default Settings: untiled, one chunk; fixed default kernels, after a warm-up decode) is
caught with `sys.setprofile`, and the stack is walked from it up to `vae.decode`. The deepest such
stack is printed: its Python frames and their files (torch.nn's module calls included), the frames of
vae/ code and their files, and the frames in order. The structure, not the speed: the count is the
same on every machine (a tiny model runs the released config's code path).
"""
import argparse
import os
import sys

import torch

import vae
from bench import models
from vae import families

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(vae.__file__))), "")
VAE = os.path.dirname(os.path.abspath(vae.__file__)) + os.sep


def _stack(frame) -> list[tuple[str, str]]:
    """(file, function) of every Python frame from the outermost vae/ frame down to `frame`."""
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    out = out[::-1]
    start = next((i for i, (path, _) in enumerate(out) if path.startswith(VAE)), len(out))
    return [(path.split("site-packages/")[-1] if "site-packages/" in path else os.path.relpath(path, ROOT), name)
            for path, name in out[start:]]


def deepest_conv_stack(model, z: torch.Tensor) -> list[tuple[str, str]]:
    """The stack (`_stack`) of the deepest conv call of `vae.decode(model, z)`."""
    opts = vae.Optimizations(kernel_choice="defaults")
    vae.decode(model, z, opts=opts)  # one-time work (checks, caches) out of the way
    deepest: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        nonlocal deepest
        if event == "c_call" and "conv" in getattr(arg, "__name__", ""):
            here = _stack(frame)
            if len(here) > len(deepest):
                deepest = here

    sys.setprofile(profile)
    try:
        vae.decode(model, z, opts=opts)
    finally:
        sys.setprofile(None)
    return deepest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default=vae.Wan21VAE.family, choices=[spec.name for spec in families.SPECS])
    args = parser.parse_args()
    model = models.build(args.family, torch.float32, tiny=True)
    z = torch.randn(1, model.latent_channels, 3, 64 // model.spatial_factor, 64 // model.spatial_factor)
    stack = deepest_conv_stack(model, z)
    ours = [(path, name) for path, name in stack if path.startswith("vae/")]
    print(f"{args.family} untiled decode {tuple(z.shape)}: the deepest conv call is {len(stack)} Python frames over "
          f"{len({path for path, _ in stack})} files below vae.decode; {len(ours)} of them vae/ code over "
          f"{len({path for path, _ in ours})} files")
    for path, name in stack:
        print(f"  {path}:{name}")


if __name__ == "__main__":
    main()
