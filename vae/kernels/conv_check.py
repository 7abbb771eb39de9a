"""First-use check of the channels-last (NDHWC) conv route, on the device and in the dtype that run it.

NDHWC activations are the default on CUDA and for half precision on CPUs with native kernels
(`run.kernel_plan`), and every conv of such a run goes through the backend's channels-last kernels
(cuDNN's, oneDNN's): kernels the NCDHW path never calls, picked per shape by the backend, on the
user's GPU, driver and cuDNN. So before a run first takes NDHWC on a device in a dtype, `verdict`
convolves CASES there in both layouts, through the conv dispatch the blocks use (`conv.conv3d`), and
compares: a route that raises or disagrees (beyond half precision's rounding of the sums) is not
taken there; the run keeps NCDHW, with one warning naming the device, the dtype and the error.

CASES are a model's conv kinds: 3x3x3 at stride 1 (a causal conv), a strided 3x3x3 (a downsampler),
a 1x1x1 (a shortcut), with channel counts that are and are not multiples of 8, and, as LARGE, a conv
of 128 channels on a 256x256 frame, the size at which backends switch to their tiled production
kernels. The verdict is kept in the kernel record (per GPU, driver, CUDA, cuDNN, torch and pack:
kernel_choice.py), so each machine checks once.
"""
import logging
import time
import warnings
from functools import lru_cache

import torch

from . import conv, kernel_check, kernel_choice
from .activation_layout import FORMATS

log = logging.getLogger("streamvae")

# (input B,C,T,H,W, output channels, kernel, stride, padding)
CASES = (((1, 24, 4, 9, 11), 40, 3, 1, 1), ((2, 64, 5, 16, 16), 64, 3, 2, 0), ((1, 96, 3, 7, 13), 32, 1, 1, 0))
LARGE = ((1, 128, 3, 256, 256), 128, 3, 1, 1)
# Allowed error relative to max(1, |NCDHW value|), by dtype: two summation orders of a few thousand
# products, rounded to the dtype once (float32 in TF32 where cuDNN is allowed it); a wrong kernel (a
# channel, a tap, a row missed) is off by ~1.
TOLERANCE = {torch.float32: 2**-7, torch.bfloat16: 2**-5, torch.float16: 2**-8}


def failure(device, dtype: torch.dtype) -> str | None:
    """Why NDHWC convs may not run on `device` in `dtype` (`verdict`), or None when they may."""
    return verdict(kernel_check.device_name(device), dtype)


def _record_key(dtype: torch.dtype) -> str:
    return f"conv3d ndhwc {str(dtype).removeprefix('torch.')}"


@lru_cache(maxsize=None)
def verdict(device: str, dtype: torch.dtype) -> str | None:
    """None when NDHWC convs agree with NCDHW ones on `device` ("cuda:0", "cpu") in `dtype`, else why
    not: from the kernel record, else checked now and kept there (unless the check ran out of memory).
    Decided once per process; a failure is warned about once."""
    record = kernel_choice.choices_for(device)
    entry = record.check(_record_key(dtype))
    if entry is not None:
        error = entry["error"]
    else:
        start = time.perf_counter()
        error, sure = _check(torch.device(device), dtype)
        if sure:
            record.keep_check(_record_key(dtype), {"error": error})
        log.info("StreamVAE: first-use check of NDHWC convs on %s in %s: %.1f s", device,
                 str(dtype).removeprefix("torch."), time.perf_counter() - start)
    if error is not None:
        message = (f"StreamVAE: channels-last (NDHWC) convolutions failed their first-use check on {device} in "
                   f"{str(dtype).removeprefix('torch.')} ({error}); runs there keep NCDHW activations "
                   "(same results, slower)")
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    return error


def _check(device: torch.device, dtype: torch.dtype) -> tuple[str | None, bool]:
    """(error or None, whether the verdict is sure: an out-of-memory LARGE case leaves it to the small
    ones and to the next process)."""
    from .backend import is_oom

    generator = torch.Generator(device=device).manual_seed(0)
    with torch.inference_mode():
        for case in CASES + (LARGE,):
            try:
                worst = _compare(case, device, dtype, generator)
            except Exception as error:  # noqa: BLE001 - any failure to pick, build or run a kernel
                if is_oom(error) and case is LARGE:
                    return None, False
                return kernel_check.error_line(error), True
            if worst > 1:
                return f"its results disagree with NCDHW's ({worst:.1f}x the allowed error)", True
    return None, True


def _compare(case, device, dtype, generator) -> float:
    """The largest NDHWC-vs-NCDHW difference of one case, over TOLERANCE."""
    shape, out_channels, k, stride, padding = case
    x = torch.randn(shape, generator=generator, device=device).to(dtype)  # B,C,T,H,W
    w = (torch.randn((out_channels, shape[1], k, k, k), generator=generator, device=device)
         / (shape[1] * k ** 3) ** 0.5).to(dtype)  # O,C,k,k,k: outputs of order 1
    b = torch.randn(out_channels, generator=generator, device=device).to(dtype)
    args = (b, (stride,) * 3, (padding,) * 3)
    want = conv.conv3d(x.contiguous(memory_format=FORMATS["ncdhw"]), w.contiguous(memory_format=FORMATS["ncdhw"]),
                       *args, cudnn_workaround=True)
    got = conv.conv3d(x.contiguous(memory_format=FORMATS["ndhwc"]), w.contiguous(memory_format=FORMATS["ndhwc"]),
                      *args, cudnn_workaround=True)
    if got.shape != want.shape:
        raise ValueError(f"output shape {tuple(got.shape)}, not {tuple(want.shape)}")
    return kernel_check.relative_error(got, want) / TOLERANCE[dtype]
