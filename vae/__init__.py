"""StreamVAE library: checkpoint-exact, streaming causal video VAEs in pure torch (no ComfyUI).

    import vae
    m = vae.load("ema_vae_fp16.safetensors", device="cuda", dtype=torch.bfloat16)
    z = m.encode(video)        # B,3,T,H,W in [-1, 1] -> raw latent
    y = m.decode(z)            # -> B,3,T,H,W, not clamped

Families: SeedVR2 (`seedvr2`), detected from the checkpoint's keys.
"""
from .loading import CheckpointError, detect_family, load, read_checkpoint, save_checkpoint
from .model import VideoVAE
from .seedvr2 import SeedVR2Config, SeedVR2VAE

__all__ = [
    "CheckpointError",
    "SeedVR2Config",
    "SeedVR2VAE",
    "VideoVAE",
    "detect_family",
    "load",
    "read_checkpoint",
    "save_checkpoint",
]
