"""What the networks are: `VideoVAE` (video_vae.py) and the families (seedvr2, wan21, wan22, qwen21, ltx2),
their blocks and layers, and how checkpoint shapes map to their configs (`*_layout.py`).

The model knows nothing of how it is run: its blocks take the run's `execution.RunState` and ask
its declared `Execution` strategy for tiles or bands. It imports only `vae.kernels`, never `vae.run`.
"""
from .video_vae import LayoutError, Stage, VideoVAE, run_stages

__all__ = ["LayoutError", "Stage", "VideoVAE", "run_stages"]
