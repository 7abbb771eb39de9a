"""The memory layout of a run's activations: NCDHW (channel planes) or NDHWC (channels last).

The tensors keep their logical B,C,T,H,W shape either way; only the strides differ. cuDNN's fast
conv3d kernels and oneDNN's native plain format are NDHWC: with NCDHW activations cuDNN converts the
input and the output of every conv, and channels-last weights alone are slower still, because each
activation is then converted. So a run is in one layout from the first conv to the last (measured on
CPUs and on an H100: bench/RESULTS.md sections 0, 11 and 12):

- the planner records the run's layout in its `Plan` and puts the conv weights in it
  (`run.kernel_plan`, `weights_in`); the engine puts each chunk's input in it, and the output is
  copied into the caller's NCDHW tensor;
- every buffer a block allocates takes the layout of the tensor it is made from (`empty_video`), and
  convs, norms, adds and copies keep the layout of their input, so the activations never fall back.

Which layout a run takes is `Optimizations.activation_layout`: "ncdhw", "ndhwc", or "auto"
(`run.kernel_plan`).
"""
import torch

LAYOUTS = ("auto", "ncdhw", "ndhwc")
FORMATS = {"ncdhw": torch.contiguous_format, "ndhwc": torch.channels_last_3d}
WEIGHT_FORMATS = {"ncdhw": {4: torch.contiguous_format, 5: torch.contiguous_format},
                  "ndhwc": {4: torch.channels_last, 5: torch.channels_last_3d}}


def is_ndhwc(x: torch.Tensor) -> bool:
    """Whether x (B,C,T,H,W, or a view of one such as a tile) has its channels innermost."""
    return x.dim() == 5 and x.shape[1] > 1 and x.stride(1) == 1


def empty_video(like: torch.Tensor, shape, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised B,C,T,H,W tensor of `shape` on like's device, in like's dtype (or `dtype`) and
    layout: what a block allocates for activations made from `like`."""
    fmt = torch.channels_last_3d if is_ndhwc(like) else torch.contiguous_format
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device, memory_format=fmt)


def layout_of(x: torch.Tensor) -> str:
    """"ndhwc" or "ncdhw": the layout x (B,C,T,H,W) is in."""
    return "ndhwc" if is_ndhwc(x) else "ncdhw"


def dense_copy(x: torch.Tensor) -> torch.Tensor:
    """A dense copy of x (a view such as a tile) in x's layout (`.contiguous()` would make it NCDHW)."""
    return empty_video(x, x.shape).copy_(x)


def to_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x (B,C,T,H,W) in `layout` (itself when it already is)."""
    return x.contiguous(memory_format=FORMATS[layout])


def weights_in(module: torch.nn.Module, layout: str) -> None:
    """Store the 4-D and 5-D weights of `module` in `layout` (NDHWC: channels last), so convs on
    activations of that layout read them without a per-call conversion. `.to(device)` and `.to(dtype)`
    keep the layout."""
    for param in module.parameters():
        fmt = WEIGHT_FORMATS[layout].get(param.dim())
        if fmt is not None and not param.is_contiguous(memory_format=fmt):
            with torch.inference_mode(False):  # a run is under inference mode; the weights outlive it
                param.data = param.data.contiguous(memory_format=fmt)
