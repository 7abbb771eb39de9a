"""MiniMax-H3's declaration (`vae.model.family_spec`): its tiles and clips are the model's own (core's 256 px
tiles and 17-frame clips, blended), so the engine runs it over the whole clip in one chunk, untiled
(`ClipExtent.WHOLE_CLIP`), with the network's frame counts (`MiniMaxH3VAE.frames_made`).

Not declared yet: core's module (`CoreVAE`: bench.core_vae does not build core 0.33.0's `comfy.ldm.minimax.vae`;
tests/test_minimax_h3_core.py and bench/bench_minimax_h3.py build it themselves), bench workloads (`Bench`:
bench/bench_minimax_h3.py races it against core on the CPU on its own). Its CPU memory calibration
(memory_calibration.json) covers the decode; the plan ignores a budget for its encode, saying so."""
from ..family_spec import Capability, FamilySpec, TinyModel
from .config import MiniMaxH3Config
from .network import MiniMaxH3VAE

# The tiny test model: 6 encoder levels of 32-64 channels, one residual block each; a 2-layer decoder of 2 heads
# of 64 (core's tiles; its parity tests load it with smaller ones, `vae.load(config=...)`, to reach larger grids).
TINY = MiniMaxH3Config(base_channels=32, multipliers=(1, 1, 1, 1, 1, 2), res_blocks=(1,) * 6, dim=128, layers=2)

SPEC = FamilySpec(
    vae_class=MiniMaxH3VAE,
    config_class=MiniMaxH3Config,
    display_name="MiniMax-H3",
    download="the MiniMax-H3 video VAE (bf16 or fp32; not the int8 file)",
    latent_channels=24,
    spatial_factor=16,
    temporal_factor=4,
    fps=24.0,  # core 0.33.0's MiniMax-H3 nodes (comfy_extras/nodes_minimax_h3.py): "Frame count at 24 fps"
    tiny=TinyModel(config=TINY),
    capabilities=frozenset({Capability.OWN_TILES}),
)
