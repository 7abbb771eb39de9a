"""Running the library's encode/decode inside ComfyUI: one plan per run (`vae.plan`: shown on the node,
memory reserved with ComfyUI for it, handed to the engine), one progress step per tile x chunk (also
ComfyUI's interrupt point), backend flags and compile limits around the call, clips one after
another so the peak does not grow with the batch.
"""
import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import vae
from ..vae import Settings, budget_from_free, collected_warnings, doctor, dynamo_limits
from ..vae.kernels import KernelLog, backend, kernel_choice
from ..vae.kernels.backend import same_device
from . import core_api, multi_device
from .images import Clips, clip_video, finish_image, image_view
from .latents import CORE_LAYOUT, LatentClips

try:
    import comfy.model_management as mm
    import comfy.utils as comfy_utils
except ImportError:
    mm = comfy_utils = None

log = logging.getLogger("streamvae")
IMAGE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


@dataclass
class RunReport:
    """What one Encode/Decode did, for the node's UI message (and the web extension)."""

    op: str
    plan: vae.Plan
    clips: int
    steps: int = 0
    measured_peak_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    latent_layout: str | None = None  # decode: how the LATENT was read (latents.latent_layout)
    output: str = ""  # what was made, e.g. "IMAGE float16 on cpu"
    kernels: str = ""  # how the kernels were chosen, what ran (KernelLog.describe) and the activation layout
    # What this run's convs and norms ran (None: they ran in the device workers' processes, not counted).
    kernel_log: KernelLog | None = field(default=None, repr=False)
    doctor: list[str] = field(default_factory=list)  # vae.doctor's lines for this run (what a bug report needs)

    def as_dict(self) -> dict:
        return {"op": self.op, "plan": self.plan.as_dict(), "summary": self.plan.summary(), "clips": self.clips,
                "steps": self.steps, "measured_peak_bytes": self.measured_peak_bytes, "notes": self.notes,
                "latent_layout": self.latent_layout, "output": self.output, "kernels": self.kernels,
                "doctor": self.doctor}


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
        # The hook behind update_absolute sends the progress message and raises ComfyUI's interrupt exception;
        # from 0.33.0 on core throttles it, so the engine also checks `_cancel` at every step.
        self.bar.update_absolute(self.index * total + done, total * self.clips)


def _cancel() -> bool:
    return mm is not None and mm.processing_interrupted()


@contextlib.contextmanager
def _engine_scope(handle, report: RunReport):
    """Backend flags, dynamo limits, the run's warnings into the report's notes (once; the log has them
    once too), and Cancelled -> ComfyUI's execution_interrupted."""
    try:
        with collected_warnings() as said, backend.applied(handle.backend_flags), dynamo_limits(handle.compile_settings):
            yield
    except vae.Cancelled:
        if mm is not None:
            mm.throw_exception_if_processing_interrupted()
        raise
    report.notes += [note for note in said if note not in report.notes]


def plan_placement(device) -> dict:
    """`vae.plan`'s placement arguments for a node's run on `device`: IMAGE and LATENT tensors live on
    core's intermediate device, on the compute device only under --gpu-only, where the memory model
    then counts them."""
    io_here = same_device(core_api.intermediate_device(), device)
    return dict(device=device, io_on_device=(io_here, io_here))


def _budget(handle, settings: Settings):
    """The memory budget to plan with: the node's, "auto" resolved as core counts free memory for this
    model (under dynamic VRAM that includes what core can take back from other models' weights; core's
    own VAEs size their work by the same number)."""
    if settings.memory_budget != "auto":
        return settings.memory_budget
    free = core_api.free_memory(handle.patcher, handle.load_device)
    return "auto" if free is None else budget_from_free(free)


