"""Whole-clip statistics for a clip that runs in several chunks (`ClipExtent.CHUNKS_AFTER_STATISTICS`): the
statistics of norms that span the clip (`model.execution.ClipNorm`, such as `model.clip_norm.ClipGroupNorm`)
gathered in passes over the clip before the clip itself runs.

A norm cannot normalise a frame before it has seen every frame of the clip, and what a norm sees depends on
the norms before it. So the engine runs the clip through the model once per such norm, chunk by chunk with
fresh causal caches, as the plan runs it (chunks, exact tiles, frames streamed): in pass k every norm before
the k-th has its statistics, the k-th hands its per-frame moments (float64 B,G,t, merged over the tiles of a
chunk) to `GatheredStatistics.of`, which keeps them and stops the chunk there (`Gathered`: nothing after that
norm runs; streamed, each frame stops there and the next ones still run the stages before it). At the end of
the pass the frames' moments become the norm's statistics (`ClipNorm.clip_stats`, an exact merge); then the
clip runs with every norm's statistics known and gives the whole clip's frames, to rounding, whatever the
chunks and tiles. Statistics do not depend on how the clip was cut, so they outlive an
out-of-memory retry that cuts it smaller.

Pass k would cost the model up to the k-th norm on the clip, from the op's input. Instead, a pass keeps the input
of the stage where its chunks stopped (every chunk's, a copy: in host memory from a GPU) when the whole clip's
fits the plan's `kept_stage_bytes` beside what is kept already; the later passes and the clip itself start
there. The norms come in the stages' order, so only the latest kept stage is ever read: with enough memory
each stage runs about once more than in one chunk, and a norm's pass runs no more than the layers before it in
its stage. The plan prefers one chunk (no passes) and tiles before shorter chunks (`planning._candidates`).
Stages are kept only after the model's prefill (a pass that starts later needs none).
"""
import torch

from ..model.execution import ClipNorm


class Gathered(Exception):
    """A chunk stopped at the norm whose moments its pass gathers (the layers after it have nothing to run on)."""


def clip_norm_count(modules) -> int:
    """How many norms of the op's modules need whole-clip statistics: the passes a clip in chunks takes."""
    return sum(isinstance(m, ClipNorm) for root in modules for m in root.modules())


