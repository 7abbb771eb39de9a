"""Progress and cancellation of an encode/decode: the engine counts units of work (tile x chunk),
reports (done, total) to a callback and stops when a cancel callback says so.
"""
import contextlib
from typing import Callable

ProgressFn = Callable[[int, int], None]
CancelFn = Callable[[], bool]


class Cancelled(RuntimeError):
    """The `cancel` callback asked the encode/decode to stop (checked after every tile)."""


class Steps:
    """Counts units of work (tile x chunk), reports (done, total) and honours cancellation.

    A chunk is `per_chunk` units: one per step of every conv under a strategy that steps per tile
    (`convs` convs per chunk; `chunk_done` realigns the count at the end of each chunk), else one.
    While `muted` (work that is redone, or that a caller counts itself) units only check cancellation.
    """

    def __init__(self, chunks: int, progress: ProgressFn | None, cancel: CancelFn | None, convs: int = 0):
        self.chunks, self.chunks_done, self.per_chunk, self.done, self.convs = chunks, 0, 1, 0, convs
        self.progress, self.cancel = progress, cancel
        self.silent = False
        self.parent: Steps | None = None  # a run that counts this tile's chunks as its units

    def for_tile(self, chunks: int) -> "Steps":
        """The steps of one fast tile's run: each of its chunks is one unit of this
        run, its tiles only check cancellation."""
        child = Steps(chunks, None, self.cancel)
        child.parent = self
        return child

    @property
    def total(self) -> int:
        return self.chunks * self.per_chunk

    def units_per_chunk(self, execution) -> int:
        """Units of one chunk under `execution` (a model.execution.Execution, or None: whole frames)."""
        return 1 if execution is None else max(1, self.convs * execution.steps_per_conv())

    @contextlib.contextmanager
    def muted(self):
        """Within the block, units and chunks report nothing; cancellation is still checked."""
        silent, self.silent = self.silent, True
        try:
            yield
        finally:
            self.silent = silent

    def replan(self, chunks_left: int, per_chunk: int) -> None:
        """Settings changed mid-run (out-of-memory retry): recount what is left."""
        self.per_chunk, self.chunks = per_chunk, self.chunks_done + chunks_left
        self.done = self.chunks_done * per_chunk

    def check(self) -> None:
        if self.cancel is not None and self.cancel():
            raise Cancelled(f"cancelled after {self.done} of {self.total} steps")

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(self.done, self.total)

    def __call__(self) -> None:
        """One unit done (a tile of a conv, or a chunk of a fast-mode tile), then check cancellation.
        Under exact tiling the last unit of a chunk is left for `chunk_done`, as the estimate may be high."""
        if self.silent:
            self.check()
            return
        if self.done % self.per_chunk != self.per_chunk - 1 or self.per_chunk == 1:
            self.done = min(self.done + 1, self.total)
            self._report()
        self.check()

    def chunk_done(self) -> None:
        if self.silent:
            self.check()
            return
        if self.parent is not None:
            self.parent()
        self.chunks_done += 1
        self.done = self.chunks_done * self.per_chunk
        self._report()
        self.check()
