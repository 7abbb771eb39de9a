"""First-use check of the custom kernels, on the device and in the dtype that run them.

The Triton norm kernels (triton_norm.py) are compiled by the user's Triton for the user's GPU, driver
and torch. There they may fail to build (no C compiler, a GPU older than that Triton supports), fail
to launch (a grid or block shape the GPU refuses) or give wrong values (a compiler bug), and the
kernels' own tests run natively only where a GPU session ran them. So before a kernel first runs on
a device in a dtype, `verdicts` runs it there on test inputs and compares it with the norm's
definition in torch float64 ops (what replaces a kernel that fails is norm_act.py's torch path):

- every kernel of KERNELS in both layouts (NCDHW channel planes; NDHWC [pixels, channels] tiles);
- SMALL inputs: odd sizes, batch 2, channels that are no power of 2, read as tile views of a larger
  frame and written into a strided view of a larger buffer (what the conv buffers are), whose margin
  must stay untouched;
- the LARGE input: 512 channels and enough pixels in one frame that the channels-last kernels launch
  their production tiles (8 pixels x 512 channels; the GroupNorm statistics 128 of them per program)
  and more than 65535 pixel blocks on grid axis 0, as a 1080p decode does
  (`triton_norm.channels_last_launch`). It takes 0.5 GiB in bf16 (1 GiB in fp32) and its output as
  much, freed after the check; where that memory is not free the verdict rests on the small inputs,
  is not kept and the next process checks again (as where even a small input does not fit: then
  the kernel is not used in this process).

A verdict per (kernel, layout, dtype) is decided once per process and device and kept in the kernel
record (kernel_choice.py: per GPU, driver, CUDA, cuDNN, torch build and pack; its key names the Triton
version), so each machine checks each kernel once: a few compiles and, per dtype, a few GiB of reads
and writes on the GPU (unmeasured so far; tests/test_kernel_check.py prints the time where CUDA runs). A kernel that raises or disagrees is not used there in that dtype and layout: the torch op runs
instead (the other kernels keep running), and one warning names the kernels, the device and the
error. Under Triton's interpreter (TRITON_INTERPRET=1) the kernels run on CPU tensors and are checked
the same way: that is how CI tests this module.
"""
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from . import backend, kernel_choice, triton_norm
from .activation_layout import FORMATS, layout_of

log = logging.getLogger("streamvae")

