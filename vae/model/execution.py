"""What a model's blocks ask of the run that executes them, and what they hand it, declared here so
the model never imports the run (`vae.run`): the blocks take a `RunState` (the run's
`run.run_context.RunContext`) and read its switches, its causal caches (`CausalState`, the run's
`run.causal_cache.CausalCache`) and its `Execution` strategy (`run.strategies`: exact tiles;
`distributed.row_bands`: row bands). A strategy gets back from the layers what `Conv`, `Norm` and
`Attention` declare (a conv's frames of one call: `TimeWindow`), checked by type where it takes them
(`require`). Tensors are B,C,T,H,W.
"""
from dataclasses import dataclass
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


@dataclass(frozen=True)
class OwnTiles:
    """How a model that runs its own tiles and clips (`video_vae.ClipExtent.OWN_TILES`: MiniMax-H3) runs
    them, as the run's plan says: `batch` tiles of a clip through the network at once (0: every tile of
    the clip), and whether its `VideoVAE.streamed_modules` wait in host memory (`weights_streamed`), each
    copied to the compute device once per clip and run over every tile of the clip before the next."""

    batch: int = 0
    weights_streamed: bool = False


# One clip of a model that runs its own tiles, to compute as an `OwnTiles` says (`RunState.own_tile_clip`).
ClipWork = Callable[[OwnTiles], torch.Tensor]


class RunState(Protocol):
    """One encode or decode as its blocks see it.

    `opts`: the run's `kernels.Optimizations`; `first_chunk` / `last_chunk`: whether the chunk being run
    holds the clip's first / last frame; `prefill`: whether the run is passing the clip through the
    model's `prefill_stages` before the clip itself; `cache`: the causal caches; `execution`: None (whole frames,
    the blocks' own path) or the `Execution` every conv, norm and attention runs under; `clip_statistics`:
    None (the clip runs in one chunk) or the `ClipStatistics` of a clip run in several; `kernel_log`:
    where convs and norms note the kernel that ran (or None); `conv_options`: the keyword arguments of
    every `kernels.conv3d` of the run; `own_tiles`: how a model that runs its own tiles runs them (`OwnTiles`;
    None for the others; `own_tile_clip(work, tiles)` runs each of its clips of so many tiles: `work(own_tiles)`,
    where it runs out of memory again with fewer tiles at once, the clips before it kept), and `step`, what it
    calls after each batch of them (progress, cancellation; or None);
    `clip_latent_frames`: the latent frames of the whole clip (what a decode takes, an encode makes), for a layer
    whose windows shift at the clip's last frame or whose noise is drawn for the clip (None outside a run)."""

    opts: object
    first_chunk: bool
    last_chunk: bool
    prefill: bool
    cache: CausalState
    execution: "Execution | None"
    clip_statistics: "ClipStatistics | None"
    kernel_log: object
    conv_options: dict
    own_tiles: OwnTiles | None
    step: Callable[[], None] | None
    clip_latent_frames: int | None
    own_tile_clip: Callable[[ClipWork, int], torch.Tensor]


