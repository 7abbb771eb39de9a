"""torchvision.transforms stand-in."""
from _streamvae_standin import names_of

__getattr__ = names_of(__name__)
from . import functional  # noqa: E402,F401
