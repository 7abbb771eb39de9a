"""The GroupNorm whose statistics span the whole clip (`vae.model.clip_norm.ClipGroupNorm`): statistics merged
from parts of the frames (what exact tiles and row bands hand it) equal the whole clip's, and it normalises as
torch's GroupNorm over each span of frames in float64; a call on part of the clip is refused."""
import pytest
import torch
import torch.nn.functional as F

from vae.kernels import Optimizations
from vae.model.clip_norm import ClipGroupNorm, Windows
from vae.run.run_context import RunContext

OPTS = Optimizations(kernel_choice="defaults")


def _whole_clip() -> RunContext:
    ctx = RunContext(OPTS)
    for _ in ctx.chunks(1, 1):  # the clip in one chunk: it holds the first and the last frame
        return ctx


@pytest.mark.parametrize("windows", [None, Windows(2, 1)])
def test_statistics_of_parts_are_the_clips(windows):
    """A clip whose mean is 1000x its spread (where float32 sums of squares would cancel): the statistics merged
    from column parts equal those of the whole frames, and normalise as torch's GroupNorm over each span in
    float64 (the whole clip; windows of latent frames {0}, {1, 2})."""
    norm = ClipGroupNorm(8, groups=2, frames_per_latent=4, windows=windows).requires_grad_(False)
    norm.weight.normal_(generator=torch.Generator().manual_seed(3))
    norm.bias.normal_(generator=torch.Generator().manual_seed(5))
    x = 1000 + torch.randn(1, 8, 9, 6, 5, generator=torch.Generator().manual_seed(4))  # B,C,T,H,W: 3 latent frames
    ctx = _whole_clip()
    whole = norm.stats(x, ctx)
    merged = norm.stats_of_parts([norm.part_moments(x[..., cols], ctx) for cols in (slice(0, 2), slice(2, 5))], ctx)
    for got, want in zip(merged, whole):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=0)  # float32 moments of a frame
    spans = [range(0, 9)] if windows is None else [range(0, 1), range(1, 9)]  # latent {0} | {1, 2}
    expected = torch.cat([F.group_norm(x[:, :, s.start:s.stop].double(), 2, norm.weight.double(), norm.bias.double(),
                                       norm.eps) for s in spans], dim=2)
    torch.testing.assert_close(norm(x, ctx).double(), expected, rtol=0, atol=1e-4)
    torch.testing.assert_close(norm.act(x, ctx, stats=merged).double(), F.silu(expected), rtol=0, atol=1e-4)


def test_part_of_the_clip_is_refused():
    norm = ClipGroupNorm(8, groups=2, frames_per_latent=1, windows=None)
    ctx = RunContext(OPTS)
    for _ in ctx.chunks(2, 1):  # the clip's first chunk of two
        with pytest.raises(RuntimeError, match="statistics over the whole clip"):
            norm(torch.zeros(1, 8, 1, 2, 2), ctx)
        break
