"""Stand-in for torchvision, put on the PYTHONPATH of the test ComfyUI server only.

PyPI's torchvision wheels are CUDA-linked and fail to import next to the CPU torch build
(docs/comfyui.md section 1, pitfall 1). ComfyUI core imports torchvision at startup but only uses it
for models we never run (Cascade, Cosmos, ACE), so importing must succeed and any real use must fail
loudly.
"""

import sys
import types


class _Unavailable(types.ModuleType):
    """A module whose every attribute lookup raises: the import works, real use does not."""

    def __getattr__(self, name):
        if name.startswith("__"):  # keep import machinery and introspection working
            raise AttributeError(name)
        raise RuntimeError(f"{self.__name__}.{name} is unavailable: torchvision is a test stand-in here")


__version__ = "0.0.0+streamvae.stub"
for _name in ("transforms", "models"):
    _module = _Unavailable(f"{__name__}.{_name}")
    sys.modules[_module.__name__] = _module  # so `import torchvision.transforms` also resolves
    globals()[_name] = _module
