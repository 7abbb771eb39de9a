"""HunyuanVideo 1.5's declaration (`vae.model.family_spec`): its mid-block attention spans the clip (keys and
values kept, frame-causal), and unmasked as core computes it (a load choice) it first sees the whole clip."""
from ..family_spec import Bench, Capability, CardRow, Clip, CoreVAE, FamilySpec, LoadChoice, TinyModel
from .network import ATTENTION_MODES, Hv15Config, Hv15VAE

SPEC = FamilySpec(
    vae_class=Hv15VAE,
    config_class=Hv15Config,
    display_name="HunyuanVideo 1.5",
    download="hunyuanvideo15_vae_fp16.safetensors",
    latent_channels=32,
    spatial_factor=16,
    temporal_factor=4,
    fps=24.0,
    tiny=TinyModel(config=Hv15Config(block_out_channels=(16, 32, 32, 64, 64), layers_per_block=1)),
    load_choices=(LoadChoice("attention", ATTENTION_MODES, input="clip_attention", help=(
        "HunyuanVideo 1.5's attention across frames. causal = the trained model (exact); full = unmasked, as "
        "ComfyUI core computes it, to match core's output.")),),
    capabilities=frozenset({Capability.KV_CACHE, Capability.PREFILL}),
    core=CoreVAE("comfy.ldm.hunyuan_video.vae_refiner", since="0.3.75"),
    bench=Bench(
        gpu=(Clip(121, 720, 1280), Clip(121, 1080, 1920)),  # issue 41: its 6 and 8 GiB targets
        dry=Clip(5, 64, 96),
        cards=(CardRow("HunyuanVideo 1.5 720p, 121 frames, decode", "decode", Clip(121, 720, 1280)),
               CardRow("HunyuanVideo 1.5 1080p, 121 frames, decode", "decode", Clip(121, 1080, 1920))),
    ),
)
