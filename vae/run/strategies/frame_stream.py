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
"""
import torch

from ...model.video_vae import Stage


class FrameStream:
    """The frame-at-a-time schedule of one stream's stages; `started[i]`: stage i has had its frame 0.

    `piece`: frames per step (1: one frame at a time); `started`: the stream begins after the clip's
    first chunk (the engine streams the last chunk of a clip whose convs look ahead this way)."""

    def __init__(self, stages: list[Stage], piece: int = 1, started: bool = False):
        self.stages, self.piece = stages, piece
        self.started = [started] * len(stages)

    def run(self, x: torch.Tensor, ctx, emit) -> None:
        """Every frame of x (B,C,t,H,W, the first stage's input) through the stages; `emit(y)` gets the
        last stage's output as it comes, a frame or less at a time, in order. The chunk's
        `ctx.last_chunk` says whether x ends the clip."""
        self._level(0, [x], ctx, emit, ctx.last_chunk)

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
            out = [self.stages[level](frame, ctx)]
            del frame
            if out[0].shape[2]:
                self._level(level + 1, out, ctx, emit, last)