class GatheredStatistics:
    """The run's `model.execution.ClipStatistics`: each norm's statistics of the whole clip (float32 B,G,T, from
    `ClipNorm.clip_stats`) once a pass has gathered them; `norms` is how many the op has. And the stage inputs
    kept between passes (module docstring): at most `kept_bytes` of them, on `keep_on`, never those of the
    first `prefill_stages` stages. Chunks are named by their first latent frame."""

    def __init__(self, norms: int, kept_bytes: int = 0, keep_on: torch.device | str = "cpu", prefill_stages: int = 0):
        self.norms = norms
        self.known: dict[ClipNorm, tuple[torch.Tensor, torch.Tensor]] = {}
        self._gathering: ClipNorm | None = None
        self._moments: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.kept_bytes, self.keep_on, self.prefill_stages = kept_bytes, torch.device(keep_on), prefill_stages
        self.first_stage = 0  # where every chunk starts: the stage whose inputs `_kept` holds (0: the op's input)
        self._kept: dict[int, list[torch.Tensor]] = {}  # each chunk's input pieces there, in frame order
        self._new: dict[int, list[torch.Tensor]] | None = {}  # the inputs this pass keeps (None: it keeps none)
        self._new_stage = 0
        self._kept_total = self._new_total = 0  # bytes in `_kept`, in `_new`

    @classmethod
    def for_run(cls, model, op: str, kept_bytes: int) -> "GatheredStatistics | None":
        """The statistics of a run of `model`'s op that may gather them (`ClipExtent.gathers_statistics`), else None."""
        if not model.clip_extent(op).gathers_statistics:
            return None
        if model.looks_ahead(op):  # a pass stops chunks before their held-back frames come
            raise ValueError(f"this {model.family} {op} gathers whole-clip statistics and its convs look ahead in "
                             "time: StreamVAE runs no such network yet")
        modules = model.decode_modules() if op == "decode" else model.encode_modules()
        device = model.device  # kept in host memory from an accelerator; where it runs on the CPU (or meta device)
        keep_on = device if device.type in ("cpu", "meta") else torch.device("cpu")
        return cls(clip_norm_count(modules), kept_bytes, keep_on, prefill_stages=len(model.prefill_stages(op)))

    @property
    def passes_left(self) -> int:
        return self.norms - len(self.known)

    def run(self, stages: list, x: torch.Tensor, ctx, first: int) -> torch.Tensor:
        """Chunk `first` (x: its input to the op) through `stages` from the stage whose inputs are kept; where it
        stops at the norm this pass gathers, the input of that stage kept (`stopped`)."""
        if self.first_stage:
            pieces = [piece.to(x.device, non_blocking=True) for piece in self._inputs(first, x)]
            x = torch.cat(pieces, dim=2)  # B,C,t,H,W: the chunk's frames at the kept stage
        for i in range(self.first_stage, len(stages)):
            try:
                y = stages[i](x, ctx)
            except Gathered:
                self.stopped(i, first, x)
                raise
            x = y
        return x

    def stream(self, stream, x: torch.Tensor, ctx, emit, first: int) -> None:
        """Chunk `first` through `stream` (a `strategies.FrameStream` of the stages from the one whose inputs are
        kept, made for this pass) a frame at a time: its kept inputs there, piece by piece, else x; `Gathered`
        raised once every piece has run, where the pass's norm stopped them."""
        pieces = self._inputs(first, x)
        gathered = False
        for i, piece in enumerate(pieces):
            try:
                stream.run(piece.to(x.device, non_blocking=True), ctx, emit, first,
                           ending=ctx.last_chunk and i == len(pieces) - 1)
            except Gathered:
                gathered = True
        if gathered:
            raise Gathered

    def _inputs(self, first: int, x: torch.Tensor) -> list[torch.Tensor]:
        """Chunk `first`'s input pieces at the stage its passes start from: those kept there, else [x] (the op's)."""
        return self._kept[first] if self.first_stage else [x]

    def stopped(self, stage: int, first: int, x: torch.Tensor) -> None:
        """Chunk `first` met `Gathered` in `stage`, whose input is x (the chunk's, or one piece of it when frames
        are streamed): a copy of x kept for the passes after this one, where the clip's inputs there fit beside
        those kept now."""
        if stage <= self.first_stage or stage < self.prefill_stages or self._new is None:
            return
        new = self._new_total + x.numel() * x.element_size()
        if new + self._kept_total > self.kept_bytes:
            self._new = None  # the clip's inputs there do not fit: this pass keeps nothing
            return
        self._new.setdefault(first, []).append(x.to(self.keep_on, copy=True))
        self._new_total = new
        self._new_stage = stage

    def restart(self) -> None:
        """Drop the pass under way and the kept inputs (their chunks are no longer the run's: an out-of-memory
        retry cut them smaller); the statistics known stay."""
        self.first_stage, self._kept, self._new = 0, {}, {}
        self._kept_total = self._new_total = 0
        self._gathering, self._moments = None, []

    def of(self, norm: ClipNorm, means: torch.Tensor, variances: torch.Tensor, first: int):
        """Statistics (float32 B,G,t) of frames [first, first + t) of `norm`'s input, whose moments are `means`,
        `variances` (float64 B,G,t); for the norm this pass gathers, its moments kept, and `Gathered` raised."""
        t = means.shape[-1]
        if norm in self.known:
            mean, rstd = self.known[norm]
            return mean[..., first:first + t], rstd[..., first:first + t]
        gathered = sum(m.shape[-1] for m, _ in self._moments)
        if (self._gathering is not None and norm is not self._gathering) or first != gathered:
            raise RuntimeError(f"a statistics pass met frames {first}.. of a {type(norm).__name__} after {gathered} "
                               "frames of the norm it gathers: the clip's chunks must run in order, once each")
        self._gathering = norm
        self._moments.append((means, variances))
        raise Gathered

    def end_pass(self) -> None:
        """The gathered norm's statistics from its frames' moments; ready for the next pass."""
        if self._gathering is None:
            raise RuntimeError(f"a statistics pass reached none of the {self.passes_left} norms whose whole-clip "
                               "statistics are unknown: the op's stages do not use every norm of its modules")
        means = torch.cat([m for m, _ in self._moments], dim=-1)  # float64 B,G,T: every frame of the clip
        variances = torch.cat([v for _, v in self._moments], dim=-1)
        self.known[self._gathering] = self._gathering.clip_stats(means, variances)
        self._gathering, self._moments = None, []
        if self._new:  # every chunk's input of the stage where they stopped: the next passes start there
            self.first_stage, self._kept, self._kept_total = self._new_stage, self._new, self._new_total
        self._new, self._new_total = {}, 0


class EachChunksOwn:
    """A `model.execution.ClipStatistics` that normalises each chunk by its own statistics, in one pass: for runs
    that measure sizes (`memory.steady_cache_sizes`, bench.meta_peak), whose shapes the whole clip's statistics
    would not change."""

    def of(self, norm: ClipNorm, means: torch.Tensor, variances: torch.Tensor, first: int):
        return norm.clip_stats(means, variances)


def gather(ctx, frames: int, chunk: int, step, steps, prefill, fresh_caches) -> None:
    """The passes over a clip of `frames` latent frames in chunks of `chunk` that gather, one norm a pass, the
    statistics of the norms of `ctx.clip_statistics` that still lack them (nothing where it is None): each pass
    from frame 0, `step(first, count, write=False)` a chunk at a time, every chunk stopping at the norm gathered
    (`Gathered`), after the model's prefill (`prefill(step)`, the engine's, which runs nothing for a model with
    none or for a pass that starts past it, from kept inputs); then `fresh_caches()` for the next pass, or for
    the clip itself."""
    statistics = ctx.clip_statistics
    while statistics is not None and statistics.passes_left:
        reached = []

        def caught(first: int, n: int, write: bool) -> None:
            try:
                step(first, n, write)
            except Gathered:
                reached.append(first)

        with steps.muted():
            prefill(caught)
        if not reached:  # the norm comes after the prefill's stages: the clip's chunks
            for first, n in ctx.chunks(frames, chunk):
                caught(first, n, False)
                steps.chunk_done()
        statistics.end_pass()
        fresh_caches()
