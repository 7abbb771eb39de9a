"""Running the library's encode/decode inside ComfyUI: memory plan -> `load_models_gpu` -> the engine,
one progress step per tile x chunk (also ComfyUI's interrupt point), backend flags and compile limits
around the call, clips one after another so the peak does not grow with the batch.
"""
import contextlib
import logging
from dataclasses import dataclass, field

import torch

from ..optimizations import backend, run_with_fallback
from ..optimizations.compile import dynamo_limits
from ..vae import streaming
from . import faults, planning
from .common import Clips, LatentClips, Tiling, clip_video, finish_image, image_view

try:
    import comfy.model_management as mm
    import comfy.utils as comfy_utils
    from comfy.cli_args import args as comfy_args
except ImportError:
    mm = comfy_utils = comfy_args = None

log = logging.getLogger("streamvae")
IMAGE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


@dataclass
class RunReport:
    """What one Encode/Decode did, for the node's UI message (and the web extension)."""

    op: str
    plan: planning.PlanInfo
    clips: int
    steps: int = 0
    measured_peak_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"op": self.op, "plan": self.plan.as_dict(), "summary": self.plan.summary(), "clips": self.clips,
                "steps": self.steps, "measured_peak_bytes": self.measured_peak_bytes, "notes": self.notes}


class Progress:
    """One ComfyUI progress bar over all clips; the engine reports (done, total) per clip."""

    def __init__(self, clips: int, report: RunReport):
        self.clips, self.report, self.index, self.bar = clips, report, 0, None

    def __call__(self, done: int, total: int) -> None:
        self.report.steps += 1
        if comfy_utils is None:
            return
        if self.bar is None:
            self.bar = comfy_utils.ProgressBar(total * self.clips)
        # The hook behind update_absolute raises ComfyUI's interrupt exception when /interrupt was called.
        self.bar.update_absolute(self.index * total + done, total * self.clips)


def _cancel() -> bool:
    return mm is not None and mm.processing_interrupted()


@contextlib.contextmanager
def _engine_scope(handle, op: str):
    """Backend flags, dynamo limits, test faults (`faults`), and Cancelled -> ComfyUI's execution_interrupted."""
    try:
        with backend.applied(handle.backend_flags), dynamo_limits(handle.compile_settings), \
                faults.injected(handle.model, op):
            yield
    except streaming.Cancelled:
        if mm is not None:
            mm.throw_exception_if_processing_interrupted()
        raise


def _engine_kwargs(op: str, tiling: Tiling, plan: planning.PlanInfo) -> dict:
    """Tiling arguments for `streaming.encode/decode`: the memory budget where the engine takes one and
    the memory model is calibrated for this case (the engine then picks chunk and tile itself),
    otherwise the plan's explicit values."""
    kwargs = {"tiling": tiling.tiling, "tile_size": tiling.tile_size, "tile_overlap": tiling.tile_overlap,
              "temporal_chunk": tiling.temporal_chunk}
    if planning.engine_accepts(op, "memory_budget") and plan.estimated:
        kwargs["memory_budget"] = tiling.memory_budget
    else:  # this library build cannot fit itself to a budget: run what the plan says
        kwargs.update(tile_size=plan.tile_size, temporal_chunk=plan.temporal_chunk)
        if plan.tile_size and tiling.tile_overlap >= min(plan.tile_size):
            kwargs["tile_overlap"] = min(plan.tile_size) // 4  # the plan chose tiles smaller than the overlap
    return kwargs


def _start(handle, op: str, shape, tiling: Tiling, clips: int) -> RunReport:
    """Ask ComfyUI for memory, then plan within what is free.

    The request is the peak of the settings without a budget (capped by an explicit budget):
    ComfyUI unloads other models to make room, as much as it can. The plan that is run is then made
    with the budget, "auto" meaning what is free after that.
    """
    unbounded = Tiling(tiling.tile_size, tiling.tile_overlap, tiling.temporal_chunk, tiling.tiling, None)
    required = planning.make_plan(handle.model, op, shape, unbounded, handle.load_device).peak_bytes or 0
    if isinstance(tiling.memory_budget, int):
        required = min(required, tiling.memory_budget)
    handle.prepare(required)
    plan = planning.make_plan(handle.model, op, shape, tiling, handle.load_device)
    report = RunReport(op, plan, clips)
    if plan.fits is False:
        report.notes.append(f"predicted peak {plan.peak_bytes / 2**30:.2f} GiB exceeds the budget")
        log.warning("StreamVAE %s: %s exceeds the memory budget; lower tile_size or temporal_chunk", op, plan.summary())
    if handle.load_device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(handle.load_device)
    return report


