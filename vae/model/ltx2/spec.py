"""LTX-2's declaration (`vae.model.family_spec`): also the VAE of LTX-Video 0.9.x; its decoder's convs look
ahead a frame; the frame rate is the one its LTXVConditioning asks for (24 where unknown); its CPU memory
calibration needs larger clips than the others'."""
from ..family_spec import Bench, Calibration, Capability, CardRow, Clip, CoreVAE, FamilySpec, TinyModel
from .blocks import LTX2Config, LTXBlock
from .network import LTX2VAE

# The tiny test model: the released block list at small widths (the released latent channels, factors and
# 128-channel statistics, which core's LTX VAE holds).
TINY = LTX2Config(
    encoder_blocks=tuple(LTXBlock(name, multiplier=2 if name != "res_x" else 1) for name in (
        "res_x", "compress_space_res", "res_x", "compress_time_res", "res_x", "compress_all_res", "res_x",
        "compress_all_res", "res_x")),
    decoder_blocks=tuple(LTXBlock(name, multiplier=2 if name != "res_x" else 1, residual=name != "res_x")
                         for name in ("res_x", "compress_all", "res_x", "compress_all", "res_x", "compress_all", "res_x")),
    encoder_channels=8, decoder_channels=64)

# CPU calibration: latent cells are 32 px (sizes and tiles multiples of 32, tiles of at least 64 px) and a
# latent frame is 8 pixel frames; the decoder's convs look ahead, so most of a short clip comes out with its
# last chunk (streamed a chunk at a time): 4 latent frames (25 pixel frames) make a chunk's peak. oneDNN's
# copy of its largest conv weight (the first depth-to-space conv, 0.42 GiB in fp32) is a fixed peak that
# hides the per-pixel terms below about 320 px, so its points are larger (a process holds 8-9 GiB at 448
# px: the weights, their Winograd transforms, the caches); the encoder alone is 2.6 GiB in fp32.
CALIBRATION = Calibration(
    frames=25,
    points={"untiled": [(384, None), (448, None)], "exact": [(384, 128), (448, 128), (448, 192)],
            "streamed": [(384, 128), (448, 128), (448, 192), (384, 192)]},
    check_points={"untiled": [(416, None)], "exact": [(416, 160)], "fast": [(416, 160)], "streamed": [(416, 160)]},
    decoder_only=True)

SPEC = FamilySpec(
    vae_class=LTX2VAE,
    config_class=LTX2Config,
    display_name="LTX-2",
    download="the LTX-2 checkpoint itself, or its split video VAE",
    also=("LTX-Video",),
    latent_channels=128,
    spatial_factor=32,
    temporal_factor=8,
    fps=24.0,
    fps_node="LTXVConditioning",
    tiny=TinyModel(config=TINY),
    capabilities=frozenset({Capability.LOOKAHEAD}),
    core=CoreVAE("comfy.ldm.lightricks.vae.causal_video_autoencoder", since="0.33.0"),
    bench=Bench(
        gpu=(Clip(121, 720, 1280), Clip(241, 1088, 1920)),
        dry=Clip(17, 64, 96),
        cards=(CardRow("LTX-2 720p, 241 frames, decode", "decode", Clip(241, 720, 1280)),
               CardRow("LTX-2 1088p, 241 frames, decode", "decode", Clip(241, 1088, 1920)),
               CardRow("LTX-2 4K, 121 frames, decode", "decode", Clip(121, 2176, 3840))),
        calibration=CALIBRATION,
    ),
)
