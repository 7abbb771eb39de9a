"""Wan2.1's VAE (`wan21`) and the Wan-architecture VAEs at other sizes it covers: its network."""
from .network import Wan21Config, Wan21VAE

__all__ = ["Wan21Config", "Wan21VAE"]
