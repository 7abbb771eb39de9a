"""Qwen-Image 2.1's declaration (`vae.model.family_spec`): an image VAE (temporal factor 1, every frame its
own image), RGBA; no core VAE to compare with (core does not load it), no GPU workload yet."""
from ..family_spec import FamilySpec, TinyModel
from .network import Qwen21Config, Qwen21VAE

SPEC = FamilySpec(
    vae_class=Qwen21VAE,
    config_class=Qwen21Config,
    display_name="Qwen-Image 2.1",
    download="qwen_image_2.1_vae_bf16.safetensors",
    latent_channels=64,
    spatial_factor=16,
    temporal_factor=1,
    fps=24.0,
    tiny=TinyModel(config=Qwen21Config(dim=8, dec_dim=12)),
)
