"""Wan2.2 TI2V-5B's VAE (`wan22`): its network."""
from .network import Wan22Config, Wan22VAE

__all__ = ["Wan22Config", "Wan22VAE"]
