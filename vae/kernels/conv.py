"""Convolution dispatch.

On GPUs, convs go to cuDNN through F.conv3d, or straight to cuDNN where PyTorch 2.9/2.10 would send
half-precision conv3d to its slow vol2col path (`backend.wants_cudnn_conv3d`) and the caller's
`Optimizations.conv3d_workaround` is on (`cudnn_workaround=`).

On the CPU, float32 convs go straight to oneDNN: PyTorch's own heuristic sends convs with few
channels (< 64) to an im2col fallback that is 2-5x slower here. On CPUs without native bf16/fp16
convolution kernels (no AVX-512 BF16 / AMX; oneDNN then falls back to a reference kernel about 40x
slower than float32 here), half-precision convs are computed in float32 and rounded back: the
result is the same up to rounding and the speed is float32's. Stride-1 3x3 spatial convs with
enough channels take the Winograd kernel (`winograd.py`, 4x fewer multiply-adds) when the caller
passes the filter-transform cache to use (`winograd=`): the switch lives in `Optimizations`, which
this module never sees.

Which of these exact kernels runs is a fixed rule (`kernels="defaults"`: the rules above, tuned on an
AVX2 CPU) or measured on this machine once per layer shape (`kernels="measure"`, kernel_choice.py):
CPU oneDNN direct vs Winograd with each GEMM route; GPU cuDNN as PyTorch calls it vs (for NCDHW
activations) channels-last 3-D vs cuDNN called directly (the PyTorch 2.9 workaround; half precision).
Every kernel returns its output in the layout of its input (layout.py).
"""
from functools import lru_cache, partial

import torch
import torch.nn.functional as F

from . import backend, kernel_choice
from .backend import cpu_has_native
from .kernel_log import KernelLog
from .activation_layout import by_output_channels, dense_copy, is_ndhwc, layout_of
from .filter_cache import FilterCache
from .winograd import transform_pays, winograd_conv3d
from .winograd_gemm import GEMM_ROUTES

# Winograd pays where its GEMMs outweigh its transforms: the transforms grow with Cin and Cout, the
# saving with kt * Cin * Cout. Measured one thread per core (bench/bench_winograd.py --layers sweep
# --threads 1): kt=3 gains 0.93x at 32 channels, 1.3x at 64, 1.9x at 128, 2.6x at 512; kt=1 0.86x at
# 64, 1.3x at 128, 1.7x at 256. Below 96 channels the gain is small and its rounding noise, a few
# times oneDNN's there, would show in the tiny test models' 1e-5 chunking tests: they keep oneDNN.
WINOGRAD_MIN_CHANNELS = 96  # min(Cin, Cout)
WINOGRAD_MIN_CHANNEL_TAPS = 128  # kt * min(Cin, Cout)
# Side in pixels of the crop a measured kernel choice times: every kernel here costs the same per
# output frame and, above this size, per pixel (Winograd's slabs of ~256 tiles are 64x64 pixels; at
# 128x128 each of 2 threads gets two), and a 256x256 frame of 256 channels would take 10-25 s to
# time on 2 cores instead of 2-5.
PROBE_SIDE = 128
# oneDNN reorders a conv's weight into its blocked format on every call: a transient copy as large as
# the weight (0.9 GB for HunyuanVideo 1.5's 1024 -> 8192 channel upsampler conv in float32, most of a
# small decode's peak). Larger weights run in slices of output channels of at most this many bytes in
# float32 (each output channel is the same sum either way; bench/RESULTS.md section 15).
CPU_WEIGHT_SLICE_BYTES = 64 * 2**20
# Smaller frames give GEMMs too narrow to outrun oneDNN, even with the transform cached (1024
# channels, 8x8 pixels: 1.1x oneDNN's time; 16x16: 0.38x).
WINOGRAD_MIN_FRAME_PIXELS = 64


def _cpu_conv3d(x, weight, bias, stride, padding):
    # Under torch.compile the direct oneDNN call cannot be traced (fake tensors): inductor picks the
    # CPU conv kernel itself from F.conv3d.
    # is_compiling first: dynamo cannot trace mkldnn.is_available (a graph break in every conv).
    if not torch.compiler.is_compiling() and x.dtype == torch.float32 and torch.backends.mkldnn.is_available():
        return torch.ops.aten.mkldnn_convolution(x, weight, bias, list(padding), list(stride), [1, 1, 1], 1)
    return F.conv3d(x, weight, bias, stride, padding)


def winograd_weight_eligible(weight_shape, stride) -> bool:
    """What Winograd needs of the conv itself: a 3x3 spatial kernel, stride 1 and enough channels."""
    cout, cin, kt, kh, kw = weight_shape
    return ((kh, kw) == (3, 3) and tuple(stride) == (1, 1, 1)
            and min(cin, cout) >= WINOGRAD_MIN_CHANNELS and kt * min(cin, cout) >= WINOGRAD_MIN_CHANNEL_TAPS)


