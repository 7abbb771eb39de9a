"""Wan-architecture configurations read from a checkpoint's tensor shapes.

Many released VAEs are the Wan network at other sizes: pruned widths (LightVAE), RGBA input and
output (Qwen-Image-Layered), decoders that emit a 2x2 pixel block per pixel (2x upscale decoders),
deeper and image-only ones (Qwen-Image 2.1). Every size is read from the weights, in the places
ComfyUI core reads them, for upstream / ComfyUI key names and diffusers' (renamed first by
`diffusers_to_native` below):

    dim               encoder.conv1.weight out channels (Wan2.1: decoder.head.0.gamma too, which must agree)
    dec_dim           decoder.head.0.gamma (the Wan2.2 layout's separate decoder width)
    z_dim             decoder.conv1.weight in channels
    image channels    encoder.conv1.weight in channels = channels * patch^2, channels 3 (RGB) or 4 (RGBA)
    upscale           decoder.head.2.weight out channels = channels * patch^2 * upscale^2
    dim_mult, depth   the encoder stages' residual widths / dim, one entry per stage
    num_res_blocks    residual blocks in the first encoder stage
    temporal factor   2 ** (stages with a time_conv); 1 for an image-only network (temporal kernel 1)
    temporal kernel   encoder.conv1.weight's time extent: 3, or 1 (diffusers stores those convs 4-D)

Shapes that fit none of these rules are refused with a `LayoutError` naming them.
"""
import re

from ..video_vae import LayoutError

IMAGE_CHANNELS = (3, 4)  # RGB, RGBA
PATCH_SIZES = (1, 2)
TEMPORAL_KERNELS = (1, 3)


def encoder_stages(sd: dict, nested: bool) -> list[tuple[list[int], bool | None]]:
    """Per encoder stage: output channels of its residual blocks, and its resampler (True = down3d,
    False = down2d, None = none), read from the key names and shapes."""
    pattern = re.compile(r"encoder\.downsamples\.(\d+)\.downsamples\.(\d+)\." if nested else r"encoder\.downsamples\.(\d+)\.")
    prefixes = sorted({m[0] for m in map(pattern.match, sd) if m}, key=lambda p: tuple(map(int, re.findall(r"\d+", p))))
    stages, channels = [], []
    for p in prefixes:
        if f"{p}residual.2.weight" in sd:
            channels.append(sd[f"{p}residual.2.weight"].shape[0])
        elif f"{p}resample.1.weight" in sd:
            stages.append((channels, f"{p}time_conv.weight" in sd))
            channels = []
    if channels:
        stages.append((channels, None))
    return stages


def temporal_kernel(sd: dict) -> int:
    """The time extent of the network's 3x3 convs: encoder.conv1's (a 4-D weight is diffusers' image conv: 1)."""
    weight = sd["encoder.conv1.weight"]
    return weight.shape[2] if weight.dim() == 5 else 1


def _shape(sd: dict, key: str) -> str:
    return f"{key} {tuple(sd[key].shape)}"


def _image_channels(cin: int) -> tuple[int, int] | None:
    """(image channels, patch size) with channels * patch^2 == cin, or None."""
    return next(((c, p) for p in PATCH_SIZES for c in IMAGE_CHANNELS if c * p * p == cin), None)


