"""HunyuanVideo 1.0 / Kandinsky 5 and 6 (`hv10`): the network (`network.py`, `blocks.py`; its GroupNorms are
the shared whole-clip `model.clip_norm.ClipGroupNorm`), how its checkpoints are read (`checkpoint.py`), its
spec (`spec.py`) and its memory coefficients (`memory_calibration.json`)."""
from .network import Hv10Config, Hv10VAE

__all__ = ["Hv10Config", "Hv10VAE"]