def _finish(handle, report: RunReport) -> RunReport:
    if handle.compile_report is not None:
        report.notes.append(f"compile: {handle.compile_status}")
    if handle.load_device.type == "cuda":
        report.measured_peak_bytes = int(torch.cuda.max_memory_allocated(handle.load_device))
    return report


def image_dtype(choice: str) -> torch.dtype:
    """IMAGE precision for an `output_dtype` input: "auto" is fp16 when ComfyUI runs with
    --fp16-intermediates (newer cores; halves the RAM of every IMAGE), else fp32."""
    if choice == "auto":
        return torch.float16 if getattr(comfy_args, "fp16_intermediates", False) else torch.float32
    return IMAGE_DTYPES[choice]


def encode(handle, image: torch.Tensor, clips: Clips, tiling: Tiling, notes=()) -> tuple[torch.Tensor, RunReport]:
    """IMAGE (N,H,W,3, from `common.check_image`, whose `notes` are reported) split into `clips` -> raw
    latents n_clips,C,T',h,w on the intermediate device."""
    videos = (clip_video(image, span, clips.length) for span in clips.spans)
    shape = (1, 3, clips.length, image.shape[1], image.shape[2])
    return encode_videos(handle, videos, len(clips.spans), shape, tiling, notes)


def encode_videos(handle, videos, n: int, shape, tiling: Tiling, notes=()) -> tuple[torch.Tensor, RunReport]:
    """`n` clips of the same `shape` (1,3,T,H,W tensors in [-1, 1], or frame sources such as
    `vae.video_reader.VideoReader`, read chunk by chunk) -> raw latents n,C,T',h,w on the
    intermediate device."""
    out_device = mm.intermediate_device() if mm is not None else torch.device("cpu")
    report = _start(handle, "encode", shape, tiling, n)
    for note in notes:
        report.notes.append(note)
        log.warning("StreamVAE encode: %s", note)
    kwargs = _engine_kwargs("encode", tiling, report.plan)
    progress = Progress(n, report)
    samples = None
    with _engine_scope(handle, "encode"):
        for i, video in enumerate(videos):
            progress.index = i
            z = run_with_fallback(handle.model.encode, video, out_device=out_device, progress=progress,
                                  cancel=_cancel, **kwargs)
            if samples is None:
                samples = torch.empty((n,) + tuple(z.shape[1:]), dtype=torch.float32, device=out_device)
            samples[i:i + 1] = z
            del video, z
    return samples, _finish(handle, report)


def decode(handle, latent: LatentClips, tiling: Tiling, nonfinite: str = "error", dtype: torch.dtype = torch.float32,
           sink=None) -> tuple[torch.Tensor | None, RunReport]:
    """Latent clips -> IMAGE (sum of the clips' frames, H, W, 3) in `dtype`, trimmed to the true frame
    counts and pixel size; the decoder writes straight into the IMAGE tensor. With `sink` (a
    `vae.video_file.FileSink`) the clips' frames go to it one after another instead, and the IMAGE
    is None. `nonfinite`: see `streaming.decode`."""
    z = latent.samples
    b, _, _, h, w = z.shape
    sf = handle.spatial_factor
    height, width = latent.size if latent.size is not None else (h * sf, w * sf)
    out_device = mm.intermediate_device() if mm is not None else torch.device("cpu")
    report = _start(handle, "decode", (1,) + tuple(z.shape[1:]), tiling, b)
    kwargs = _engine_kwargs("decode", tiling, report.plan)
    image = None if sink is not None else torch.empty((sum(latent.frames), height, width, 3), dtype=dtype,
                                                      device=out_device)
    progress = Progress(b, report)
    start = 0
    with _engine_scope(handle, "decode"):
        for i, frames in enumerate(latent.frames):
            progress.index = i
            target = {"sink": sink.at(start)} if sink is not None else {"out": image_view(image, start, start + frames)}
            run_with_fallback(handle.model.decode, z[i:i + 1], num_frames=frames, height=height, width=width,
                              progress=progress, cancel=_cancel, nonfinite=nonfinite, **target, **kwargs)
            start += frames
    return (None if image is None else finish_image(image)), _finish(handle, report)
