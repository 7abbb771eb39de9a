"""`FamilySpec`: what a family declares once, in its folder (`vae/model/<family>/spec.py`), for everything
outside its network to read: the registry (`vae/families.py`), the nodes, the command line, the benchmarks
and the tests. A new family is a folder with its network, its checkpoint reading and its spec, and a line
in the registry (docs/families.md, "Adding a family").

The network class (`vae_class`, a `VideoVAE`) keeps what a run and a checkpoint need of it: its name
(`VideoVAE.family`, the registry's key, which the spec reads), its stages, its detection (`probe_keys`,
`native_state_dict`, `refusal`: the code that knows the key layout) and its LATENT scaling
(`comfy_latent_in_model_space`: LTX-2's needs the weights' statistics). What the engine derives from the
modules (a conv that looks ahead, a frame-causal attention, stages that see the whole clip first) the spec
declares as capabilities; tests/test_families.py checks the two agree, for every registered family.
"""
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class Capability(enum.Enum):
    """What a family asks of the engine beyond a causal network run chunk by chunk, each derived by the
    engine from the model through the `VideoVAE` method named."""

    # layers read frames ahead: its last frames come with the clip's last chunk (`looks_ahead`)
    LOOKAHEAD = "lookahead"
    KV_CACHE = "kv_cache"  # a frame-causal attention keeps the clip's keys and values (`attention_cache_elements`)
    PREFILL = "prefill"  # stages that see every frame before the clip runs, under a load choice (`prefill_stages`)
    # temporal chunks of whole frames, never exact tiles (`clip_extent` is `ClipExtent.UNTILED_CHUNKS`)
    UNTILED_CHUNKS = "untiled_chunks"
    # stages that see the whole clip in one call: one chunk, untiled (`clip_extent` is `ClipExtent.WHOLE_CLIP`)
    WHOLE_CLIP = "whole_clip"
    # the model runs the whole clip over its own tiles and clips, streaming its output clip by clip, a batch of
    # tiles at a time, its weights resident or streamed (`clip_extent` is `OWN_TILES`: `own_tile_pieces`)
    OWN_TILES = "own_tiles"
    # norms over the whole clip: chunks once passes gathered their statistics (`clip_extent` is
    # `CHUNKS_AFTER_STATISTICS`, or `WHOLE_CLIP`)
    CLIP_STATISTICS = "clip_statistics"


@dataclass(frozen=True)
class LoadChoice:
    """A config value no weight says, chosen when loading (`vae.load(config={field: value})`), that a front end
    offers as its input `input` with `values`, the config's default first; `help` says what it chooses."""

    field: str
    values: tuple[str, ...]
    input: str
    help: str

    @property
    def default(self) -> str:
        return self.values[0]


@dataclass(frozen=True)
class LoadInteger:
    """A config integer no weight says, chosen when loading (`vae.load(config={field: value})`), that a front
    end offers as its input `input`, from `minimum` to `maximum`, `default` the config's (a noise seed);
    `help` says what it sets. A family's `load_choices` hold both kinds, in the order its inputs appear."""

    field: str
    input: str
    help: str
    default: int
    minimum: int
    maximum: int


@dataclass(frozen=True)
class ComfyLatent:
    """How the family's LATENTs may reach the nodes besides core's B,C,T',h,w (their scaling is the model's:
    `VideoVAE.to_comfy_latent`)."""

    folded_frames: bool = False  # 4-D B,C*T',h,w: the frames folded into the channels, channel-major (core's SeedVR2)
    wrapper_normalized: bool = False  # from WanVideoWrapper's samplers, in the model space, with the wrapper's keys


@dataclass(frozen=True)
class Clip:
    """A workload's clip: pixel frames, height and width."""

    frames: int
    height: int
    width: int


@dataclass(frozen=True)
class CardRow:
    """A row of the README's table of what fits on a card (`bench.card_table`)."""

    label: str
    op: str
    clip: Clip


@dataclass(frozen=True)
class OneGpuTime:
    """A decode's time on one H100 in bf16 (bench/RESULTS.md section 0), what `bench.bench_distributed`
    predicts several GPUs from: `source` is "measured", or how it was scaled from a measured one."""

    clip: Clip
    seconds: float
    source: str


@dataclass(frozen=True)
class Calibration:
    """How `bench.calibrate_memory` measures the family on the CPU: clips of `frames` frames; `points` and
    `check_points` (mode -> [(size px, tile px or None)]) to fit and to check, None for the tool's own;
    `decoder_only`: a decode's process drops the encoder's weights first (they would outweigh the rest)."""

    frames: int = 5
    points: Mapping | None = None
    check_points: Mapping | None = None
    decoder_only: bool = False


@dataclass(frozen=True)
class Bench:
    """What the benchmarks run of the family: `gpu`, `bench.gpu_check`'s realistic clips (smallest first; none:
    it is not measured there) and `dry`, its CPU dry run's on the tiny model; `cards`, the card table's rows;
    `one_gpu`, `bench.bench_distributed`'s workloads; `calibration`, `bench.calibrate_memory`'s points."""

    gpu: tuple[Clip, ...] = ()
    dry: Clip | None = None
    cards: tuple[CardRow, ...] = ()
    one_gpu: tuple[OneGpuTime, ...] = ()
    calibration: Calibration = field(default_factory=Calibration)


@dataclass(frozen=True)
class CoreVAE:
    """ComfyUI core's own VAE of the family: the module that holds it, the first core version whose module
    builds it as the benchmarks and tests compare it (`bench.core_vae.TREES`), and whether core's VAE crops an
    encode's frames to the spatial factor (`crops_input`; SeedVR2's pads inside its encoder instead)."""

    module: str
    since: str
    crops_input: bool = True


@dataclass(frozen=True)
class TinyModel:
    """The family's tiny test model: the reference fixture's checkpoint (`reference/<family>/tiny_vae.safetensors`
    of the shared data folder) loaded with `fixture_config`, the config values its shapes cannot tell; or, for a
    family without one (`fixture_config` None), `config` with seeded random weights."""

    fixture_config: Mapping | None = None
    config: object | None = None


@dataclass(frozen=True)
class FamilySpec:
    """One family, declared (see the module docstring). `latent_channels`, `spatial_factor` and
    `temporal_factor` are the released network's (a clip is temporal_factor * n + 1 pixel frames: 4n+1,
    8n+1; 1 for an image VAE, any count); `fps` the frame rate its video model makes, or with `fps_node`
    the core node whose `frame_rate` input sets it; `display_name` and `also` how users name the models
    it is the VAE of, `download` the file they download (what an unknown checkpoint's message suggests)."""

    vae_class: type
    config_class: type
    display_name: str
    download: str
    latent_channels: int
    spatial_factor: int
    temporal_factor: int
    fps: float
    tiny: TinyModel
    also: tuple[str, ...] = ()
    fps_node: str | None = None
    latent: ComfyLatent = field(default_factory=ComfyLatent)
    load_choices: tuple[LoadChoice | LoadInteger, ...] = ()
    capabilities: frozenset[Capability] = frozenset()
    core: CoreVAE | None = None
    bench: Bench = field(default_factory=Bench)

    @property
    def name(self) -> str:
        """The family's key (wan21, ltx2, ...): its network's `VideoVAE.family`."""
        return self.vae_class.family
