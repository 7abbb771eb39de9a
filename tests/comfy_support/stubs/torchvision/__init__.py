"""torchvision stand-in (see _streamvae_standin.py)."""
from _streamvae_standin import names_of

__getattr__ = names_of(__name__)
__version__ = "0.0.0+streamvae.standin"
from . import models, ops, transforms  # noqa: E402,F401  (attributes of the package, as in torchvision)