def read(sd: dict, nested: bool) -> dict:
    """Every size of a Wan-architecture checkpoint (module docstring), as a dict: dim, dec_dim,
    z_dim, dim_mult, num_res_blocks, temperal_downsample, in_channels (image channels), patch_size,
    upscale, temporal_kernel. Raises LayoutError listing every shape that fits no rule, and KeyError
    for a missing tensor the rules read."""
    problems = []
    conv_in, head = sd["encoder.conv1.weight"], sd["decoder.head.2.weight"]
    dim, cin = conv_in.shape[0], conv_in.shape[1]
    kernel = temporal_kernel(sd)
    if kernel not in TEMPORAL_KERNELS:
        problems.append(f"{_shape(sd, 'encoder.conv1.weight')}: temporal kernel {kernel}, not 3 (video) or 1 (image)")
    image = _image_channels(cin)
    upscale = 1
    if image is None:
        problems.append(f"{_shape(sd, 'encoder.conv1.weight')}: {cin} input channels are not 3 (RGB) or 4 (RGBA) "
                        "image channels, or 4 times that when 2x2-patchified")
    else:
        c, p = image
        ratio = head.shape[0] / (c * p * p)
        upscale = round(ratio ** 0.5)
        if upscale < 1 or upscale * upscale != ratio:
            problems.append(f"{_shape(sd, 'decoder.head.2.weight')}: {head.shape[0]} output channels are not the "
                            f"{c * p * p} the encoder takes, or that times a square (a pixel-shuffle upscale)")
    stages = encoder_stages(sd, nested)
    if not stages or not stages[0][0]:
        raise KeyError("encoder.downsamples.0 residual blocks")
    dim_mult = []
    for i, (widths, _) in enumerate(stages):
        if any(w % dim for w in widths) or len(set(widths)) != 1:
            problems.append(f"encoder stage {i} residual widths {widths} are not one multiple of dim {dim}")
        dim_mult.append(widths[-1] // dim)
    if problems:
        raise LayoutError("; ".join(problems))
    return dict(dim=dim, dec_dim=sd["decoder.head.0.gamma"].shape[0], z_dim=sd["decoder.conv1.weight"].shape[1],
                dim_mult=tuple(dim_mult), num_res_blocks=len(stages[0][0]),
                temperal_downsample=tuple(bool(t) for _, t in stages[:-1]), in_channels=image[0],
                patch_size=image[1], upscale=upscale, temporal_kernel=kernel)


def refuse(sizes: dict, allowed: dict, family: str) -> None:
    """LayoutError when a size read by `read` is not one `family` has: `allowed` maps a size's name
    to (allowed values, what it means)."""
    problems = [f"{name} {sizes[name]} ({meaning})" for name, (values, meaning) in allowed.items()
                if sizes[name] not in values]
    if problems:
        raise LayoutError(f"no {family} variant has " + "; ".join(problems))


def with_frame_axis(sd: dict) -> dict:
    """diffusers' image-only Wan convs (4-D weights of causal convs whose time extent is 1) as the 5-D
    weights of the upstream layout; the per-frame 2-D convs (`resample.1`, attention) stay 4-D."""
    per_frame = ("resample.1.weight", "to_qkv.weight", "proj.weight")
    return {k: v.unsqueeze(2) if v.dim() == 4 and k.endswith(".weight") and not k.endswith(per_frame) else v
            for k, v in sd.items()}


# --- diffusers key names --------------------------------------------------------------------------

_DIFFUSERS_TOP = {"quant_conv": "conv1", "post_quant_conv": "conv2"}
_DIFFUSERS_SIDE = {"conv_in": "conv1", "norm_out": "head.0", "conv_out": "head.2"}
_DIFFUSERS_RESNET = {"norm1": "residual.0", "conv1": "residual.2", "norm2": "residual.3", "conv2": "residual.6",
                     "conv_shortcut": "shortcut"}
_BLOCK_KEY = re.compile(r"(encoder|decoder)\.(down|up)_blocks\.(\d+)\.(.+)")


def _resnet_leaf(tail: str) -> str:
    first, _, rest = tail.partition(".")
    return f"{_DIFFUSERS_RESNET[first]}.{rest}" if first in _DIFFUSERS_RESNET else tail


def diffusers_to_native(sd: dict, nested: bool) -> dict:
    """A diffusers `AutoencoderKLWan` state dict in upstream Wan key names.

    Rules: quant_conv/post_quant_conv -> conv1/conv2; conv_in -> conv1; norm_out/conv_out -> head.0/.2;
    mid_block.resnets.j -> middle.2j, mid_block.attentions.0 -> middle.1; norm1/conv1/norm2/conv2/
    conv_shortcut -> residual.0/.2/.3/.6, shortcut. Blocks: Wan2.1 (`nested=False`) keeps the flat
    encoder index and numbers the decoder's up_blocks.s.{resnets.j, upsamplers.0} consecutively;
    Wan2.2 (`nested=True`) maps X_blocks.i.resnets.j -> Xsamples.i.Xsamples.j and the block's
    resampler to the index after its last resnet. Unknown keys pass through for the strict check.
    """
    resnets: dict[tuple[str, int], int] = {}  # (side, block) -> resnets in it
    has_resampler: set[tuple[str, int]] = set()
    for key in sd:
        m = _BLOCK_KEY.fullmatch(key)
        if m:
            block, tail = (m[1], int(m[3])), m[4]
            r = re.match(r"resnets\.(\d+)\.", tail)
            if r:
                resnets[block] = max(resnets.get(block, 0), int(r[1]) + 1)
            elif re.match(r"(upsamplers\.0|upsampler|downsampler)\.", tail):
                has_resampler.add(block)
    offsets, total = {}, 0  # Wan2.1 decoder: flat index where each up block starts
    for block in sorted(b for b in resnets if b[0] == "decoder"):
        offsets[block] = total
        total += resnets[block] + (block in has_resampler)

    def rename(key: str) -> str:
        side, _, rest = key.partition(".")
        if side in _DIFFUSERS_TOP:
            return f"{_DIFFUSERS_TOP[side]}.{rest}"
        if side not in ("encoder", "decoder"):
            return key
        first, _, tail = rest.partition(".")
        if first in _DIFFUSERS_SIDE:
            return f"{side}.{_DIFFUSERS_SIDE[first]}.{tail}"
        m = re.fullmatch(r"mid_block\.(resnets|attentions)\.(\d+)\.(.+)", rest)
        if m:
            return f"{side}.middle.1.{m[3]}" if m[1] == "attentions" else f"{side}.middle.{2 * int(m[2])}.{_resnet_leaf(m[3])}"
        m = _BLOCK_KEY.fullmatch(key)
        if not m:
            return key
        block, tail, group = (side, int(m[3])), m[4], f"{m[2]}samples"
        r = re.fullmatch(r"resnets\.(\d+)\.(.+)", tail)
        s = re.fullmatch(r"(?:upsamplers\.0|upsampler|downsampler)\.(.+)", tail)
        if nested:
            if r:
                return f"{side}.{group}.{block[1]}.{group}.{r[1]}.{_resnet_leaf(r[2])}"
            if s:
                return f"{side}.{group}.{block[1]}.{group}.{resnets.get(block, 0)}.{s[1]}"
        elif side == "encoder":
            return f"encoder.downsamples.{block[1]}.{_resnet_leaf(tail)}"
        elif r:
            return f"decoder.upsamples.{offsets.get(block, 0) + int(r[1])}.{_resnet_leaf(r[2])}"
        elif s:
            return f"decoder.upsamples.{offsets.get(block, 0) + resnets.get(block, 0)}.{s[1]}"
        return key

    return {rename(k): v for k, v in sd.items()}
