"""LTX-2.5's VAE with the diffusion decoder (`ltx25`): its network (`network.py`), its config and decoder
blocks (`blocks.py`), and how its checkpoints are read (`checkpoint.py`)."""
from .blocks import LTX25Config
from .network import LTX25VAE

__all__ = ["LTX25Config", "LTX25VAE"]
