"""What a model's blocks ask of the run that executes them, declared here so the model never imports
the run (`vae.run`): the blocks take a `StreamState` (the run's `run.stream_context.StreamContext`)
and read its switches, its causal caches (`CausalState`, the run's `run.causal_cache.CausalCache`)
and its `Execution` strategy (`run.strategies`: exact tiles; `distributed.row_bands`: row bands).
Tensors are B,C,T,H,W.
"""
from typing import Callable, Protocol, runtime_checkable

import torch


class KeysValues(Protocol):
    """The attention keys and values of the frames a frame-causal attention has seen (the run's
    `run.kv_cache.KeyValueCache`), per attention module: B,tokens,C each."""

    def frames(self, module) -> int:
        """How many frames' keys and values `module` has kept."""

    def append(self, module, k: torch.Tensor, v: torch.Tensor, frames: int) -> None:
        """Keep the keys and values of `frames` more frames."""

    def prefix(self, module, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of the first `frames` frames kept."""


class CausalState(Protocol):
    """What each temporal module remembers between the chunks of one clip, keyed by the module, and
    the attention keys and values of the frames seen (`keys_values`)."""

    keys_values: KeysValues

    def __contains__(self, module) -> bool: ...

    def get(self, module) -> torch.Tensor | None:
        """The frames kept for `module` (None when it keeps none)."""

    def frames(self, module) -> int:
        """How many frames are kept for `module`."""

    def put(self, module, frames: torch.Tensor, owned: bool = False) -> None:
        """Keep `frames` for `module`'s next call (`owned`: the caller gives the tensor away)."""

    def pop(self, module) -> torch.Tensor | None:
        """The frames kept for `module`, no longer kept."""

    def advance(self, key, frames: int) -> int:
        """The frames counted under `key` so far in this run, before adding `frames`."""


class StreamState(Protocol):
    """One encode or decode as its blocks see it.

    `opts`: the run's `kernels.Optimizations`; `first_chunk` / `last_chunk`: whether the chunk being run
    holds the clip's first / last frame; `prefill`: whether the run is passing the clip through the
    model's `prefill_stages` before the clip itself; `cache`: the causal caches; `execution`: None (whole frames,
    the blocks' own path) or the `Execution` every conv, norm and attention runs under; `kernel_log`:
    where convs and norms note the kernel that ran (or None); `conv_options`: the keyword arguments of
    every `kernels.conv3d` of the run."""

    opts: object
    first_chunk: bool
    last_chunk: bool
    prefill: bool
    cache: CausalState
    execution: "Execution | None"
    kernel_log: object
    conv_options: dict


@runtime_checkable
class Execution(Protocol):
    """How the layers of a chunk cover the frame (`StreamState.execution`; None = whole frames).

    Tensors are B,C,T,H,W; what a strategy receives and returns has the extent it chose (whole frames
    for exact tiles, this rank's band of rows for row bands)."""

    # Why a compiled block must run its steps eagerly under this strategy (torch.compile traces none).
    eager_reason: str

    def conv(self, conv, ctx, shape, like: torch.Tensor, fill) -> torch.Tensor:
        """A (causal) conv over new frames of `shape` whose input `fill(view, rows, cols)` writes."""

    def norm_stats(self, norm, x: torch.Tensor, ctx):
        """The norm's whole-frame statistics of x (None for per-position norms)."""

    def residual(self, x: torch.Tensor, ctx, conv1, norm1, conv2, norm2, shortcut) -> torch.Tensor:
        """A residual block, conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))) + shortcut(x) (`layers.residual_convs`)."""

    def attention(self, attention, x: torch.Tensor, ctx) -> torch.Tensor:
        """The mid-block attention of x (every position attends to the whole frame)."""

    def local(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, scale: int, halo: int) -> torch.Tensor:
        """fn(x) for a stateless, spatially local fn (radius `halo`, output `scale` x the resolution)."""

    def steps_per_conv(self) -> int:
        """How many progress steps one conv makes (0: none; the engine counts chunks)."""
