"""SeedVR2's VAE (`seedvr2`): its network."""
from .network import SeedVR2Config, SeedVR2VAE

__all__ = ["SeedVR2Config", "SeedVR2VAE"]