# The Triton norm kernels, by the step of a norm they compute (what norm_act.py asks `usable` for).
KERNELS = ("group_norm_stats", "group_norm_apply", "rms_norm")
LAYOUTS = ("ncdhw", "ndhwc")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Allowed error relative to max(1, |torch's value|), by output dtype: torch's half-precision RMS norm
# rounds 4-5 times where a kernel rounds once (on the CPU in the interpreter up to 2^-5.6 apart in bf16,
# 2^-9 in fp16; float32 1e-7); a wrong kernel (a channel, the mean, gamma or the SiLU missed) is off by
# 0.3-2. Statistics are float32 whatever the input.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2**-4, torch.float16: 2**-7}
STATS_TOLERANCE = 1e-4
# ((B, C, T, H, W), groups) of the check inputs (module docstring).
SMALL = (((2, 12, 2, 9, 4), 3), ((1, 96, 1, 6, 5), 32))
LARGE = ((1, 512, 1, 520, 1024), 32)
# Elements per band of rows the comparison reads at a time (float64), so the large input's comparison
# takes a few MiB beside it.
BAND_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Verdict:
    """Whether `kernel` in `layout` agrees with torch on `device` in `dtype` (`error` None) or why not."""

    kernel: str
    layout: str
    dtype: torch.dtype
    device: str
    error: str | None
    how: str  # "on record", "checked in 0.4 s", or why the verdict is not kept

    @property
    def passed(self) -> bool:
        return self.error is None

    def name(self) -> str:
        return f"{self.kernel} {self.layout.upper()}"


def _interpreted() -> bool:
    knobs = getattr(triton_norm.triton, "knobs", None)  # Triton 3.4+; before: the variable itself
    return bool(knobs.runtime.interpret) if knobs is not None else os.environ.get("TRITON_INTERPRET") == "1"


# Whether triton_norm's kernels run in Triton's interpreter, on CPU tensors (how CI runs them): decided
# when they were decorated, at import, by TRITON_INTERPRET=1.
INTERPRETED = triton_norm.triton is not None and _interpreted()


def runs_triton(device) -> bool:
    """Whether Triton kernels launch on `device`: a CUDA (or ROCm) GPU, or the CPU under the interpreter."""
    device = torch.device(device)
    return triton_norm.triton is not None and (device.type == "cuda" or (device.type == "cpu" and INTERPRETED))


def device_name(device) -> str:
    """"cuda:N" (the current GPU for "cuda") or the device type: what verdicts are per."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    return str(device)


def usable(x: torch.Tensor, kernel: str) -> bool:
    """Whether the Triton `kernel` may compute on x (B,C,T,H,W): Triton launches on x's device and the
    kernel passed its first-use check there in x's layout and dtype (checked now if it never was)."""
    if x.dim() != 5 or x.dtype not in DTYPES or not runs_triton(x.device):
        return False
    return verdicts(device_name(x.device), x.dtype)[kernel, layout_of(x)].passed


def _record_key(kernel: str, layout: str, dtype: torch.dtype) -> str:
    interpreted = " interpreted" if INTERPRETED else ""
    return (f"triton {kernel} {layout} {str(dtype).removeprefix('torch.')} "
            f"triton {backend.triton_version()}{interpreted}")


@lru_cache(maxsize=None)
def verdicts(device: str, dtype: torch.dtype) -> dict[tuple[str, str], Verdict]:
    """{(kernel, layout): Verdict} of every kernel on `device` ("cuda:0") in `dtype`: from the kernel
    record, else checked now and kept there. Decided once per process; failures are warned about
    once, by error."""
    record = kernel_choice.choices_for(device)
    found, missing = {}, []
    for kernel in KERNELS:
        for layout in LAYOUTS:
            entry = record.check(_record_key(kernel, layout, dtype))
            if entry is None:
                missing.append((kernel, layout))
            else:
                found[kernel, layout] = Verdict(kernel, layout, dtype, device, entry["error"], "on record")
    if missing:
        start = time.perf_counter()
        errors, unsure = _check(torch.device(device), dtype, missing)
        how = f"checked in {time.perf_counter() - start:.1f} s"
        for kernel, layout in missing:
            verdict = Verdict(kernel, layout, dtype, device, errors.get((kernel, layout)),
                              f"{how}; out of memory for a part, checked again in the next process"
                              if (kernel, layout) in unsure else how)
            found[kernel, layout] = verdict
            if (kernel, layout) not in unsure:
                record.keep_check(_record_key(kernel, layout, dtype), {"error": verdict.error})
        log.info("StreamVAE: first-use check of the Triton norm kernels on %s in %s: %s", device,
                 str(dtype).removeprefix("torch."), how)
    _warn([v for v in found.values() if not v.passed])
    return found


def _warn(failed: list[Verdict]) -> None:
    """One warning per distinct error, naming the kernels, the device and the error."""
    by_error: dict[str, list[Verdict]] = {}
    for verdict in failed:
        by_error.setdefault(verdict.error, []).append(verdict)
    for error, verdicts_ in by_error.items():
        first = verdicts_[0]
        names = ", ".join(v.name() for v in verdicts_)
        message = (f"StreamVAE: the Triton kernel{'s' if len(verdicts_) > 1 else ''} {names} failed the first-use "
                   f"check on {first.device} in {str(first.dtype).removeprefix('torch.')} ({error}); the torch "
                   f"kernel runs for {'them' if len(verdicts_) > 1 else 'it'} there (same results, a little slower)")
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)