def _start(handle, op: str, shape, settings: Settings, clips: int) -> RunReport:
    """Ask ComfyUI for memory, then make the run's one plan within what is free (the report holds it).

    The request is what the settings cost without a budget (capped by an explicit budget), less the
    weights, which ComfyUI counts itself when it loads the model: ComfyUI unloads other models to make
    room, as much as it can. The plan is then made with the budget, "auto" meaning what is free after
    that, shown on the node and run as it is.
    """
    placement = plan_placement(handle.load_device)
    unbounded = vae.plan(handle.model, op, shape, dataclasses.replace(settings, memory_budget=None), opts=handle.opts,
                         **placement)
    wanted = unbounded.work_bytes or 0
    if isinstance(settings.memory_budget, int):
        wanted = min(wanted, settings.memory_budget)
    handle.prepare(wanted)
    plan = vae.plan(handle.model, op, shape, dataclasses.replace(settings, memory_budget=_budget(handle, settings)),
                    opts=handle.opts, **placement)
    try:
        vae.refuse_over_budget(plan, settings)  # the node's own budget
    except vae.BudgetTooSmall as refused:
        floor = refused.plan.below_floor("memory_budget_gb", "0 for automatic (what is free)", in_bytes=False)
        raise ValueError(f"StreamVAE {op}: {floor}") from None
    report = RunReport(op, plan, clips, kernel_log=KernelLog(kernel_choice.choices_for(handle.load_device)))
    if plan.fits is False:
        report.notes.append(f"predicted peak {plan.peak_bytes / 2**30:.2f} GiB exceeds the free memory")
    if handle.load_device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(handle.load_device)
    return report


def _finish(handle, report: RunReport) -> RunReport:
    dtype = handle.model.decode_dtype if report.op == "decode" else handle.model.encode_dtype
    ran = (report.kernel_log.describe(handle.opts.kernel_choice) if report.kernel_log is not None
           else f"kernels: {handle.opts.kernel_choice} (run by the device workers' processes, not counted here)")
    report.kernels = (f"{ran}; activations {report.plan.activation_layout.upper()}; "
                      f"planned: {report.plan.kernels.describe()}")
    report.doctor = doctor.for_run(handle.load_device, dtype, handle.opts, handle.model, report.plan)
    if handle.compile_report is not None:
        report.notes.append(f"compile: {handle.compile_status}")
    if handle.load_device.type == "cuda":
        report.measured_peak_bytes = int(torch.cuda.max_memory_allocated(handle.load_device))
    return report


def _describe(kind: str, tensor: torch.Tensor) -> str:
    return f"{kind} {str(tensor.dtype).removeprefix('torch.')} on {tensor.device}"


