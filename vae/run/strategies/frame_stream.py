"""Frame streaming: a chunk's stages run one frame at a time, depth first, so the tensors between layers
hold one frame however many the chunk has.

A chunk of one latent frame decodes to 4 pixel frames, and at the decoder's high-resolution stages
each layer's output is whole frames (exact tiles bound a conv's temporaries, not what passes between
layers): at 1080p a SeedVR2 stage holds 128-256 channels x 2 Mpx per frame, several tensors at a time.
Every stage of a family is causal in time (`model.VideoVAE`: run on consecutive parts of its input,
in order, it gives what it gives on the whole), so the engine may hand each stage its input one frame
at a time and pass each result on before the next frame: frame j of a temporal upsampler's output
goes through every later stage before frame j + 1 is touched. What waits meanwhile (the other frames
of a stage's output) waits in the run's offload store when the caches are offloaded (pinned host
memory or disk: `causal_cache.py`), else on the device.

`ctx.first_chunk` is True for a stage's call that holds its frame 0 of the clip, as for a chunk: a
stage that gets no frames (a temporal downsampler's output between its windows, a layer that looks
ahead waiting for its next frame) passes nothing on. `ctx.last_chunk` is True for the call that
holds the stage's last frame of the clip: the last frame of the previous stage's last call (a stage
that looks ahead gives its remaining frames then). Both are the run's one loop over chunks
(`RunContext.chunks`), here over the frames of each stage's input.

In a pass that gathers whole-clip statistics (`run.clip_statistics`) a stage stops each frame at the norm the
pass gathers (`Gathered`): that frame goes no further, the next frames still run through the stages before it
(their causal caches stay whole), and the stream says so once the chunk's frames are done.
"""
import torch

from ...model.video_vae import Stage
from ..clip_statistics import Gathered


class FrameStream:
    """The frame-at-a-time schedule of one stream's stages; `started[i]`: stage i has had its frame 0.

    `piece`: frames per step (1: one frame at a time); `started`: the stream begins after the clip's
    first chunk (the engine streams the last chunk of a clip whose convs look ahead this way).
    `first_stage`: the op's index of stages[0] (a stream from the stage whose inputs a gathering run kept);
    `statistics`: that run's `clip_statistics.GatheredStatistics`, told where each frame stopped."""

    def __init__(self, stages: list[Stage], piece: int = 1, started: bool = False, first_stage: int = 0,
                 statistics=None):
        self.stages, self.piece = stages, piece
        self.started = [started] * len(stages)
        self.first_stage, self.statistics = first_stage, statistics
        self._chunk, self._gathered = 0, False

    def run(self, x: torch.Tensor, ctx, emit, chunk: int = 0, ending: bool | None = None) -> None:
        """Every frame of x (B,C,t,H,W, the first stage's input) through the stages; `emit(y)` gets the
        last stage's output as it comes, a frame or less at a time, in order. `ending` (default: the
        chunk's `ctx.last_chunk`) says whether x ends the clip; `chunk`: the chunk's first latent frame.
        Raises `Gathered` at the end where a frame stopped at the norm a gathering pass gathers."""
        self._chunk, self._gathered = chunk, False
        self._level(0, [x], ctx, emit, ctx.last_chunk if ending is None else ending)
        if self._gathered:
            raise Gathered

    def _level(self, level: int, held: list[torch.Tensor], ctx, emit, ending: bool) -> None:
        """Stage `level` on the frames in `held` (taken out of it: the caller keeps no reference, so
        what is done with is freed), one at a time, each result passed on at once; `ending`: the
        frames end the stage's input."""
        x = held.pop()
        if level == len(self.stages):
            emit(x)
            return
        n, p = x.shape[2], self.piece
        offloaded = ctx.cache.offload != "none" and n > p
        if offloaded:  # all but the first piece wait off the device, under keys of this stream
            for j in range(p, n, p):
                ctx.cache.put((self, level, j), x[:, :, j:j + p])
            x = x[:, :, :p].clone()
        for j, _ in ctx.chunks(n, p, started=self.started[level], ending=ending):
            if n <= p or offloaded:  # x is this piece, or the first one: nothing else keeps it
                frame = x if j == 0 else ctx.cache.pop((self, level, j))
                x = None
            else:  # the other pieces wait on the device, as views of x
                frame = x[:, :, j:j + p]
            last = ctx.last_chunk  # read before the next stage's pieces set it
            self.started[level] = True
            try:
                out = [self.stages[level](frame, ctx)]
            except Gathered:  # this frame stops here; the next ones still pass the stages before
                self._gathered = True
                if self.statistics is not None:
                    self.statistics.stopped(self.first_stage + level, self._chunk, frame)
                continue
            del frame
            if out[0].shape[2]:
                self._level(level + 1, out, ctx, emit, last)
