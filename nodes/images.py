"""IMAGE <-> video: validating an IMAGE for encoding, splitting its frames into clips, and the views
the decoder writes IMAGE frames through.

IMAGE (ComfyUI's convention): N,H,W,3 in 0..1, video frames along N; float32, or float16 under core's
--fp16-intermediates. The library's video is B,3,T,H,W in [-1, 1].
"""
from dataclasses import dataclass

import torch

from ..vae import is_4n1

MAX_FRAMES = 16385  # frames of one IMAGE batch or clip
MAX_SIZE = 16384  # pixels: a frame's width or height


def _frame_list(mask: torch.Tensor) -> str:
    frames = mask.nonzero().flatten().tolist()
    return ", ".join(map(str, frames[:10])) + (f", ... ({len(frames)} frames)" if len(frames) > 10 else "")


def check_image(image) -> tuple[torch.Tensor, list[str]]:
    """An IMAGE made ready for encoding: N,H,W,3 floats, plus notes on what was adapted.

    Alpha (RGBA, or gray + alpha) is dropped and grayscale copied to R, G and B, each with a note;
    8-bit (uint8) frames are scaled to 0..1. Anything that would silently give a wrong latent (no
    frames, another layout, integer or NaN/Inf values, values far outside 0..1) raises ValueError
    saying what to do.
    """
    if not isinstance(image, torch.Tensor):
        raise ValueError(f"the IMAGE input is a {type(image).__name__}, not an image tensor; connect an IMAGE output")
    if image.dim() != 4:
        raise ValueError(f"an IMAGE must be 4-D frames,height,width,channels; got shape {tuple(image.shape)}. "
                         "Connect an IMAGE output (a MASK needs Convert Mask to Image first).")
    n, h, w, c = image.shape
    if n == 0 or h == 0 or w == 0:
        raise ValueError(f"the IMAGE is empty (shape {tuple(image.shape)}): it has no frames or no pixels; "
                         "check the node that made it (a load that matched no files, a crop to zero size)")
    notes = []
    if image.dtype == torch.uint8:
        image = image.float() / 255
        notes.append("8-bit IMAGE: values divided by 255")
    elif image.dtype == torch.bool:
        image = image.float()
    elif not image.dtype.is_floating_point:
        raise ValueError(f"IMAGE values are {str(image.dtype).removeprefix('torch.')}; StreamVAE needs floats in 0..1 "
                         "(ComfyUI's IMAGE convention): convert with values / max value first")
    if c in (2, 4):
        notes.append(f"IMAGE has an alpha channel ({c} channels): alpha dropped, the VAE encodes colour only; "
                     "composite over a background first if transparency matters")
        image = image[..., :c - 1]
    if image.shape[-1] not in (1, 3):
        raise ValueError(f"an IMAGE needs 1, 3 or 4 channels on its last axis (N,H,W,C); got shape {tuple(image.shape)}"
                         + (" - it looks channels-first (N,C,H,W): permute it to N,H,W,C" if h in (1, 3, 4) else ""))
    low, high = image.reshape(n, -1).aminmax(dim=1)  # per frame, one pass; NaN propagates, Inf stays Inf
    bad = ~(torch.isfinite(low) & torch.isfinite(high))
    if bool(bad.any()):
        raise ValueError(f"the IMAGE has NaN or Inf values in frame(s) {_frame_list(bad)} (0-based); fix the node "
                         "that made them (an fp16 overflow upstream is the usual cause)")
    low, high = float(low.min()), float(high.max())
    if low < -0.5 or high > 1.5:
        hint = "divide by 255" if high > 2 else "map -1..1 to 0..1 with (x + 1) / 2" if low < -0.5 else "clamp it to 0..1"
        raise ValueError(f"IMAGE values range from {low:.3g} to {high:.3g}, but an IMAGE holds 0..1: {hint} first")
    if low < 0 or high > 1:  # a resize filter's overshoot: the library takes [-1, 1] only, so `clip_video` clamps
        notes.append(f"IMAGE values range from {low:.3g} to {high:.3g} (a filter's overshoot): clamped to 0..1")
    if image.shape[-1] == 1:
        notes.append("grayscale IMAGE: copied to R, G and B")
        image = image.expand(n, h, w, 3)
    return image, notes


