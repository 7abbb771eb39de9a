"""A GroupNorm whose statistics span the whole clip, not a frame (`ClipGroupNorm`): a layer any family may
use (HunyuanVideo 1.0's norms are these).

It normalises over (C/G, T, H, W): its statistics span every frame of the clip, or each window of a few
latent frames (`Windows`: how ComfyUI core's carried chunks compute HunyuanVideo 1.0's). A frame cannot be
normalised before every frame of its span has been seen. A model with such norms declares it
(`VideoVAE.clip_extent` is `ClipExtent.CHUNKS_AFTER_STATISTICS`, the capability `CLIP_STATISTICS`): a clip in
one chunk normalises each call with the statistics of what it holds, the whole clip; a clip in several chunks
takes them from the run (`RunState.clip_statistics`, the `model.execution.ClipStatistics` that the engine
gathers in passes over the clip first). A call on part of the clip with neither is refused rather than
normalised with part of the clip's statistics. Under exact tiles or row bands a tile's moments are merged
with the others' (the `Norm` contract of `model.execution`). Video tensors are B,C,T,H,W; statistics are
float32 B,G,T (one value per group and frame: that frame's span's), as `kernels.group_norm_apply` takes them.

The statistics of a span are merged from per-frame moments (mean and biased variance over C/G x H x W,
`kernels.group_norm_moments`) in float64, exactly: every frame of a span has the same count, so
mean = mean_f(m_f) and var = mean_f(v_f) + mean_f((m_f - mean)^2), without E[x^2] - E[x]^2 cancelling.
Merged this way, the moments of chunks and tiles give the whole clip's statistics within float64 rounding.
"""
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..kernels import group_norm_apply, group_norm_moments, merge_group_moments
from .execution import RunState


@dataclass(frozen=True)
class Windows:
    """Statistics per window of `size` latent frames instead of the whole clip: latent frame l is in
    window (l + offset) // size (core's decoder: {0, 1}, {2, 3}, ...; its encoder, whose first chunk is
    frame 0 alone: {0}, {1, 2}, {3, 4}, ... with offset 1: HunyuanVideo 1.0's in core's frames)."""

    size: int = 2
    offset: int = 0


class ClipGroupNorm(nn.GroupNorm):
    """GroupNorm over (C/G, T, H, W) of a span of frames (the whole clip, or `windows`), on B,C,T,H,W
    holding the whole clip.

    `frames_per_latent` is the temporal factor of the norm's layer (4 at pixel rate, 1 at the latent):
    frame 0 of the clip is latent frame 0, frame f > 0 belongs to latent frame (f - 1) // r + 1.
    """

    def __init__(self, channels: int, groups: int, frames_per_latent: int, windows: Windows | None, eps: float = 1e-6):
        super().__init__(groups, channels, eps=eps)
        self.frames_per_latent = frames_per_latent
        self.windows = windows

    def forward(self, x: torch.Tensor, ctx: RunState) -> torch.Tensor:
        return self._normalize(x, ctx, self.stats(x, ctx), act=False)

    def act(self, x: torch.Tensor, ctx: RunState, out: torch.Tensor | None = None, stats=None) -> torch.Tensor:
        """SiLU(GroupNorm(x)), written into `out` when given; `stats` from `stats()` when tiling."""
        return self._normalize(x, ctx, stats if stats is not None else self.stats(x, ctx), act=True, out=out)

    def stats(self, x: torch.Tensor, ctx: RunState) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, rstd) float32 B,G,t of the spans of x's frames (x: whole frames)."""
        return self.stats_of_parts([self.part_moments(x, ctx)], ctx)

    def part_moments(self, x: torch.Tensor, ctx: RunState):
        """(mean, biased var, elements per group and frame) of a part of the call's frames (a tile)."""
        mean, var = group_norm_moments(x, self.num_groups, ctx.opts.triton_norm, ctx.kernel_log)
        return mean, var, x.shape[1] // self.num_groups * x.shape[-2] * x.shape[-1]

    def stats_of_parts(self, parts: list, ctx: RunState):
        """The spans' (mean, rstd) of the call's frames from the `part_moments` of parts that cover them once:
        from the run's whole-clip statistics where the clip runs in several chunks, else from these frames,
        the whole clip."""
        mean, var = merge_group_moments([(m.double(), v.double(), n) for m, v, n in parts])  # float64 B,G,t
        if ctx.clip_statistics is not None:
            return ctx.clip_statistics.of(self, mean, var, ctx.cache.advance(self, mean.shape[-1]))
        _require_whole_clip(self, ctx)
        return self.clip_stats(mean, var)

    def _normalize(self, x, ctx, stats, act: bool, out=None):
        return group_norm_apply(x, *stats, self.weight, self.bias, act, out, triton=ctx.opts.triton_norm,
                                log=ctx.kernel_log)

    def clip_stats(self, means: torch.Tensor, variances: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-frame moments of the whole clip (float64 B,G,T) -> each frame's span's (mean, rstd), float32 B,G,T
        (`model.execution.ClipNorm`)."""
        spans = [self.span_of(self.latent_of(f)) for f in range(means.shape[-1])]
        mean, rstd = torch.empty_like(means), torch.empty_like(means)
        for span in sorted(set(spans)):
            frames = torch.tensor([f for f, s in enumerate(spans) if s == span], device=means.device)
            m, v = means.index_select(-1, frames), variances.index_select(-1, frames)  # B,G,n: the span's frames
            centre = m.mean(-1, keepdim=True)
            var = v.mean(-1, keepdim=True) + (m - centre).square().mean(-1, keepdim=True)
            mean.index_copy_(-1, frames, centre.expand_as(m))
            rstd.index_copy_(-1, frames, torch.rsqrt(var + self.eps).expand_as(m))
        return mean.float(), rstd.float()

    def latent_of(self, frame: int) -> int:
        """The latent frame that frame `frame` of this layer belongs to."""
        return 0 if frame == 0 else (frame - 1) // self.frames_per_latent + 1

    def span_of(self, latent: int) -> int:
        """The span (0: the whole clip, or the window) latent frame `latent` belongs to."""
        return 0 if self.windows is None else (latent + self.windows.offset) // self.windows.size


def _require_whole_clip(norm: ClipGroupNorm, ctx: RunState) -> None:
    """A call that holds part of the clip, in a run that gathered no whole-clip statistics, would be normalised
    with part of its statistics: refused."""
    if not (ctx.first_chunk and ctx.last_chunk):
        raise RuntimeError(f"{type(norm).__name__} takes its statistics over the whole clip, but this run gives it "
                           "part of the clip without the clip's statistics: run the clip as one chunk, or through "
                           "the engine (`vae.decode`, `vae.encode`), which gathers them first")
