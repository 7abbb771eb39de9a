"""LTX-2.5's diffusion-decoder VAE declared (`vae.model.family_spec`): its decoder runs in temporal chunks of
whole frames, its neighbourhood-attention windows looking ahead (so its frames come late, the last with the
clip's last chunk), never in exact tiles; the encoder is LTX-2's, chunked and tiled as LTX-2's. Its noise seed
is the config's `noise_seed` (`vae.load(config={"noise_seed": n})`; 0, the default, gives core's frames)."""
from ..family_spec import Bench, Capability, CardRow, Clip, CoreVAE, FamilySpec, LoadInteger, TinyModel
from ..ltx2.blocks import LTX2Config, LTXBlock
from .blocks import MAX_SEED, LTX25Config, swiglu_hidden
from .network import LTX25VAE

# The tiny test model: the released windows (11x11x11 in stage 5) and strides, the released latent channels
# (core's LTX VAEs hold 128-channel statistics), small widths; LTX-2's encoder block kinds at width 8.
TINY_ENCODER = LTX2Config(
    encoder_blocks=(LTXBlock("res_x"), LTXBlock("compress_space_res", multiplier=2), LTXBlock("compress_time_res", multiplier=2),
                    LTXBlock("res_x"), LTXBlock("compress_all_res", multiplier=2), LTXBlock("compress_all_res", multiplier=1),
                    LTXBlock("res_x")),
    encoder_channels=8, latent_log_var="constant", encoder_padding="zeros")
TINY_WIDTHS = (128, 64, 32, 32, 16)
TINY = LTX25Config(encoder=TINY_ENCODER, head_dim=16, stage_channels=TINY_WIDTHS, stage_depths=(1, 1, 1, 1, 2),
                   mlp_hidden=tuple(swiglu_hidden(c) for c in TINY_WIDTHS))

SPEC = FamilySpec(
    vae_class=LTX25VAE,
    config_class=LTX25Config,
    display_name="LTX-2.5 diffusion decoder",
    download="the LTX-2.5 checkpoint itself, or its split diffusion-decoder VAE",
    also=("LTX-2.4",),
    latent_channels=128,
    spatial_factor=32,
    temporal_factor=8,
    fps=24.0,
    fps_node="LTXVConditioning",
    tiny=TinyModel(config=TINY),
    # Load VAE's `decode_seed`: not `seed`, to which the frontend adds a "randomize after each run" widget
    load_choices=(LoadInteger("noise_seed", input="decode_seed", default=0, minimum=0, maximum=MAX_SEED, help=(
        "LTX-2.5 diffusion decoder: the seed of its decode noise; 0 = core's frames.")),),
    capabilities=frozenset({Capability.LOOKAHEAD, Capability.UNTILED_CHUNKS}),
    core=CoreVAE("comfy.ldm.lightricks.vae.na_diffusion_decoder", since="0.33.0"),
    # The decode's memory model: `python -m bench.calibrate_memory --untiled-chunks` (the meta-device count).
    bench=Bench(cards=(CardRow("LTX-2.5 720p, 121 frames, decode", "decode", Clip(121, 720, 1280)),
                       CardRow("LTX-2.5 1088p, 121 frames, decode", "decode", Clip(121, 1088, 1920)))),
)
