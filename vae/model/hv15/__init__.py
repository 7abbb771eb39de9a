"""HunyuanVideo 1.5's VAE (`hv15`): its network, and how its checkpoints are read (`checkpoint.py`)."""
from .network import Hv15Config, Hv15VAE

__all__ = ["Hv15Config", "Hv15VAE"]
