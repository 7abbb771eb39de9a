"""Qwen-Image 2.1's VAE (`qwen21`), an image VAE: its network."""
from .network import Qwen21Config, Qwen21VAE

__all__ = ["Qwen21Config", "Qwen21VAE"]
