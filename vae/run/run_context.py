"""The state of one encode or decode that every block of the model reads (`RunContext`, the run's
`model.execution.RunState`): switches, causal caches, the execution strategy, the kernel log."""
from typing import Callable, Iterator

import torch

from ..kernels import Optimizations
from ..kernels.kernel_log import KernelLog
from ..kernels.filter_cache import filter_cache
from ..model.execution import ClipWork, OwnTiles
from .causal_cache import CausalCache


class RunContext:
    """State of one encode or decode: the `model.execution.RunState` every block reads.

    `cache` (a `causal_cache.CausalCache`, on the compute device or offloaded) holds what each temporal
    module must remember between chunks (for causal convs: the input frames the next chunk still
    needs, unpadded). `first_chunk` is True while the chunk that holds frame 0 of the clip is
    processed; several upstream behaviours (head padding, frame-0 special cases) hinge on it.
    `last_chunk` is True while the chunk that holds the clip's last frame is processed: a conv that
    looks ahead in time (`CausalConv3d.lookahead`) then pads the clip's end and gives its last frames.
    Both are set in one place, the loop over chunks (`chunks`); `frames_are_images`: every frame is
    an image of its own (`VideoVAE.frames_are_images`), every chunk then holds its clip's frame 0.
    `execution` is None (whole frames, the blocks' own path) or the `model.execution.Execution` every
    conv, norm and attention then runs under (`strategies.ExactTiles`, `distributed.RowBands`).
    `frame_stream` is None (the engine runs each chunk's stages on the whole chunk) or the
    `strategies.FrameStream` that runs them one frame at a time. `prefill` is True while the engine
    runs a model's `prefill_stages` over the clip before the clip itself (a full attention gathers
    every frame's keys first: `layers.FrameCausalAttention`). `clip_statistics`: None, or the whole-clip
    statistics of norms that span the clip, gathered before a clip in several chunks runs
    (`clip_statistics.GatheredStatistics`). `kernel_log`: see `kernels.kernel_log`. `own_tiles`: how a
    model that runs its own tiles runs them (`model.execution.OwnTiles`, the plan's), else None; `step`, what
    it calls after each batch of them (the run's progress and cancellation, `progress.Steps`), else None;
    `own_tile_clip` runs each of its clips.
    `clip_latent_frames`: the latent frames of the whole clip (None outside an engine run).
    """

    def __init__(self, opts: Optimizations, execution=None, cache: CausalCache | None = None,
                 kernel_log: KernelLog | None = None, frames_are_images: bool = False, own_tiles: OwnTiles | None = None,
                 clip_latent_frames: int | None = None):
        self.opts = opts
        self.clip_latent_frames = clip_latent_frames
        self.own_tiles = own_tiles
        self.step = None
        # Runs each clip of a model that runs its own tiles: as `own_tiles` say (an engine run retries one that
        # runs out of memory with fewer tiles at once: `recovery.own_tile_clip`).
        self.own_tile_clip: Callable[[ClipWork, int], torch.Tensor] = \
            lambda work, tiles: work(self.own_tiles or OwnTiles())
        self.frames_are_images = frames_are_images
        self.first_chunk = True
        self.last_chunk = False
        self.cache = cache if cache is not None else CausalCache()
        self.execution = execution
        self.frame_stream = None
        self.prefill = False
        # The whole-clip statistics of a clip run in several chunks (`run.clip_statistics`), or None.
        self.clip_statistics = None
        # Where the convs and norms note which kernel ran (the caller's, for its run report; or None).
        self.kernel_log = kernel_log
        # How every conv of the run picks its kernel (`kernels.conv3d`'s keyword arguments): the
        # Winograd filter-transform cache (None: Winograd off), measured or fixed choices, and the
        # PyTorch 2.9 cuDNN workaround.
        self.conv_options = {"winograd": filter_cache(opts.winograd_cache_bytes) if opts.winograd_conv else None,
                             "kernels": opts.kernel_choice, "cudnn_workaround": opts.conv3d_workaround,
                             "log": kernel_log}

    def chunks(self, frames: int, size: int, start: int = 0, stop: int | None = None, *, started: bool = False,
               ending: bool = True) -> Iterator[tuple[int, int]]:
        """(first, count) of consecutive parts of at most `size` frames over frames [start, stop) (stop:
        `frames`) of a sequence of `frames` frames: the one loop over a clip's chunks (the engine's
        run, its prefill, its replay after an out-of-memory error) and over the frames of a stage's
        input (`strategies.FrameStream`). While a part runs, `first_chunk` says whether it holds the
        sequence's frame 0 (never when `started`: an earlier call had it; always where
        `frames_are_images`) and `last_chunk` whether it holds the last (never unless `ending`: a
        later call brings more)."""
        stop = frames if stop is None else stop
        for first in range(start, stop, size):
            count = min(size, stop - first)
            self.first_chunk = self.frames_are_images or (first == 0 and not started)
            self.last_chunk = ending and first + count == frames
            yield first, count

    @property
    def eager_reason(self) -> str | None:
        """Why a compiled block must run this step in Python, or None when it may be traced: execution
        strategies loop over tiles or exchange rows with other ranks, and offloaded caches copy to
        pinned memory or a file, none of which a traced graph may replay."""
        if self.execution is not None:
            return self.execution.eager_reason
        if self.cache.offload != "none":
            return f"steps with caches offloaded to {self.cache.offload}"
        return None
