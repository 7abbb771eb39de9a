"""Wan2.1's declaration (`vae.model.family_spec`): also the VAE of Wan2.2-A14B and Qwen-Image (and the other
variants of its architecture, `checkpoint.py` of vae/model/wan); WanVideoWrapper's samplers hand out its
latents normalized."""
from ..family_spec import Bench, CardRow, Clip, ComfyLatent, CoreVAE, FamilySpec, OneGpuTime, TinyModel
from .network import Wan21Config, Wan21VAE

SPEC = FamilySpec(
    vae_class=Wan21VAE,
    config_class=Wan21Config,
    display_name="Wan2.1",
    download="wan_2.1_vae.safetensors, or Qwen-Image's qwen_image_vae.safetensors and its RGBA Layered one",
    also=("Wan2.2-A14B", "Qwen-Image"),
    latent_channels=16,
    spatial_factor=8,
    temporal_factor=4,
    fps=16.0,
    tiny=TinyModel(fixture_config={}),
    latent=ComfyLatent(wrapper_normalized=True),
    core=CoreVAE("comfy.ldm.wan.vae", since="0.3.75"),
    bench=Bench(
        gpu=(Clip(81, 480, 832), Clip(81, 720, 1280)),
        dry=Clip(5, 64, 96),
        cards=(CardRow("Wan2.1 720p, 81 frames, decode", "decode", Clip(81, 720, 1280)),
               CardRow("Wan2.1 1080p, 81 frames, decode", "decode", Clip(81, 1080, 1920))),
        one_gpu=(OneGpuTime(Clip(81, 720, 1280), 1.47 * (720 * 1280) / (480 * 832), "scaled from 81x480x832 1.47 s"),
                 OneGpuTime(Clip(81, 480, 832), 1.47, "measured")),
    ),
)
