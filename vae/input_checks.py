"""What the engine refuses in its inputs before any work: pixels that would silently become a wrong
latent. (A latent's checks, which can also repair it, are the engine's `_checked_latent`.)"""
import torch

PIXEL_ROUNDING = 1e-3  # how far outside [-1, 1] encode's pixels may be (rounding, not another convention)


def frame_list(frames: list[int]) -> str:
    """Frame numbers for a message: the first ten, and how many in all."""
    return ", ".join(map(str, frames[:10])) + (f", ... ({len(frames)} frames)" if len(frames) > 10 else "")


def check_pixels(video: torch.Tensor) -> None:
    """ValueError for pixels `encode` would silently turn into a wrong latent (video B,C,T,H,W, read a
    frame at a time: a whole-video mask would double its memory): NaN/Inf, naming the frames, and
    values outside [-1, 1] by more than rounding (0..255 or 0..1 conventions), saying the range."""
    if video.device.type == "meta":
        return
    lows, highs = zip(*(video[:, :, i].aminmax() for i in range(video.shape[2])))  # NaN propagates, Inf stays
    low, high = torch.stack(lows).double(), torch.stack(highs).double()
    bad = torch.nonzero(~(torch.isfinite(low) & torch.isfinite(high))).flatten().tolist()
    if bad:
        raise ValueError(f"the video has NaN/Inf pixels in frame(s) {frame_list(bad)} (0-based): whatever made them "
                         "diverged (often an fp16 overflow); fix it, or replace those frames")
    low, high = float(low.min()), float(high.max())
    if low < -1 - PIXEL_ROUNDING or high > 1 + PIXEL_ROUNDING:
        hint = "0..255 values: x / 127.5 - 1" if high > 2 else "clamp to [-1, 1] first"
        raise ValueError(f"encode takes pixels in [-1, 1] (0..1 images as x * 2 - 1), but these range from {low:.4g} to "
                         f"{high:.4g}: {hint}")
