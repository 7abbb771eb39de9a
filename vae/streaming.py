"""The streaming engine: runs a whole clip through a `VideoVAE` in temporal chunks.

Pixel frames and latent frames correspond as 0 <-> 0 and latent i <-> pixels 4i-3..4i, so a chunk of
c latent frames is 1 + 4(c-1) pixel frames for the first chunk and 4c afterwards. The causal caches
in the `StreamContext` make every chunking produce the whole-clip result; chunks are written into a
preallocated output (optionally on another device), so memory does not grow with clip length beyond
the output itself.
"""
from typing import Callable

import torch
import torch.nn.functional as F

from .blocks import StreamContext

ProgressFn = Callable[[int, int], None]


def _pixel_span(chunk_index: int, chunk: int, n_latent: int, temporal_factor: int) -> tuple[int, int]:
    """Pixel-frame range [start, stop) of latent frames [chunk_index*chunk, (chunk_index+1)*chunk)."""
    first, last = chunk_index * chunk, min((chunk_index + 1) * chunk, n_latent) - 1
    start = 0 if first == 0 else temporal_factor * (first - 1) + 1
    return start, temporal_factor * last + 1


def latent_frames(num_frames: int, temporal_factor: int = 4) -> int:
    """Latent frames for `num_frames` pixel frames (after padding to the next 4n+1)."""
    return (num_frames - 1 + temporal_factor - 1) // temporal_factor + 1


def pixel_frames(num_latent: int, temporal_factor: int = 4) -> int:
    return temporal_factor * (num_latent - 1) + 1


def _check_chunk(temporal_chunk: int | None, total: int) -> int:
    if temporal_chunk is None:
        return 1
    if not isinstance(temporal_chunk, int) or temporal_chunk < 1:
        raise ValueError(f"temporal_chunk must be a positive number of latent frames, got {temporal_chunk!r}")
    return min(temporal_chunk, total)


def encode(
    model,
    video: torch.Tensor,
    temporal_chunk: int | None = None,
    *,
    return_logvar: bool = False,
    out_device: torch.device | str | None = None,
    progress: ProgressFn | None = None,
):
    """Encode pixels B,3,T,H,W (or B,3,H,W) in [-1, 1] to the raw posterior mean B,C,T',h,w.

    T is padded to 4n+1 by repeating the last frame and H, W to multiples of the spatial factor by
    edge replication, one chunk at a time (the padded clip is never materialised). With
    `return_logvar` the result is (mean, logvar).
    """
    image = video.dim() == 4
    if image:
        video = video.unsqueeze(2)
    if video.dim() != 5:
        raise ValueError(f"encode expects pixels B,3,T,H,W or an image B,3,H,W; got shape {tuple(video.shape)}")
    b, c, t, h, w = video.shape
    if c != model.in_channels:
        raise ValueError(f"encode expects {model.in_channels} colour channels on dim 1, got {c} (shape {tuple(video.shape)})")
    if t < 1 or h < 1 or w < 1:
        raise ValueError(f"encode got an empty video of shape {tuple(video.shape)}")
    sf, tf = model.spatial_factor, model.temporal_factor
    hp, wp = -(-h // sf) * sf, -(-w // sf) * sf
    n_lat = latent_frames(t, tf)
    chunk = _check_chunk(temporal_chunk, n_lat)
    device, dtype = model.device, model.encode_dtype
    out_device = video.device if out_device is None else torch.device(out_device)
    out_dtype = video.dtype if video.dtype.is_floating_point else torch.float32
    shape = (b, model.latent_channels, n_lat, hp // sf, wp // sf)
    mean = torch.empty(shape, dtype=out_dtype, device=out_device)
    logvar = torch.empty(shape, dtype=out_dtype, device=out_device) if return_logvar else None
    ctx = StreamContext(model.opts)
    n_chunks = -(-n_lat // chunk)
    with torch.inference_mode():
        for i in range(n_chunks):
            start, stop = _pixel_span(i, chunk, n_lat, tf)
            # Frames past the end repeat the last real frame (T -> next 4n+1).
            index = torch.arange(start, stop).clamp_(max=t - 1).to(video.device)
            x = video.index_select(2, index).to(device=device, dtype=dtype)
            if hp != h or wp != w:
                x = F.pad(x, (0, wp - w, 0, hp - h, 0, 0), mode="replicate")
            m, lv = model.encode_chunk(x, ctx)
            ctx.first_chunk = False
            lo = i * chunk
            mean[:, :, lo:lo + m.shape[2]] = m
            if logvar is not None:
                logvar[:, :, lo:lo + lv.shape[2]] = lv
            if progress is not None:
                progress(i + 1, n_chunks)
    if image:
        mean = mean.squeeze(2)
        logvar = logvar.squeeze(2) if logvar is not None else None
    return (mean, logvar) if return_logvar else mean


def decode(
    model,
    z: torch.Tensor,
    temporal_chunk: int | None = None,
    *,
    num_frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    out: torch.Tensor | None = None,
    out_device: torch.device | str | None = None,
    out_dtype: torch.dtype | None = None,
    progress: ProgressFn | None = None,
) -> torch.Tensor:
    """Decode a raw latent B,C,T',h,w (or B,C,h,w) to pixels B,3,T,H,W (or B,3,H,W), not clamped.

    `num_frames`, `height`, `width` trim the output (to undo `encode`'s padding); the decoded chunks
    are written straight into a preallocated buffer (`out`, or a new one on `out_device`).
    """
    image = z.dim() == 4
    if image:
        z = z.unsqueeze(2)
    if z.dim() != 5:
        raise ValueError(f"decode expects a latent B,C,T,h,w or B,C,h,w; got shape {tuple(z.shape)}")
    b, c, n_lat, h, w = z.shape
    if c != model.latent_channels:
        raise ValueError(
            f"this {model.family} VAE expects {model.latent_channels}-channel latents, got {c} channels "
            f"(shape {tuple(z.shape)}); was the latent made by another VAE family?")
    if n_lat < 1:
        raise ValueError("decode got a latent with zero frames")
    sf, tf = model.spatial_factor, model.temporal_factor
    full_t, full_h, full_w = pixel_frames(n_lat, tf), h * sf, w * sf
    t_out = full_t if num_frames is None else num_frames
    h_out = full_h if height is None else height
    w_out = full_w if width is None else width
    for name, value, limit in (("num_frames", t_out, full_t), ("height", h_out, full_h), ("width", w_out, full_w)):
        if not 1 <= value <= limit:
            raise ValueError(f"{name}={value} is outside 1..{limit}, the size this latent decodes to")
    chunk = _check_chunk(temporal_chunk, n_lat)
    device, dtype = model.device, model.decode_dtype
    shape = (b, 3, t_out, h_out, w_out)
    if out is None:
        out = torch.empty(shape, dtype=out_dtype or (z.dtype if z.dtype.is_floating_point else torch.float32),
                          device=z.device if out_device is None else out_device)
    elif tuple(out.shape) != shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {shape}")
    ctx = StreamContext(model.opts)
    n_chunks = -(-n_lat // chunk)
    pos = 0
    with torch.inference_mode():
        for i in range(n_chunks):
            zc = z[:, :, i * chunk:(i + 1) * chunk].to(device=device, dtype=dtype)
            y = model.decode_chunk(zc, ctx)
            ctx.first_chunk = False
            n = min(y.shape[2], t_out - pos)
            out[:, :, pos:pos + n] = y[:, :, :n, :h_out, :w_out]
            pos += n
            if progress is not None:
                progress(i + 1, n_chunks)
            if pos >= t_out:
                break
    return out.squeeze(2) if image else out
