"""What each benchmark row runs, and the verdicts for the optimizations a CPU cannot measure.

A variant name is one of
- "optimized": every switch of `Optimizations` on (StreamVAE's default, kernels measured on this machine);
- "straightforward": every switch off (what the upstream reference code does);
- "no-<switch>": the optimized path with that one switch off, so its row shows that switch's effect;
- an extra in EXTRAS: the optimized path plus one thing that is not a switch (a weight layout, a
  compiler, a weight format, a cache setting), or "core": ComfyUI core's own VAE of the family.
"""
import contextlib
from dataclasses import fields
from functools import partial
from types import SimpleNamespace

from vae.optimizations import Optimizations

SWITCHES = tuple(f.name for f in fields(Optimizations) if isinstance(f.default, bool))

# What each switch does, in the table's words (the full story is in vae/optimizations/settings.py).
SWITCH_NOTES = {
    "fused_norm_act": "norm + SiLU in one pass, fp32 statistics, written into the next conv's buffer",
    "buffered_causal_pad": "causal cache + pads in one preallocated buffer (memory-efficient concat)",
    "sdpa_attention": "mid-block attention by SDPA instead of an explicit softmax(QK^T)V",
    "native_pixel_shuffle": "3-D pixel shuffle as one copy + chunked channel-expanding conv",
    "inplace_residual": "residual adds in place",
    "skip_zero_head_taps": "Wan: skip conv taps that only see the zero causal head",
    "subpixel_upsample_conv": "Wan: nearest 2x + 3x3 conv as four 2x2 phase convs",
    "winograd_conv": "CPU: 3x3 convs by Winograd F(4x4,3x3)",
    "triton_norm": "CUDA: norm + SiLU as Triton kernels (CPU: no effect)",
    "whole_frame_small_convs": "exact tiles: low-resolution convs run on the whole frame once tiles are larger",
}

# Extras run on the optimized path. Each maps to a context manager factory (model -> context).
EXTRA_NOTES = {
    "channels_last_3d": "conv weights stored NDHWC (backend.to_channels_last_3d)",
    "compile": "torch.compile (inductor) per block, eager fallback",
    "winograd_uncapped": "Winograd filter-transform cache without its byte cap",
    "kernels_defaults": "fixed default kernels (kernel_choice=defaults) instead of measured ones",
    "kernels_cached": "optimized again in a new process: the kernel choices come from the disk cache",
    "core": "ComfyUI core's VAE, same weights and input",
}
EXTRAS = tuple(EXTRA_NOTES)

# Optimizations from the design documents that this CPU cannot exercise, or that live outside the
# timed network path; each gets a row with its verdict. Measured ones are in the main table.
NOT_MEASURED = [
    ("GPU switches (cuDNN benchmark, TF32, channels-last, Triton norm, attention kernels)",
     "measured on a GPU by bench/gpu_check.py (bench/RESULTS.md, GPU section), not by this CPU table."),
    ("fp16/bf16 autocast", "Not used: weights are cast per half (encode/decode dtype) with fp32 norm statistics; "
                           "bf16 rows measure it."),
    ("addcmul reparameterisation", "Not applicable: encode returns the posterior mean (no sampling step)."),
    ("chunked upsampling (4-8x channel-expansion peak)", "Part of native_pixel_shuffle (its row): the expanding conv runs "
                                                         "a few frames at a time."),
    ("preallocated outputs, cached blend ramps, separable blending", "Tiling/streaming engine (vae/tiling.py, "
                                                                     "vae/engine.py); always on, not timed here."),
]


def options(variant: str) -> Optimizations:
    """The switches a variant runs with."""
    if variant == "straightforward":
        return Optimizations.straightforward()
    if variant.startswith("no-"):
        name = variant[3:]
        if name not in SWITCHES:
            raise ValueError(f"unknown switch {name!r}; one of {SWITCHES}")
        return Optimizations().with_(**{name: False})
    if variant == "kernels_defaults":
        return Optimizations(kernel_choice="defaults")
    if variant == "winograd_uncapped":
        return Optimizations().with_(winograd_cache_bytes=1 << 62)
    if variant == "optimized" or variant in EXTRAS:
        return Optimizations()
    raise ValueError(f"unknown variant {variant!r}")


def describe(variant: str) -> str:
    if variant == "optimized":
        return "all switches on"
    if variant == "straightforward":
        return "all switches off (upstream behaviour)"
    if variant.startswith("no-"):
        return "off: " + SWITCH_NOTES[variant[3:]]
    return EXTRA_NOTES[variant]


@contextlib.contextmanager
def prepared(model, variant: str):
    """Set `model` up for `variant` for the duration of the block. Yields `opts` (the optimizations
    to pass to the engine), `per_run` (a context factory each timed run enters), `weight_bytes`
    (resident weight bytes when not the parameters') and `compile_report` (the compile row's)."""
    from vae.optimizations.backend import to_channels_last_3d
    from vae.optimizations.compile import CompileSettings, blocks, compile_blocks, dynamo_limits, uncompile_blocks

    setup = SimpleNamespace(opts=options(variant), per_run=contextlib.nullcontext, weight_bytes=None, compile_report=None)
    try:
        if variant == "channels_last_3d":
            to_channels_last_3d(model)
        elif variant == "compile":
            settings = CompileSettings()
            report = setup.compile_report = compile_blocks(model, settings)
            if report.fallback_reason:
                raise RuntimeError(f"compile unavailable: {report.fallback_reason}")
            setup.per_run = partial(dynamo_limits, settings)  # a block past the limit raises, runs eager, is reported
        yield setup
    finally:
        if variant == "compile":
            uncompile_blocks([m for _, m in blocks(model)])


def verdict(variant: str, time_s: float, optimized_s: float | None) -> str:
    """One line on what the row shows, from its time next to the optimized row's."""
    if variant.startswith("no-") and optimized_s:
        gain = time_s / optimized_s
        if abs(gain - 1) < 0.03:
            return "no measurable gain here (within 3%)"
        return f"switch gains {gain:.2f}x" if gain > 1 else f"switch costs {1 / gain:.2f}x here"
    if variant in EXTRAS and variant != "core" and optimized_s:
        ratio = optimized_s / time_s
        if abs(ratio - 1) < 0.03:
            return "no measurable change vs optimized (within 3%)"
        return f"{ratio:.2f}x the optimized speed"
    if variant == "core" and optimized_s:
        return f"StreamVAE optimized is {time_s / optimized_s:.2f}x faster than core"
    return ""
