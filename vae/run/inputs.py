"""What `encode` and `decode` refuse in their inputs before anything is planned, because it would silently
turn into wrong output: pixels of other colour channels, NaN/Inf or another value convention
(`check_pixels`); a latent of another family, empty, or with NaN/Inf frames (`checked_latent`, which can
also repair it). A checkpoint's checks are `loading`'s."""
import logging
import warnings

import torch

log = logging.getLogger("streamvae")

NONFINITE_MODES = ("error", "zero")  # what `checked_latent` does with NaN/Inf: refuse, or set them to 0

PIXEL_ROUNDING = 1e-3  # how far outside [-1, 1] encode's pixels may be (rounding, not another convention)


def frame_list(frames: list[int]) -> str:
    """Frame numbers for a message: the first ten, and how many in all."""
    return ", ".join(map(str, frames[:10])) + (f", ... ({len(frames)} frames)" if len(frames) > 10 else "")


def check_pixels(model, video) -> None:
    """ValueError for pixels `encode` of `model` cannot take (video B,C,T,H,W, or a frame source): other
    colour channels, an empty video; and, in a tensor (a frame source, a video file, gives [-1, 1]
    by construction), what it would silently turn into a wrong latent, read a frame at a time (a
    whole-video mask would double its memory): NaN/Inf, naming the frames, and values outside
    [-1, 1] by more than rounding (0..255 or 0..1 conventions), saying the range."""
    b, c, t, h, w = video.shape
    if c != model.in_channels:
        raise ValueError(f"encode expects {model.in_channels} colour channels on dim 1, got {c} (shape {tuple(video.shape)})")
    if t < 1 or h < 1 or w < 1:
        raise ValueError(f"encode got an empty video of shape {tuple(video.shape)}")
    if not isinstance(video, torch.Tensor) or video.device.type == "meta":
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


def _nonfinite_frames(z: torch.Tensor) -> list[int]:
    """Latent frames with NaN/Inf, checked a frame at a time: a whole-latent mask would grow with the clip."""
    if z.device.type == "meta":  # shape-only runs (FLOP counting) have no values to check
        return []
    finite = torch.stack([torch.isfinite(z[:, :, i]).all() for i in range(z.shape[2])])
    return torch.nonzero(~finite).flatten().tolist()


def checked_latent(model, z: torch.Tensor, nonfinite: str) -> torch.Tensor:
    """z (B,C,T',h,w) after the checks `engine.decode` documents (floats with values, channels, an empty latent, NaN/Inf frames); NaN/Inf set to 0 with nonfinite="zero"."""
    if not z.dtype.is_floating_point:
        raise ValueError(f"decode takes a latent of floating-point numbers, got {str(z.dtype).removeprefix('torch.')} "
                         f"values (shape {tuple(z.shape)}): this is not a latent an encoder or a sampler made")
    if z.device.type == "meta" and model.device.type != "meta":  # (a meta model counts what a run allocates)
        raise ValueError(f"the latent is on the meta device (a shape without values), the model on {model.device}: "
                         "pass the latent itself")
    b, c, n_lat, h, w = z.shape
    if c != model.latent_channels:
        raise ValueError(
            f"this {model.family} VAE expects {model.latent_channels}-channel latents, got {c} channels "
            f"(shape {tuple(z.shape)}); was the latent made by another VAE family?")
    if n_lat < 1 or h < 1 or w < 1:
        raise ValueError(f"decode got an empty latent of shape {tuple(z.shape)}")
    if nonfinite not in NONFINITE_MODES:
        raise ValueError(f"nonfinite must be one of {NONFINITE_MODES}, got {nonfinite!r}")
    bad = _nonfinite_frames(z)
    if bad and nonfinite == "error":
        raise ValueError(f"the latent has NaN/Inf values in latent frame(s) {bad} (of {n_lat}): the sampler that made it "
                         "diverged (often fp16 overflow; try bf16/fp32 sampling). To decode anyway with those values "
                         "set to 0, pass nonfinite='zero' (StreamVAE Decode: nonfinite = zero).")
    if bad:
        message = f"StreamVAE: latent frame(s) {bad} have NaN/Inf values; decoding with them set to 0"
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        z = torch.nan_to_num(z, nan=0.0, posinf=0.0, neginf=0.0)
    return z
