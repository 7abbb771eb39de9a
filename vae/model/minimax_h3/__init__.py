"""MiniMax-H3 video VAE (family "minimax_h3"): core 0.33.0's `MiniMaxH3VideoVAE` (comfy/ldm/minimax/vae.py)
with its key names. `network.py`: `MiniMaxH3VAE`; `config.py`: its config and core's constants;
`checkpoint.py`: every size read from the weights; `causal_cnn.py`, `vit3d.py`: encoder and decoder;
`tiles.py`: the model's own tiles and clips, a pure geometry; `tiled.py`: the network run over them.
"""
from .config import MiniMaxH3Config
from .network import MiniMaxH3VAE

__all__ = ["MiniMaxH3Config", "MiniMaxH3VAE"]