def _check(device: torch.device, dtype: torch.dtype, which: list[tuple[str, str]]):
    """({(kernel, layout): error} of the kernels in `which` that raised or disagreed with torch, and the
    set of those a part of whose check did not fit in memory: their verdict rests on what did, or, where
    a small input did not fit, fails, and is not kept)."""
    errors: dict[tuple[str, str], str] = {}
    unsure: set[tuple[str, str]] = set()
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.inference_mode():
        for layout in LAYOUTS:
            for (shape, groups), large in [(case, False) for case in SMALL] + [(LARGE, True)]:
                kernels = [k for k in KERNELS if (k, layout) in which and (k, layout) not in errors.keys() | unsure]
                if kernels:
                    _check_case(shape, groups, large, layout, dtype, device, generator, kernels, errors, unsure)
    return errors, unsure


def _check_case(shape, groups: int, large: bool, layout: str, dtype, device, generator, kernels: list[str],
                errors: dict, unsure: set) -> None:
    """Run `kernels` on one input; add their errors and what did not fit in memory (`_check`)."""
    from .backend import is_oom

    def failed(kernel: str, error: Exception) -> None:
        if is_oom(error):
            unsure.add((kernel, layout))
            if large:  # the small inputs passed: the verdict rests on them
                return
        errors[kernel, layout] = error_line(error)

    try:
        x, buffer, out = _case(shape, layout, dtype, device, generator)
    except Exception as error:  # noqa: BLE001 - the device cannot even hold the input
        for kernel in kernels:
            failed(kernel, error)
        return
    for kernel in kernels:
        try:
            buffer.zero_()
            worst = CHECKS[kernel](x, groups, out, generator)
            if _margin(buffer).any():
                errors[kernel, layout] = "it wrote outside its output view"
            elif worst > 1:
                errors[kernel, layout] = f"its results disagree with torch's ({worst:.1f}x the allowed error)"
        except Exception as error:  # noqa: BLE001 - any failure to build, launch or run it
            failed(kernel, error)


