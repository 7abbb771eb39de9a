"""What every module of the torchvision and torchaudio stand-ins is made of.

The stand-ins sit first on the PYTHONPATH of the test ComfyUI servers only. PyPI has no CPU builds of
torchvision or torchaudio that match the CPU torch here (CONTRIBUTING.md), yet ComfyUI
imports both at start-up (0.33.0: `torchvision.ops.roi_align`, `torchvision.transforms.functional`,
`torchvision.models.optical_flow`, `torchaudio.functional`, ...) for models a VAE test never runs.
So every module is real and importable, every name in it can be imported, and any use of a name
(calling it, or anything reached through it) raises ImportError naming the stand-in.
"""


class Unavailable:
    """A name from a stand-in module: attribute chains resolve (`InterpolationMode.BICUBIC` as a
    default argument), calling anything raises ImportError."""

    def __init__(self, qualified_name: str):
        self._qualified_name = qualified_name

    def __getattr__(self, name: str):
        if name.startswith("__"):  # keep pickling, copying and introspection honest
            raise AttributeError(name)
        return Unavailable(f"{self._qualified_name}.{name}")

    def __call__(self, *args, **kwargs):
        package = self._qualified_name.split(".")[0]
        raise ImportError(f"{self._qualified_name} is unavailable: {package} is a test stand-in in this server "
                          "(no CPU build of it matches the CPU torch)")

    def __repr__(self) -> str:
        return f"<stand-in {self._qualified_name}>"


def names_of(module_name: str):
    """A module-level `__getattr__` (PEP 562) for the stand-in module `module_name`."""

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Unavailable(f"{module_name}.{name}")

    return __getattr__
