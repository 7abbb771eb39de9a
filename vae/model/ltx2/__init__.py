"""LTX-2's VAE (`ltx2`, with LTX-Video 0.9.x): its network, its blocks, and how its checkpoints are read
(`checkpoint.py`)."""
from .blocks import LTX2Config
from .network import LTX2VAE

__all__ = ["LTX2Config", "LTX2VAE"]
