"""StreamVAE Test Pattern: synthetic moving frames, so example workflows need no downloads and tile
seams, colour shifts and temporal flicker are easy to see."""
import math

import torch
from comfy_api.latest import io

from . import core_api
from .images import MAX_FRAMES

PATTERNS = ("bars", "checker", "zoneplate")


def render(pattern: str, frames: int, height: int, width: int) -> torch.Tensor:
    """IMAGE frames,height,width,3 in 0..1; everything moves a little from frame to frame."""
    t = torch.arange(frames, dtype=torch.float32).view(-1, 1, 1)
    y = torch.linspace(0, 1, height).view(1, -1, 1)
    x = torch.linspace(0, 1, width).view(1, 1, -1)
    phase = 2 * math.pi * t / max(frames, 8)
    if pattern == "bars":  # diagonal colour bars drifting right
        r = 0.5 + 0.5 * torch.sin(2 * math.pi * 4 * (x + 0.5 * y) - phase)
        g = 0.5 + 0.5 * torch.sin(2 * math.pi * 3 * (y - 0.3 * x) + phase)
        b = (x + y + t / max(frames, 1)) % 1.0
    elif pattern == "checker":  # 8x8 checkerboard sliding diagonally, tinted by position
        cells = ((x * 8 + t * 0.125).floor() + (y * 8 + t * 0.125).floor()) % 2
        r, g, b = cells * 0.8 + 0.1 * x, cells * 0.6 + 0.3 * y, 1 - cells * 0.7
    else:  # zone plate: rings of rising frequency, zooming; shows aliasing and seams at once
        d2 = (x - 0.5) ** 2 + (y - 0.5) ** 2
        r = g = b = 0.5 + 0.5 * torch.cos(2 * math.pi * 40 * d2 * (1 + 0.05 * t))
        g = g * 0.9 + 0.1 * x
    return torch.stack(torch.broadcast_tensors(r, g, b), dim=-1).clamp_(0, 1).contiguous()


class TestPattern(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return core_api.schema(
            node_id="StreamVAETestPattern",
            display_name="StreamVAE Test Pattern",
            category="StreamVAE",
            search_aliases=["test video", "synthetic frames"],
            description="Synthetic moving test frames (no files needed), for trying tile sizes and comparing "
                        "exact and fast tiling.",
            inputs=[
                io.Int.Input("width", default=512, min=16, max=8192, step=8, tooltip="Frame width in pixels."),
                io.Int.Input("height", default=320, min=16, max=8192, step=8, tooltip="Frame height in pixels."),
                io.Int.Input("frames", default=17, min=1, max=MAX_FRAMES, step=1, tooltip=(
                    "Number of frames. Video VAEs work in 4n+1 frames (1, 5, 9, 17, ...); StreamVAE Encode pads "
                    "other counts.")),
                io.Combo.Input("pattern", options=list(PATTERNS), default="bars", tooltip=(
                    "bars = drifting colour bars; checker = sliding checkerboard (shows seams); zoneplate = rings "
                    "(shows aliasing and seams).")),
            ],
            outputs=[io.Image.Output(tooltip="Frames along the batch axis (N,H,W,3), values 0..1.")],
        )

    @classmethod
    def execute(cls, width=512, height=320, frames=17, pattern="bars") -> io.NodeOutput:
        return io.NodeOutput(render(pattern, frames, height, width))