@dataclass
class Clips:
    """An IMAGE split into clips: clip i is frames `spans[i]` of the batch, `length` frames long
    after padding (the last clip repeats its last frame when it is short)."""

    spans: list[tuple[int, int]]
    length: int

    @property
    def frames(self) -> list[int]:
        return [stop - start for start, stop in self.spans]


def clip_batch(image, batch_size: int) -> tuple[torch.Tensor, int, list[str]]:
    """A 5-D IMAGE B,T,H,W,C (B clips of T frames, as core's SeedVR2 Pre-Process makes it) as the
    N,H,W,C frames of B clips of T (`batch_size` T, with a note); any other IMAGE as it is. Raises
    ValueError when a `batch_size` other than 0 or T contradicts the clips."""
    if not isinstance(image, torch.Tensor) or image.dim() != 5:
        return image, batch_size, []
    b, t = image.shape[:2]
    if batch_size not in (0, t):
        raise ValueError(f"this IMAGE holds {b} clips of {t} frames (5-D B,T,H,W,C), but batch_size is {batch_size}: "
                         "set batch_size to 0")
    return image.reshape(b * t, *image.shape[2:]), t, [f"5-D IMAGE: {b} clip(s) of {t} frames"]


def split_clips(num_frames: int, batch_size: int) -> Clips:
    """How `num_frames` IMAGE frames become clips: 0 = one clip, k = clips of k frames."""
    if num_frames < 1:
        raise ValueError("the IMAGE batch is empty")
    size = num_frames if batch_size == 0 else batch_size
    spans = [(start, min(start + size, num_frames)) for start in range(0, num_frames, size)]
    return Clips(spans, size if batch_size else num_frames)


def clip_video(image: torch.Tensor, span: tuple[int, int], length: int) -> torch.Tensor:
    """Frames `span` of IMAGE (N,H,W,3, 0..1 give or take an overshoot `check_image` noted) as a video
    1,3,length,H,W in [-1, 1] (a new tensor, clamped), padded to `length` frames by repeating the last frame."""
    start, stop = span
    index = torch.arange(start, start + length).clamp_(max=stop - 1)
    frames = image.index_select(0, index.to(image.device))
    # Contiguous B,C,T,H,W; the engine puts each chunk into the run's activation layout (NCDHW or NDHWC).
    return frames.permute(3, 0, 1, 2).unsqueeze(0).float().contiguous().mul_(2).sub_(1).clamp_(-1, 1)


def image_view(image: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """IMAGE frames [start, stop) as a 1,3,T,H,W view, for the decoder to write into directly."""
    return image[start:stop].permute(3, 0, 1, 2).unsqueeze(0)


def finish_image(image: torch.Tensor) -> torch.Tensor:
    """Decoder output in [-1, 1] (not clamped) -> IMAGE values 0..1, in place."""
    return image.add_(1).mul_(0.5).clamp_(0, 1)


def check_batch_size(batch_size=None) -> str | None:
    """0 (one clip), 1 (independent images) or 4n+1 frames per clip (the SeedVR2 rule)."""
    if batch_size is None:
        return None
    if batch_size < 0 or batch_size > MAX_FRAMES:
        return f"batch_size must be between 0 and {MAX_FRAMES}; got {batch_size}."
    if batch_size and not is_4n1(batch_size):
        lower, upper = batch_size - (batch_size - 1) % 4, batch_size - (batch_size - 1) % 4 + 4
        return (f"batch_size must be 0 (the whole batch is one clip), 1 (every frame is its own image) or 4n+1 "
                f"frames per clip (5, 9, 13, ...); got {batch_size}: use {lower} or {upper}.")
    return None
