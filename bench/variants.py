"""The one variant table: what each benchmark row runs, and verdicts for what a CPU cannot measure.

A row is a precision (`vae.kernels.backend.DTYPES`: fp32, bf16, fp16) and a variant of `VARIANTS`, named
`<dtype>-<variant>` ("bf16-tiles", "fp32-no-winograd_conv"); a bare precision is its optimized row
("bf16"), a bare variant runs in fp32 ("reference"). Variants:
- "optimized": StreamVAE's default (every switch of `Optimizations` on, kernels measured on this machine);
- "straightforward": every switch off (what the upstream reference code does); "reference": the same
  with TF32 off, the yardstick of the error columns;
- "no-<switch>": the optimized path with that one switch off, so its row shows that switch's effect;
- the others: the optimized path plus one thing that is not a switch (fixed kernels, a weight layout, a
  backend flag, a compiler, engine settings such as tiles or a memory budget), or ComfyUI core's own VAE
  of a version ("core_0.3.75", "core_0.33.0", bench/core_vae.py) with the same weights and input.
bench.bench_vae crosses --dtypes with variants; bench.gpu_check and bench.bench_kernels take row names.
"""
import contextlib
from dataclasses import dataclass, field, fields
from types import SimpleNamespace

from vae.kernels.backend import DTYPES
from vae.kernels import BackendFlags, Optimizations

SWITCHES = tuple(f.name for f in fields(Optimizations) if isinstance(f.default, bool))

# What each switch does, in the table's words (the full story is in vae/kernels/settings.py).
SWITCH_NOTES = {
    "fused_norm_act": "norm + SiLU in one pass, fp32 statistics, written into the next conv's buffer",
    "winograd_conv": "CPU: 3x3 convs by Winograd F(4x4,3x3)",
    "triton_norm": "CUDA: norm + SiLU as Triton kernels (CPU: no effect)",
    "whole_frame_small_convs": "exact tiles: low-resolution convs run on the whole frame once tiles are larger",
}


@dataclass(frozen=True)
class Variant:
    """What a row runs, as its differences from StreamVAE's default."""

    what: str
    opts: Optimizations = Optimizations()
    backend: BackendFlags = BackendFlags()  # process-wide torch switches around each run
    settings: dict = field(default_factory=dict)  # the engine's plan settings (tiles, budget), bench.models.run
    compile: str | None = None  # torch.compile mode of every block
    core: str | None = None  # ComfyUI core's VAE of this version instead of StreamVAE's
    model_config: dict = field(default_factory=dict)  # StreamVAE config choices (bench.models.build's config)


VARIANTS = {
    "optimized": Variant("all switches on (StreamVAE's default), kernels measured on this machine"),
    "straightforward": Variant("all switches off (upstream behaviour)", Optimizations.straightforward()),
    "reference": Variant("all switches off, TF32 off: the yardstick of the error columns",
                         Optimizations.straightforward(), BackendFlags(tf32=False)),
    **{f"no-{name}": Variant(f"off: {SWITCH_NOTES.get(name, name)}", Optimizations().with_(**{name: False}))
       for name in SWITCHES},
    "kernels_defaults": Variant("fixed default kernels (kernel_choice=defaults) instead of measured ones",
                                Optimizations(kernel_choice="defaults")),
    "kernels_cached": Variant("optimized again in a new process: the kernel choices come from the disk cache"),
    "winograd_uncapped": Variant("Winograd filter-transform cache without its byte cap",
                                 Optimizations().with_(winograd_cache_bytes=1 << 62)),
    "ndhwc": Variant("activations and weights NDHWC (channels last) from the first conv to the last",
                     Optimizations(activation_layout="ndhwc")),
    "ncdhw": Variant("activations and weights NCDHW (channel planes), upstream's layout",
                     Optimizations(activation_layout="ncdhw")),
    "cudnn_benchmark": Variant("cuDNN times its conv algorithms per shape", backend=BackendFlags(cudnn_benchmark=True)),
    "compile": Variant("torch.compile (inductor) per block, eager fallback", compile="default"),
    "compile_cudagraphs": Variant("torch.compile per block, CUDA graphs (reduce-overhead)", compile="reduce-overhead"),
    "tiles": Variant("exact tiles of 512 px", settings=dict(tile_size=512)),
    "fast_tiles": Variant("fast (blended) tiles of 512 px, overlap 64", settings=dict(tile_size=512, tiling="fast",
                                                                                     tile_overlap=64)),
    "budget_12g": Variant("a 12 GiB memory budget", settings=dict(memory_budget=12 * 2**30)),
    "budget_8g": Variant("an 8 GiB memory budget (LTX-2.5 720p: chunks of latent frames, caches to host)",
                         settings=dict(memory_budget=8 * 2**30)),
    "budget_6g": Variant("a 6 GiB memory budget (an 8 GB card; frames streamed below the large tiles)",
                         settings=dict(memory_budget=6 * 2**30)),
    "budget_2g": Variant("a 2 GiB memory budget (MiniMax-H3: its decoder's blocks streamed from host memory)",
                         settings=dict(memory_budget=2 * 2**30)),
    "budget_auto": Variant("memory budget 'auto' (what the nodes run)", settings=dict(memory_budget="auto")),
    "core_attention": Variant("HunyuanVideo 1.5 only: its mid-block attention unmasked, as ComfyUI core computes "
                              "it (attention=full; the default is the masked attention it was trained with)",
                              model_config={"attention": "full"}),
    "core_frames": Variant("HunyuanVideo 1.0 only: ComfyUI 0.33.0's frames (frames=core: norms per chunk of 2 latent "
                           "frames, attention unmasked; the default is the whole-clip network)",
                           model_config={"frames": "core"}),
    "core_0.3.75": Variant("ComfyUI 0.3.75 core's VAE, same weights and input", core="0.3.75"),
    "core_0.33.0": Variant("ComfyUI 0.33.0 core's VAE (comfy-kitchen, comfy-aimdo), same weights and input",
                           core="0.33.0"),
}

