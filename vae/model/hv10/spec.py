"""HunyuanVideo 1.0's declaration (`vae.model.family_spec`), which Kandinsky 5 and 6 decode with: its GroupNorms
take their statistics over the whole clip (gathered in passes before a clip runs in chunks), its mid-block attention spans the clip (keys and
values kept, frame-causal), and as core computes it (a load choice) it first sees the whole clip."""
from ..family_spec import Bench, Capability, CardRow, Clip, CoreVAE, FamilySpec, LoadChoice, TinyModel
from .network import FRAMES, Hv10Config, Hv10VAE

SPEC = FamilySpec(
    vae_class=Hv10VAE,
    config_class=Hv10Config,
    display_name="HunyuanVideo 1.0 / Kandinsky",
    also=("Kandinsky 5", "Kandinsky 6"),
    download="hunyuan_video_vae_bf16.safetensors",
    latent_channels=16,
    spatial_factor=8,
    temporal_factor=4,
    fps=24.0,
    # 32 norm groups as released (no weight says it), so every width is a multiple of 32
    tiny=TinyModel(config=Hv10Config(block_out_channels=(32, 32, 32, 32), layers_per_block=1, latent_channels=4)),
    load_choices=(LoadChoice("frames", FRAMES, input="hunyuan_frames", help=(
        "HunyuanVideo 1.0 / Kandinsky: model = the trained network, norms over the whole clip (exact); "
        "core = core's chunked norms and unmasked attention.")),),
    capabilities=frozenset({Capability.CLIP_STATISTICS, Capability.KV_CACHE, Capability.PREFILL}),
    core=CoreVAE("comfy.ldm.models.autoencoder", since="0.33.0"),
    bench=Bench(gpu=(Clip(129, 720, 1280), Clip(129, 1088, 1920)),  # issue 52: its 8 and 12 GiB targets
                dry=Clip(5, 64, 96),
                cards=(CardRow("HunyuanVideo 1.0 / Kandinsky 720p, 129 frames, decode", "decode", Clip(129, 720, 1280)),
                       CardRow("HunyuanVideo 1.0 / Kandinsky 1088p, 129 frames, decode", "decode", Clip(129, 1088, 1920)))),
)