def winograd_eligible(x: torch.Tensor, weight: torch.Tensor, stride, padding) -> bool:
    """Whether `conv3d` may run this conv by Winograd: CPU, an eligible weight, padding (0, 1, 1) or
    (0, 0, 0) (an exact tile with its halo; frames of 3 pixels or more a side), frames of at least
    WINOGRAD_MIN_FRAME_PIXELS, float32 (or half precision that is computed in float32 here anyway)
    and no autograd."""
    return (x.device.type == "cpu" and x.dim() == 5 and weight.dim() == 5 and winograd_weight_eligible(weight.shape, stride)
            and (tuple(padding) == (0, 1, 1) or (tuple(padding) == (0, 0, 0) and min(x.shape[3:]) >= 3))
            and x.shape[2] >= weight.shape[2]
            and x.shape[3] * x.shape[4] >= WINOGRAD_MIN_FRAME_PIXELS
            and (x.dtype == torch.float32
                 or (x.dtype in (torch.bfloat16, torch.float16) and not cpu_has_native(x.dtype)))
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)))


def conv3d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride, padding,
           *, winograd: FilterCache | None = None, kernels: str = "defaults",
           cudnn_workaround: bool = False, log: KernelLog | None = None) -> torch.Tensor:
    """F.conv3d (no dilation, no groups) of x (B,C,T,H,W), by the fastest exact kernel for the device.

    `winograd` (the filter cache of the caller's `Optimizations`, None when its `winograd_conv` is
    off): allow the Winograd kernel where
    `winograd_eligible` and its filter transform pays (`transform_pays`); equal to oneDNN up to
    float32 rounding. Not while torch.compile traces (its worker threads and cache are not traceable):
    compiled blocks use inductor's convs. `kernels` (`Optimizations.kernel_choice`): "defaults" runs the
    fixed rules, "measure" the candidate measured fastest for this layer shape on this machine.
    `cudnn_workaround` (`Optimizations.conv3d_workaround`): cuDNN called directly where the PyTorch 2.9
    regression would slow this conv down (`backend.wants_cudnn_conv3d`). `log`: the run's record of
    what ran (kernel_log.py), which gets the kernel's name.
    """
    candidates, default = conv_candidates(x, weight, bias, stride, padding, winograd, cudnn_workaround)
    chosen = default
    if kernels == "measure" and len(candidates) > 1 and not torch.compiler.is_compiling():
        # Timed on at most two output frames of at most PROBE_SIDE^2 pixels (a few seconds per shape).
        frames = min(x.shape[2], weight.shape[2] + stride[0])
        probe = lru_cache(maxsize=1)(lambda: dense_copy(x[:, :, :frames, :PROBE_SIDE, :PROBE_SIDE]))
        chosen = kernel_choice.pick(conv_key(x, weight, stride, padding), x.device,
                                    {name: (lambda run=run: run(probe())) for name, run in candidates.items()}, default)
        # What measuring computed for a kernel that lost is not kept resident (the record is read only
        # while a transform of this weight is held: once per weight, not on every call)
        if (winograd is not None and not chosen.startswith("winograd") and winograd.holds(weight)
                and not uses_winograd(x.device, x.dtype, weight.shape, stride)):
            winograd.discard(weight)
    if log is not None:
        log.add("conv3d", chosen, x)
    return candidates[chosen](x)


def conv_signature(device, dtype: torch.dtype, weight_shape, stride) -> str:
    """The part of a conv's `conv_key` that its weight decides (device type, dtype, weight, stride)."""
    return (f"conv3d {torch.device(device).type} {str(dtype).removeprefix('torch.')} w{tuple(weight_shape)} "
            f"s{tuple(stride)} ")


def conv_key(x: torch.Tensor, weight: torch.Tensor, stride, padding) -> str:
    """The layer shape a kernel choice is remembered for. Not the frame count: a clip is computed the
    same way whatever its temporal chunking (chunk-invariant results), and the kernels' cost per frame
    does not depend on it."""
    b, _, _, h, w = x.shape
    return (f"{conv_signature(x.device, x.dtype, weight.shape, stride)}p{tuple(padding)} {b}x{h}x{w} "
            f"{layout_of(x)} threads {torch.get_num_threads()}")


def uses_winograd(device, dtype: torch.dtype, weight_shape, stride) -> bool | None:
    """Whether a conv of this weight runs Winograd for some layer shape on record on this machine (so
    its filter transform stays resident); None when none of its shapes is on record yet."""
    chosen = kernel_choice.choices_for(device).chosen(conv_signature(device, dtype, weight_shape, stride))
    return None if not chosen else any(name.startswith("winograd") for name in chosen)


