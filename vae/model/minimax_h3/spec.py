"""MiniMax-H3's declaration (`vae.model.family_spec`): its tiles and clips are the model's own (core's 256 px
tiles and 17-frame clips, blended), so the engine hands it the whole clip and takes its output clip by clip
(`ClipExtent.OWN_TILES`), with the network's frame counts (`MiniMaxH3VAE.frames_made`); the plan says how many
of its tiles run at once and whether its decoder's blocks stream from host memory.

Core's module (`CoreVAE`) is the one bench.core_vae builds at the config's widths; GPU and CPU bench workloads
are not declared (bench/bench_minimax_h3.py races it against core on the CPU on its own); its bench rows are the
card table's.
Its memory calibration (memory_calibration.json, CPU and CUDA) covers its encode and decode."""
from ..family_spec import Bench, Capability, CardRow, Clip, CoreVAE, FamilySpec, TinyModel
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
    core=CoreVAE("comfy.ldm.minimax.vae", since="0.33.0"),
    bench=Bench(cards=(CardRow("MiniMax-H3 720p, 241 frames, decode", "decode", Clip(241, 720, 1280)),)),
)