@runtime_checkable
class ClipNorm(Protocol):
    """A norm whose statistics span the whole clip, not a frame (`model.clip_norm.ClipGroupNorm`): it cannot
    normalise a frame before it has seen every frame of the clip."""

    def clip_stats(self, means: torch.Tensor, variances: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-frame moments of the whole clip (float64 B,G,T: mean and biased variance of each frame) -> the
        statistics every frame is normalised with (float32 B,G,T)."""


class ClipStatistics(Protocol):
    """The whole-clip statistics of a run whose clip passes through the model in several chunks (the run's
    `run.clip_statistics.GatheredStatistics`): the engine runs the clip once per `ClipNorm` first, each
    pass gathering one more norm's moments, then runs it with every norm's statistics known. A norm counts its
    frames with `CausalState.advance` (keyed by itself), which starts again with the clip."""

    def of(self, norm: ClipNorm, means: torch.Tensor, variances: torch.Tensor,
           first: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The statistics (float32 B,G,t) of frames [first, first + t) of `norm`'s input in the clip, given their
        moments (float64 B,G,t): known from an earlier pass, or gathered now, and then the chunk goes no further."""


@dataclass(frozen=True)
class TimeWindow:
    """The input frames of one conv call over `new` new frames, in time order [head | new | tail]:
    `head` frames before them (the previous call's input that the conv still reads, kept in the
    causal cache under the conv when `cached`; else padding), `tail` copies of the clip's last frame
    after them (a conv that looks ahead, on the clip's last call); `outputs` output frames; the next
    call's cache is input frames [keep, total). A conv without temporal state (a frame-wise or a
    pointwise one) has no head, no tail, as many outputs as new frames and keeps nothing."""

    head: int
    new: int
    tail: int
    outputs: int
    keep: int
    cached: bool

    @property
    def total(self) -> int:
        return self.head + self.new + self.tail


@runtime_checkable
class Conv(Protocol):
    """What a conv hands an execution strategy (`Execution.conv`; a residual's shortcut is called
    through `conv5d` alone): its spatial window, its frames per call, and the convolution of a buffer
    the strategy prepared. `blocks.ConvLayer` is the one implementation, for every conv of the pack.

    `kernel_size` / `stride` end with (rows, columns) (`(kt, kh, kw)`, or `(kh, kw)` for a conv applied
    to every frame); `spatial_pad` is (left, right, top, bottom) pixels of `padding_mode` ("zeros",
    "reflect", "replicate") at the frame border; `temporal`: the conv keeps input frames between calls
    (in `ctx.cache`, keyed by the conv itself: the strategy stores `TimeWindow.keep` onwards)."""

    out_channels: int
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    spatial_pad: tuple[int, int, int, int]
    padding_mode: str
    temporal: bool

    def time_window(self, ctx: RunState, new: int) -> TimeWindow | None:
        """The frames of a call on `new` new frames, or None when the call has nothing to do (a conv
        that looks ahead has not started: it needs its first frame to pad the clip's start with)."""

    def pad_in_time(self, frames: torch.Tensor, head: torch.Tensor | None, window: TimeWindow,
                    rows: slice = slice(None), cols: slice = slice(None)) -> None:
        """Write the head and tail frames of `frames` (the window's input frames, or rows x cols of them
        for a tile; the new frames written already): `head` (the cached frames of the whole frame,
        read by the strategy where `window.cached`, or rows x cols of them) or padding, then the tail."""

    def conv5d(self, buf: torch.Tensor, ctx: RunState, padded: bool = True) -> torch.Tensor:
        """The convolution of a prepared buffer B,C,total,H,W: with the conv's own symmetric spatial
        padding, or none (`padded=False`: the buffer holds its region's halo)."""


@runtime_checkable
class Norm(Protocol):
    """What a norm hands a strategy (a conv's `norm=`, a residual's norms): whole-frame statistics
    computed once, or merged from parts (tiles, bands), then SiLU(norm(x)) of any region with them.
    A per-position norm (RMS, pixel norm) has no statistics: None."""

    def stats(self, x: torch.Tensor, ctx: RunState):
        """The whole-frame statistics of x (B,C,T,H,W: whole frames), or None."""

    def part_moments(self, x: torch.Tensor, ctx: RunState):
        """(mean, biased variance, elements per group and frame) of a part x of the frames, or None."""

    def stats_of_parts(self, parts: list, ctx: RunState):
        """The whole-frame statistics from the `part_moments` of parts that cover the frames once."""

    def act(self, x: torch.Tensor, ctx: RunState, out: torch.Tensor | None = None, stats=None) -> torch.Tensor:
        """SiLU(norm(x)) of a region x, with `stats` of the whole frame, into `out` when given."""


@runtime_checkable
class Attention(Protocol):
    """What a mid-block attention hands a strategy: x + attention(x) of whole frames, for the query
    rows `rows` only (a row band's queries attend to every key of the frame)."""

    def attend(self, x: torch.Tensor, ctx: RunState, rows: slice = slice(None)) -> torch.Tensor:
        """x (B,C,T,H,W) + attention output, B,C,T,len(rows),W."""


@runtime_checkable
class Execution(Protocol):
    """How the layers of a chunk cover the frame (`RunState.execution`; None = whole frames).

    Tensors are B,C,T,H,W; what a strategy receives and returns has the extent it chose (whole frames
    for exact tiles, this rank's band of rows for row bands)."""

    # Why a compiled block must run its steps eagerly under this strategy (torch.compile traces none).
    eager_reason: str

    def conv(self, conv: Conv, ctx: RunState, shape, like: torch.Tensor, fill) -> torch.Tensor:
        """A conv over new frames of `shape` whose input `fill(view, rows, cols)` writes."""

    def norm_stats(self, norm: Norm, x: torch.Tensor, ctx: RunState):
        """The norm's whole-frame statistics of x (None for per-position norms)."""

    def residual(self, x: torch.Tensor, ctx: RunState, conv1: Conv, norm1: Norm, conv2: Conv, norm2: Norm,
                 shortcut: Conv | None) -> torch.Tensor:
        """A residual block, conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))) + shortcut(x) (`layers.residual_convs`)."""

    def attention(self, attention: Attention, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        """The mid-block attention of x (every position attends to the whole frame)."""

    def local(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, scale: int, halo: int) -> torch.Tensor:
        """fn(x) for a stateless, spatially local fn (radius `halo`, output `scale` x the resolution)."""

    def steps_per_conv(self) -> int:
        """How many progress steps one conv makes (0: none; the engine counts chunks)."""


def require(layer, kind: type):
    """`layer` where it is a `kind` (`Conv`, `Norm`, `Attention`); else a TypeError naming what it
    lacks: a strategy takes only the declared contract."""
    if not isinstance(layer, kind):
        declared = [*vars(kind).get("__annotations__", {}), *(name for name, value in vars(kind).items()
                                             if callable(value) and not name.startswith("_"))]
        missing = [name for name in declared if not hasattr(layer, name)]
        raise TypeError(f"{type(layer).__name__} is not a model.execution.{kind.__name__}"
                        + (f" (it lacks {', '.join(sorted(missing))})" if missing else ""))
    return layer