def planned_kernels(device, dtype: torch.dtype, weight_shapes, layout: str, winograd: bool, cudnn_workaround: bool,
                    kernels: str) -> tuple[str, ...]:
    """The names (as `conv3d` logs them) of the kernels that convs of `weight_shapes` (with their
    strides: (shape, stride) pairs) may take on `device` in `dtype` with `layout` activations, before
    any runs: `conv_candidates`' rules without an input (an input too small for Winograd, or a
    transform that does not pay, narrows the set at run time, never widens it). `kernels` as in
    `conv3d`: "defaults" keeps each conv's default kernel, "measure" every candidate."""
    device = torch.device(device)
    half = dtype in (torch.float16, torch.bfloat16)
    if device.type != "cpu":
        workaround = cudnn_workaround and device.type == "cuda" and half and backend.conv3d_regression_affected()
        default = "cudnn_direct" if workaround else "torch"
        if kernels != "measure":
            return (default,)
        extra = ("channels_last_3d",) if device.type == "cuda" and layout == "ncdhw" else ()
        direct = ("cudnn_direct",) if workaround or (device.type == "cuda" and half and torch.version.hip is None) else ()
        return tuple(dict.fromkeys(("torch", *extra, *direct)))
    computed_in_fp32 = dtype == torch.float32 or (half and not cpu_has_native(dtype))
    if not (winograd and computed_in_fp32 and any(winograd_weight_eligible(shape, stride) for shape, stride in weight_shapes)):
        return ("onednn",)
    routes = GEMM_ROUTES if kernels == "measure" else ("mkl",)
    return ("onednn", *(f"winograd_{route}" for route in routes))


def conv_candidates(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride, padding,
                    winograd: FilterCache | None, cudnn_workaround: bool = False) -> tuple[dict, str]:
    """({name: run(input) -> output}, default name): the exact kernels that can run this conv here
    (`winograd`: the filter cache, None when Winograd is off; `cudnn_workaround`: see `conv3d`)."""
    # The PyTorch 2.9 cuDNN regression (backend.py): cuDNN called directly (the default kernel) where
    # it hits and the run's workaround is on.
    workaround = cudnn_workaround and backend.wants_cudnn_conv3d(x)
    if x.device.type != "cpu" or workaround:
        candidates = {"torch": lambda inp: F.conv3d(inp, weight, bias, stride, padding)}  # cuDNN on CUDA
        if x.is_cuda and not is_ndhwc(x):  # NCDHW activations: converted around this conv
            def channels_last(inp):
                layout = torch.channels_last_3d
                return F.conv3d(inp.contiguous(memory_format=layout), weight.contiguous(memory_format=layout),
                                bias, stride, padding).contiguous()

            candidates["channels_last_3d"] = channels_last
        if workaround or (x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and torch.version.hip is None):
            candidates["cudnn_direct"] = lambda inp: backend.cudnn_conv3d(inp, weight, bias, stride, padding)
        return candidates, "cudnn_direct" if workaround else "torch"
    candidates = {"onednn": partial(_cpu_direct, weight=weight, bias=bias, stride=stride, padding=padding)}
    if (winograd is not None and not torch.compiler.is_compiling() and winograd_eligible(x, weight, stride, padding)
            and transform_pays(x, weight, winograd)):
        for route in GEMM_ROUTES:
            candidates[f"winograd_{route}"] = (lambda inp, route=route: winograd_conv3d(
                inp, weight, bias, winograd, padding=padding[1], gemm=route))
        return candidates, "winograd_mkl"
    return candidates, "onednn"


def _cpu_direct(x, weight, bias, stride, padding):
    """oneDNN's direct conv; half precision in float32 where this CPU has no native kernels for it.
    A weight of more than CPU_WEIGHT_SLICE_BYTES runs in slices of output channels (see there)."""
    step = max(1, CPU_WEIGHT_SLICE_BYTES // (weight[0].numel() * 4))  # output channels per slice (float32 copies)
    if weight.shape[0] <= step or torch.compiler.is_compiling():
        return _cpu_direct_whole(x, weight, bias, stride, padding)
    return by_output_channels(lambda w, b: _cpu_direct_whole(x, w, b, stride, padding), weight, bias, step)


def _cpu_direct_whole(x, weight, bias, stride, padding):
    if x.dtype in (torch.bfloat16, torch.float16) and not cpu_has_native(x.dtype):
        out = _cpu_conv3d(x.float(), weight.float(), None if bias is None else bias.float(), stride, padding)
        return out.to(x.dtype)
    return _cpu_conv3d(x, weight, bias, stride, padding)
