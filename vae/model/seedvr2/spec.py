"""SeedVR2's declaration (`vae.model.family_spec`): a video restorer's VAE, so no frame rate of its own (24
unless the source's is known); core's 4-D LATENT folds the frames into the channels; core's encoder pads
rather than crops."""
from ..family_spec import Bench, CardRow, Clip, ComfyLatent, CoreVAE, FamilySpec, OneGpuTime, TinyModel
from .network import SeedVR2Config, SeedVR2VAE

SPEC = FamilySpec(
    vae_class=SeedVR2VAE,
    config_class=SeedVR2Config,
    display_name="SeedVR2",
    download="ema_vae_fp16.safetensors",
    latent_channels=16,
    spatial_factor=8,
    temporal_factor=4,
    fps=24.0,
    tiny=TinyModel(fixture_config={"norm_num_groups": 8}),  # the released file's 32 groups do not divide 16 channels
    latent=ComfyLatent(folded_frames=True),
    core=CoreVAE("comfy.ldm.seedvr.vae", since="0.33.0", crops_input=False),
    bench=Bench(
        gpu=(Clip(21, 720, 1280), Clip(21, 1080, 1920)),
        dry=Clip(5, 64, 96),
        cards=(CardRow("SeedVR2 upscale to 1080p, decode", "decode", Clip(21, 1080, 1920)),
               CardRow("SeedVR2 upscale to 1080p, encode", "encode", Clip(21, 1080, 1920)),
               CardRow("SeedVR2 upscale to 4K, decode", "decode", Clip(21, 2160, 3840))),
        one_gpu=(OneGpuTime(Clip(21, 1080, 1920), 3.0, "measured"),
                 OneGpuTime(Clip(21, 2160, 3840), 3.0 * 4, "scaled from 21x1080x1920 3.0 s")),
    ),
)
