"""torchvision.models stand-in."""
from _streamvae_standin import names_of

__getattr__ = names_of(__name__)
from . import optical_flow  # noqa: E402,F401
