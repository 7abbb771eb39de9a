"""StreamVAE library: checkpoint-exact, streaming causal video VAEs in pure torch (no ComfyUI).

    import vae
    m = vae.load("ema_vae_fp16.safetensors", device="cuda", dtype=torch.bfloat16)
    z = vae.encode(m, video)   # B,3,T,H,W in [-1, 1] -> raw latent
    y = vae.decode(m, z)       # -> B,3,T,H,W, not clamped

Families, detected from the checkpoint's keys: SeedVR2 (`seedvr2`), Wan2.1 (`wan21`: Wan2.1 and Wan2.2
A14B, and the VAEs of its architecture at other sizes: Qwen-Image, RGBA Qwen-Image-Layered, pruned
widths, 2x upscale decoders), Wan2.2 (`wan22`: TI2V-5B), Qwen-Image 2.1 (`qwen21`, an image VAE),
HunyuanVideo 1.5 (`hv15`) and LTX-2 (`ltx2`: LTX-2 2.0/2.3/2.5 and LTX-Video 0.9.x, read straight out
of the full LTX-2 checkpoint), the Wan, HunyuanVideo and LTX files in upstream/ComfyUI or diffusers key
names, every size read from the shapes (each family's `checkpoint.py` in `vae/model/`). Encode takes
`m.in_channels` image channels (4: RGBA), decode gives `m.out_channels`, at `m.decode_upscale` times the encoded size.
`m.to_model_space(z)` / `m.from_model_space(z)` convert between raw latents and the latent the
diffusion model sees (SeedVR2 and HunyuanVideo 1.5 scaling; Wan per-channel (z - mean) / std).

Latents here are always raw. ComfyUI core's LATENTs differ for SeedVR2 and LTX: core's SeedVR2 VAE
returns `to_model_space(z)` (raw x 0.9152) and divides it out before decoding, core's LTX VAE
normalises by the checkpoint's per-channel statistics, while core's Wan and HunyuanVideo 1.5 LATENTs
are raw (their latent formats scale inside the model). `m.to_comfy_latent(z)` /
`m.from_comfy_latent(samples)` convert; the node pack and the CLI's latent files do so at their edges.

How a clip runs (temporal chunks, tiles, where the causal caches wait, memory budget) is asked for as
`vae.Settings` and decided as a `vae.Plan`, computed once: `p = vae.plan(m, "decode", z.shape,
vae.Settings(memory_budget="auto"))` shows it, and `vae.decode(m, z, p)` runs it (or pass the
settings to `decode` and it plans itself). Kernel choices are explicit too:
`vae.decode(m, z, opts=vae.Optimizations.straightforward())`. Several processes decode one clip
together with `vae.decode(m, z, settings, bands=vae.RowBands(group))` (torch.distributed).

`vae.decode_to_file(m, z, "clip.mp4")` / `vae.encode_from_file(m, "clip.mp4")` stream to and from video
files, so host memory does not grow with the clip's length (they need PyAV, imported on first use).

The public surface is this package's names and its modules `families` (the registered families' specs,
`vae/model/<family>/spec.py`), `loading`, `doctor`, `video_codecs`, `video_reader`, `video_writer`,
`video_file` and `kernels` (the switches: `Optimizations`, `BackendFlags`, `KernelLog`, `backend`,
`kernel_choice`, `attention`, `devices`); the node pack uses nothing else (tests/test_layering.py).
`model`, `run` and `distributed` are the library's inside.
"""
from .distributed.row_bands import RowBands
from .distributed.workers import RankWorkers
from .kernels import Optimizations
from .loading import CheckpointError, detect_family, load, read_checkpoint, save_checkpoint
from .model.hv15 import Hv15Config, Hv15VAE
from .model.ltx2 import LTX2VAE, LTX2Config
from .model.qwen21 import Qwen21Config, Qwen21VAE
from .model.seedvr2 import SeedVR2Config, SeedVR2VAE
from .model.video_vae import VideoVAE
from .model.wan21 import Wan21Config, Wan21VAE
from .model.wan22 import Wan22Config, Wan22VAE
from .run.compile import MODES as COMPILE_MODES
from .run.compile import CompileSettings, compile_blocks, dynamo_limits, run_with_fallback
from .run.engine import decode, encode
from .run.geometry import TILING_MODES, input_shape, is_4n1, latent_frames, pixel_frames, tiling_error
from .run.planning import BudgetTooSmall, Plan, Settings, budget_from_free, plan, refuse_over_budget
from .run.progress import Cancelled
from .run.run_warnings import collected as collected_warnings

__all__ = [
    "BudgetTooSmall",
    "COMPILE_MODES",
    "Cancelled",
    "CheckpointError",
    "CompileSettings",
    "Hv15Config",
    "Hv15VAE",
    "LTX2Config",
    "LTX2VAE",
    "Optimizations",
    "Plan",
    "Qwen21Config",
    "Qwen21VAE",
    "RankWorkers",
    "RowBands",
    "SeedVR2Config",
    "SeedVR2VAE",
    "Settings",
    "TILING_MODES",
    "VideoVAE",
    "Wan21Config",
    "Wan21VAE",
    "Wan22Config",
    "Wan22VAE",
    "budget_from_free",
    "collected_warnings",
    "compile_blocks",
    "decode",
    "decode_to_file",
    "detect_family",
    "dynamo_limits",
    "encode",
    "encode_from_file",
    "input_shape",
    "is_4n1",
    "latent_frames",
    "load",
    "pixel_frames",
    "plan",
    "read_checkpoint",
    "refuse_over_budget",
    "run_with_fallback",
    "save_checkpoint",
    "tiling_error",
]


def __getattr__(name: str):
    """The video-file functions, imported on first use: they need PyAV, the models do not."""
    if name in ("decode_to_file", "encode_from_file"):
        from . import video_file

        return getattr(video_file, name)
    raise AttributeError(f"module 'vae' has no attribute {name!r}")