def error_line(error: Exception) -> str:
    """"Type: first line of the message": how a failed check names its error (here and conv_check.py)."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first_line}"


def _case(shape, layout: str, dtype: torch.dtype, device: torch.device, generator):
    """(x, buffer, out) of one check input: x B,C,T,H,W in `layout`, values around 1 with std 2, a tile
    view of a frame one row and column larger; `out` its shape, a view into a zeroed `buffer` one row and
    column larger (so a write past the view shows in the buffer's margin)."""
    b, c, t, h, w = shape
    frame = torch.empty((b, c, t, h + 1, w + 1), dtype=dtype, device=device, memory_format=FORMATS[layout])
    frame.normal_(1.0, 2.0, generator=generator)
    buffer = torch.zeros_like(frame)  # keeps frame's layout
    return frame[..., 1:, 1:], buffer, buffer[..., 1:, 1:]


def _margin(buffer: torch.Tensor) -> torch.Tensor:
    """Whether anything was written to the buffer's first row or column (the margin around `out`)."""
    return torch.cat([buffer[..., 0, :].flatten(), buffer[..., :, 0].flatten()]) != 0


def _bands(x: torch.Tensor):
    """Slices of rows of x (B,C,T,H,W) of about BAND_ELEMENTS elements each."""
    rows = max(1, BAND_ELEMENTS // max(1, x[..., :1, :].numel()))
    for r0 in range(0, x.shape[3], rows):
        yield slice(r0, min(r0 + rows, x.shape[3]))


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max(1, |ref|) (NaN counts as infinite)."""
    ref = ref.double()
    return ((got.double() - ref).abs() / ref.abs().clamp_min(1)).nan_to_num(nan=math.inf).max().item()


def _moments(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-frame group (mean, var) of x (B,C,T,H,W) in float64, band by band (two passes), B,G,T."""
    b, c, t = x.shape[:3]
    n = c // groups * x.shape[3] * x.shape[4]
    total = torch.zeros(b, groups, t, dtype=torch.float64, device=x.device)
    for rows in _bands(x):
        total += x[..., rows, :].double().reshape(b, groups, c // groups, t, -1).sum((2, 4))
    mean = total / n
    m2 = torch.zeros_like(total)
    for rows in _bands(x):
        band = x[..., rows, :].double().reshape(b, groups, c // groups, t, -1)
        m2 += (band - mean.view(b, groups, 1, t, 1)).square().sum((2, 4))
    return mean, m2 / n


def _check_stats(x, groups, out, generator) -> float:
    mean, var = triton_norm.group_norm_moments(x, groups)
    ref_mean, ref_var = _moments(x, groups)
    return max(relative_error(mean, ref_mean), relative_error(var, ref_var)) / STATS_TOLERANCE


def _check_apply(x, groups, out, generator) -> float:
    b, c, t = x.shape[:3]
    mean, var = (v.float() for v in _moments(x, groups))
    rstd = torch.rsqrt(var + 1e-6)
    weight = torch.rand(c, generator=generator, device=x.device) + 0.5
    bias = torch.randn(c, generator=generator, device=x.device)
    triton_norm.center_scale_act(x, *triton_norm.apply_terms(mean, rstd, weight, bias), True, out)

    def reference(band: torch.Tensor) -> torch.Tensor:  # GroupNorm's definition, in float64, then SiLU
        grouped = band.double().reshape(b, groups, c // groups, t, -1)  # B,G,C/G,T,rows*W
        y = (grouped - mean.double().view(b, groups, 1, t, 1)) * rstd.double().view(b, groups, 1, t, 1)
        y = y.reshape(band.shape) * weight.double().view(1, c, 1, 1, 1) + bias.double().view(1, c, 1, 1, 1)  # B,C,T,rows,W
        return F.silu(y).to(x.dtype)

    worst = max(relative_error(out[..., rows, :], reference(x[..., rows, :])) for rows in _bands(x))
    return worst / TOLERANCE[x.dtype]


def _check_rms(x, groups, out, generator) -> float:
    c = x.shape[1]
    gamma = torch.rand(c, 1, 1, 1, generator=generator, device=x.device) + 0.5
    triton_norm.rms_norm_act(x, gamma, 1e-12, True, out)

    def reference(band: torch.Tensor) -> torch.Tensor:  # x / max(||x||, eps) * sqrt(C) * gamma over channels, SiLU
        x64 = band.double()
        y = x64 / x64.norm(dim=1, keepdim=True).clamp_min(1e-12) * math.sqrt(c) * gamma.double().view(1, c, 1, 1, 1)
        return F.silu(y).to(x.dtype)

    worst = max(relative_error(out[..., rows, :], reference(x[..., rows, :])) for rows in _bands(x))
    return worst / TOLERANCE[x.dtype]


CHECKS = {"group_norm_stats": _check_stats, "group_norm_apply": _check_apply, "rms_norm": _check_rms}


def summary(device, dtype: torch.dtype) -> str:
    """One line on the kernels' verdicts on `device` in `dtype` (checking them if they never were), for
    the run report and `vae doctor`."""
    if not runs_triton(device):
        return "Triton norm kernels: not used on " + (
            f"{torch.device(device).type} (they run on CUDA and ROCm GPUs)" if triton_norm.triton is not None
            else "this install (Triton is not installed; the torch kernels run)")
    found = verdicts(device_name(device), dtype).values()
    passed = [v for v in found if v.passed]
    how = ", ".join(sorted({v.how for v in found}))
    line = (f"Triton norm kernels on {device_name(device)} in {str(dtype).removeprefix('torch.')}: "
            f"{len(passed)} of {len(found)} passed the first-use check ({how})")
    failed = [f"{v.name()} failed ({v.error}), torch runs instead" for v in found if not v.passed]
    return "; ".join([line] + failed)