# Optimizations from the design documents that this CPU cannot exercise, or that live outside the
# timed network path; each gets a row with its verdict. Measured ones are in the main table.
NOT_MEASURED = [
    ("GPU switches (cuDNN benchmark, TF32, channels-last, Triton norm, attention kernels)",
     "measured on a GPU by bench.gpu_check (bench/RESULTS.md, GPU section), not by this CPU table."),
    ("fp16/bf16 autocast", "Not used: weights are cast per half (encode/decode dtype) with fp32 norm statistics; "
                           "bf16 rows measure it."),
    ("addcmul reparameterisation", "Not applicable: encode returns the posterior mean (no sampling step)."),
    ("causal pads in one buffer, SDPA, native pixel shuffle (chunked 4-8x channel expansion), in-place residuals, "
     "skipped zero-head taps, sub-pixel upsample convs", "The blocks' only code (no switch): their gains against "
                                                         "upstream's implementations are in bench/RESULTS.md sections 1 and 5."),
    ("preallocated outputs, cached blend ramps, separable blending", "Engine and fast tiles (vae/run/strategies/fast_tiles.py, "
                                                                     "vae/run/engine.py); always on, not timed here."),
]


BASELINES = ("optimized", "straightforward", "reference")


def variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; one of {sorted(VARIANTS)}")
    return VARIANTS[name]


def is_extra(name: str) -> bool:
    """The optimized path plus one thing: not a baseline, a switch row or core."""
    return name not in BASELINES and not name.startswith("no-") and variant(name).core is None


def options(name: str) -> Optimizations:
    """The switches variant `name` runs with."""
    return variant(name).opts


def parse_row(name: str) -> tuple[str, str]:
    """(dtype, variant) of a row name: "bf16-tiles" -> ("bf16", "tiles"), "bf16" -> ("bf16", "optimized"),
    "reference" -> ("fp32", "reference"). Raises ValueError for an unknown name."""
    dtype, _, rest = name.partition("-")
    if name in DTYPES:
        dtype, rest = name, "optimized"
    elif dtype not in DTYPES:
        dtype, rest = "fp32", name
    variant(rest)  # raises for an unknown one
    return dtype, rest


@contextlib.contextmanager
def prepared(model, name: str):
    """Set StreamVAE's `model` up for variant `name` for the duration of the block. Yields `opts` (the
    optimizations to pass to the engine), `per_run` (a context each timed run enters: the backend flags,
    the compile's recompile limits) and `compile_report` (the compile's, or None)."""
    from vae.kernels.backend import applied
    from vae.run.compile import CompileSettings, blocks, compile_blocks, dynamo_limits, uncompile_blocks

    v = variant(name)
    settings = CompileSettings(mode=v.compile) if v.compile else None
    setup = SimpleNamespace(opts=v.opts, compile_report=None)

    @contextlib.contextmanager
    def per_run():
        with applied(v.backend), dynamo_limits(settings):  # a block past the limit raises, runs eager, is reported
            yield

    setup.per_run = per_run
    try:
        if settings is not None:
            setup.compile_report = compile_blocks(model, settings)
        yield setup
    finally:
        if settings is not None:
            uncompile_blocks([m for _, m in blocks(model)])


def verdict(name: str, time_s: float, optimized_s: float | None) -> str:
    """One line on what the row shows, from its time next to the optimized row's."""
    if not optimized_s:
        return ""
    if name.startswith("no-"):
        gain = time_s / optimized_s
        if abs(gain - 1) < 0.03:
            return "no measurable gain here (within 3%)"
        return f"switch gains {gain:.2f}x" if gain > 1 else f"switch costs {1 / gain:.2f}x here"
    if variant(name).core is not None:
        return f"StreamVAE optimized is {time_s / optimized_s:.2f}x faster than core {variant(name).core}"
    if is_extra(name):
        ratio = optimized_s / time_s
        if abs(ratio - 1) < 0.03:
            return "no measurable change vs optimized (within 3%)"
        return f"{ratio:.2f}x the optimized speed"
    return ""
