"""RGBA at the node edges, for VAEs with 4 image channels (Qwen-Image-Layered, Qwen-Image 2.1).

Encode: the IMAGE's own alpha (RGBA, or gray + alpha), else 1 - MASK (ComfyUI's mask convention: Load
Image gives MASK = 1 - alpha), else opaque: alpha 1, as core's VAE Encode pads a 3-channel IMAGE for
its RGBA Wan VAE. Decode: the 4-channel IMAGE core's VAE Decode gives (R, G, B, alpha), and the alpha
as a MASK (1 - alpha) for the nodes that take one. Layouts: IMAGE N,H,W,C in 0..1; MASK N,H,W.
"""
import torch
import torch.nn.functional as F

from .images import check_image


def _unit(values: torch.Tensor, what: str) -> torch.Tensor:
    """An alpha or mask channel as float32 in 0..1 (8-bit scaled, NaN/Inf refused)."""
    if values.dtype == torch.uint8:
        values = values.float() / 255
    values = values.float()
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"the {what} has NaN or Inf values; fix the node that made it")
    return values.clamp(0, 1)


def _mask_alpha(mask: torch.Tensor, frames: int, height: int, width: int, notes: list[str]) -> torch.Tensor:
    """1 - MASK as N,H,W alpha: one mask for every frame or one per frame, resized to the frames."""
    if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 3):
        raise ValueError(f"the MASK must be N,H,W or H,W; got {getattr(mask, 'shape', type(mask).__name__)}")
    mask = _unit(mask if mask.dim() == 3 else mask.unsqueeze(0), "MASK")
    if mask.shape[0] not in (1, frames):
        raise ValueError(f"the MASK has {mask.shape[0]} frames but the IMAGE {frames}: connect one mask, or one per frame")
    if tuple(mask.shape[1:]) != (height, width):
        notes.append(f"MASK of {mask.shape[2]}x{mask.shape[1]} px resized to the {width}x{height} px frames")
        mask = F.interpolate(mask.unsqueeze(1), size=(height, width), mode="bilinear", align_corners=False).squeeze(1)
    return (1 - mask).expand(frames, height, width)


def encode_input(image, mask, channels: int) -> tuple[torch.Tensor, list[str]]:
    """IMAGE (+ optional MASK) -> frames N,H,W,`channels` in 0..1 for a VAE with `channels` image
    channels, and notes on what was adapted (see the module docstring for where alpha comes from)."""
    if channels != 4:
        image, notes = check_image(image)
        if mask is not None:
            notes.append("MASK ignored: this VAE encodes colour only (3 channels)")
        return image, notes
    own_alpha = isinstance(image, torch.Tensor) and image.dim() == 4 and image.shape[-1] in (2, 4)
    color, notes = check_image(image[..., :-1] if own_alpha else image)
    n, h, w, _ = color.shape
    if mask is not None:
        alpha = _mask_alpha(mask, n, h, w, notes)
        if own_alpha:
            notes.append("the IMAGE's own alpha replaced by 1 - MASK")
    elif own_alpha:
        alpha = _unit(image[..., -1], "IMAGE alpha")
    else:
        alpha = color.new_ones((n, h, w))
        notes.append("IMAGE without alpha: encoded opaque (alpha 1), as core's VAE Encode does; connect a MASK "
                     "(1 - alpha) or an RGBA IMAGE for transparency")
    return torch.cat([color, alpha.to(color).unsqueeze(-1)], dim=-1), notes


def decoded_mask(image: torch.Tensor) -> torch.Tensor:
    """Decoded IMAGE N,H,W,C -> its MASK, 1 - alpha (N,H,W) for RGBA; for RGB the empty 64x64 mask
    Load Image gives an image without alpha."""
    if image.shape[-1] == 4:
        return 1 - image[..., 3]
    return torch.zeros((1, 64, 64), dtype=torch.float32, device=image.device)