def encode_clips(handle, n: int, clip: Callable[[int], torch.Tensor], shape: tuple, settings: Settings,
                 notes=()) -> tuple[torch.Tensor, RunReport]:
    """`n` clips -> LATENT samples n,C,T',h,w as core's VAE Encode makes them (`VideoVAE.to_comfy_latent`,
    core's intermediate device and dtype). `clip(i)` gives clip i as 1,3,T,H,W in [-1, 1]; every clip
    has `shape` (1,3,T,H,W). `notes` (input adaptations) are reported and logged."""
    out_device = core_api.intermediate_device()
    report = _start(handle, "encode", shape, settings, n)
    for note in notes:
        report.notes.append(note)
        log.warning("StreamVAE encode: %s", note)
    progress = Progress(n, report)
    samples = None
    with _engine_scope(handle, report):
        workers = multi_device.workers(handle, -(-shape[3] // handle.spatial_factor))  # None: one device
        for i in range(n):
            progress.index = i
            video = clip(i)
            if workers is not None and isinstance(video, torch.Tensor):  # frame sources stay on one device
                z = workers.encode(video, temporal_chunk=report.plan.temporal_chunk, progress=progress,
                                   cancel=_cancel).to(out_device)
                report.kernel_log = None
            else:
                z = vae.encode(handle.model, video, report.plan, opts=handle.opts, out_device=out_device,
                               progress=progress, cancel=_cancel, kernel_log=report.kernel_log)
            z = handle.model.to_comfy_latent(z)
            if samples is None:
                samples = torch.empty((n,) + tuple(z.shape[1:]), dtype=core_api.intermediate_dtype(), device=out_device)
            samples[i:i + 1] = z
            del video, z
    report.output = _describe("LATENT", samples)
    return samples, _finish(handle, report)


def encode(handle, image: torch.Tensor, clips: Clips, settings: Settings, notes=()) -> tuple[torch.Tensor, RunReport]:
    """IMAGE (N,H,W,3, from `images.check_image`, whose `notes` are reported) split into `clips` ->
    LATENT samples n_clips,C,T',h,w (see `encode_clips`)."""
    shape = (1, image.shape[3], clips.length, image.shape[1], image.shape[2])  # image channels: 3, or 4 (RGBA)
    return encode_clips(handle, len(clips.spans), lambda i: clip_video(image, clips.spans[i], clips.length), shape,
                        settings, notes)


def into(view: torch.Tensor) -> dict:
    """Engine arguments that decode a clip into `view` (1,3,T,H,W), trimmed to the view's size."""
    return {"out": view, "num_frames": view.shape[2], "height": view.shape[3], "width": view.shape[4]}


def decode_clips(handle, latent: LatentClips, settings: Settings, target: Callable[[int], dict],
                 nonfinite: str = "error") -> RunReport:
    """Latent clips -> pixels in [-1, 1] (not clamped), clip i written where `target(i)` says: engine
    arguments such as `into(view)` (straight into a 1,3,T,H,W tensor or view) or a sink with the
    clip's frame count and size (`vae.video_file.FileSink`). `nonfinite`: see `engine.decode`."""
    z = latent.samples
    b = z.shape[0]
    report = _start(handle, "decode", (1,) + tuple(z.shape[1:]), settings, b)
    report.latent_layout = latent.layout
    if latent.layout != CORE_LAYOUT:
        log.info("StreamVAE decode: LATENT read as %s", latent.layout)
    for note in latent.notes:
        report.notes.append(note)
        log.info("StreamVAE decode: %s", note)
    progress = Progress(b, report)
    with _engine_scope(handle, report):
        workers = multi_device.workers(handle, z.shape[3])  # None: one device
        for i in range(b):
            progress.index = i
            if workers is not None:
                workers.decode(z[i:i + 1], temporal_chunk=report.plan.temporal_chunk, progress=progress,
                               cancel=_cancel, **target(i))
                report.kernel_log = None
                continue
            vae.decode(handle.model, z[i:i + 1], report.plan, opts=handle.opts, progress=progress, cancel=_cancel,
                       nonfinite=nonfinite, kernel_log=report.kernel_log, **target(i))
    return _finish(handle, report)


def image_dtype(choice: str) -> torch.dtype:
    """IMAGE precision for an `output_dtype` input: "auto" is core's intermediate dtype (fp16 under
    --fp16-intermediates on newer cores, which halves the RAM of every IMAGE; else fp32)."""
    return core_api.intermediate_dtype() if choice == "auto" else IMAGE_DTYPES[choice]


def decode(handle, latent: LatentClips, settings: Settings, nonfinite: str = "error", dtype: torch.dtype | None = None,
           sink=None) -> tuple[torch.Tensor | None, RunReport]:
    """Latent clips -> IMAGE (sum of the clips' frames, H, W, C: 4 for RGBA VAEs) on core's intermediate device, in
    `dtype` (default core's intermediate dtype), trimmed to the true frame counts and pixel size; the
    decoder writes straight into the IMAGE. With `sink` (a `vae.video_file.FileSink`) the clips'
    frames go to it one after another instead, and the IMAGE is None."""
    h, w = latent.samples.shape[3:]
    model = handle.model
    up = model.decode_upscale  # the size Encode was given, times the decoder's upscale
    height, width = (latent.size[0] * up, latent.size[1] * up) if latent.size is not None else \
        (h * model.spatial_factor * up, w * model.spatial_factor * up)
    starts = [sum(latent.frames[:i]) for i in range(len(latent.frames))]
    if sink is not None:
        report = decode_clips(handle, latent, settings, lambda i: {"sink": sink.at(starts[i]), "num_frames": latent.frames[i],
                                                                 "height": height, "width": width}, nonfinite)
        return None, report
    image = torch.empty((sum(latent.frames), height, width, model.out_channels), dtype=dtype or core_api.intermediate_dtype(),
                        device=core_api.intermediate_device())
    report = decode_clips(handle, latent, settings,
                          lambda i: into(image_view(image, starts[i], starts[i] + latent.frames[i])), nonfinite)
    report.output = _describe("IMAGE", image)
    return finish_image(image), report
