"""Wan2.2 TI2V-5B's declaration (`vae.model.family_spec`); WanVideoWrapper's samplers hand out its latents
normalized."""
from ..family_spec import Bench, CardRow, Clip, ComfyLatent, CoreVAE, FamilySpec, OneGpuTime, TinyModel
from .network import Wan22Config, Wan22VAE

SPEC = FamilySpec(
    vae_class=Wan22VAE,
    config_class=Wan22Config,
    display_name="Wan2.2-TI2V-5B",
    download="wan2.2_vae.safetensors",
    latent_channels=48,
    spatial_factor=16,
    temporal_factor=4,
    fps=24.0,
    tiny=TinyModel(fixture_config={}),
    latent=ComfyLatent(wrapper_normalized=True),
    core=CoreVAE("comfy.ldm.wan.vae2_2", since="0.3.75"),
    bench=Bench(
        gpu=(Clip(81, 704, 1280),),
        dry=Clip(5, 64, 96),
        cards=(CardRow("Wan2.2-5B 720p, 121 frames, decode", "decode", Clip(121, 704, 1280)),),
        one_gpu=(OneGpuTime(Clip(81, 704, 1280), 3.24, "measured"),),
    ),
)
