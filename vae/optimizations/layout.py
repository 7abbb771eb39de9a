"""The memory layout of a run's activations: NCDHW (channel planes) or NDHWC (channels last).

The tensors keep their logical B,C,T,H,W shape either way; only the strides differ. cuDNN's fast
conv3d kernels and oneDNN's native plain format are NDHWC: with NCDHW activations cuDNN converts the
input and the output of every conv (14 % of a Wan2.1 decode on an H100, bench/gpu_profile.py), and
channels-last weights alone made it 2.0x slower, because each activation was then converted
(bench/RESULTS.md section 0). So a run is in one layout from the first conv to the last:

- the engine puts the chunk's input and the conv weights into the run's layout (`for_run`), and
  the output is copied into the caller's NCDHW tensor;
- every buffer a block allocates takes the layout of the tensor it is made from (`empty_video`), and
  convs, norms, adds and copies keep the layout of their input, so the activations never fall back.

Which layout a run takes is `Optimizations.activation_layout`: "ncdhw", "ndhwc", or "auto" (`resolve`;
on CUDA with measured kernels, `measured` confirms it on the GPU that runs).
"""
from functools import lru_cache

import torch

from . import kernel_choice

LAYOUTS = ("auto", "ncdhw", "ndhwc")
FORMATS = {"ncdhw": torch.contiguous_format, "ndhwc": torch.channels_last_3d}
WEIGHT_FORMATS = {"ncdhw": {4: torch.contiguous_format, 5: torch.contiguous_format},
                  "ndhwc": {4: torch.channels_last, 5: torch.channels_last_3d}}


def resolve(layout: str, device, dtype: torch.dtype) -> str:
    """The concrete layout ("ncdhw" or "ndhwc") of a run on `device` computing in `dtype`.

    "auto": NDHWC on CUDA (cuDNN's NDHWC conv3d kernels; other projects' Wan VAEs report 1.2-1.8x,
    unmeasured here until a GPU run) and for half precision on a CPU with native bf16/fp16 kernels
    (whole decodes and encodes 1.6-1.9x faster than NCDHW, bench/RESULTS.md section 11); NCDHW for
    float32 on a CPU, where the two tie (0.94-1.00x) and a CPU without native half precision, which
    computes it in float32.
    """
    return layout if layout != "auto" else _auto(device, dtype)[0]


def _auto(device, dtype: torch.dtype) -> tuple[str, str]:
    """("ndhwc" or "ncdhw", why) of "auto" by device and dtype (`resolve`)."""
    device = torch.device(device)
    if device.type == "cuda":
        return "ndhwc", "cuDNN's conv3d kernels are channels-last"
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        from .conv import cpu_has_native
        if cpu_has_native(dtype):
            return "ndhwc", "this CPU has native half-precision convs, 1.6-1.9x faster channels-last"
        return "ncdhw", "this CPU has no native half-precision convs: computed in float32, where the layouts tie"
    return "ncdhw", f"float32 on {device.type}: the layouts tie"


def explain(setting: str, device, dtype: torch.dtype, kernels: str, chosen: str | None = None) -> str:
    """Which layout a run on `device` in `dtype` takes and why, for `vae doctor` and run reports:
    `choose`'s decision for the `activation_layout` `setting` and `kernel_choice` mode `kernels`
    (`chosen`: what `choose` gave a model, when one ran)."""
    if setting != "auto":
        return f"{setting.upper()} (set by activation_layout)"
    rule, why = _auto(device, dtype)
    if not (kernels == "measure" and torch.device(device).type == "cuda"):
        return f"{rule.upper()} (auto: {why})"
    prefix = f"activation layout cuda {str(dtype).removeprefix('torch.')} "
    timed = {key.removeprefix(prefix): entry for key, entry in kernel_choice.choices_for(device).recorded(prefix).items()}
    record = "; ".join(f"{weights}: {entry['choice'].upper()} "
                       f"({', '.join(f'{n} {ms} ms' for n, ms in entry.get('ms', {}).items())})"
                       for weights, entry in timed.items()) or "none timed yet"
    head = f"{chosen.upper()} for this model" if chosen else "NDHWC, or NCDHW for a model whose convs run faster so"
    return (f"{head} (auto with measured kernels: each model's widest and narrowest 3x3x3 conv timed in both layouts "
            f"once on this GPU; on record: {record})")


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


# `measured`'s probes: output frames, and the frame side in pixels of the widest and of the narrowest
# conv (a decoder's low- and full-resolution ends).
PROBE_FRAMES, PROBE_SIDES = 2, (64, 256)


def measured(model: torch.nn.Module, device, dtype: torch.dtype) -> str:
    """The layout in which `model`'s convs run faster on `device` in `dtype`, timed once per machine
    (kernel_choice, keyed by the two weights' shapes): its widest and its narrowest 3x3x3 conv, each on
    PROBE_FRAMES output frames at PROBE_SIDES, inputs and weights in the layout timed. NDHWC unless
    NCDHW is kernel_choice.MIN_GAIN faster."""
    from .conv import conv3d

    convs = [p for p in model.parameters() if p.dim() == 5 and tuple(p.shape[2:]) == (3, 3, 3)]
    if not convs:
        return "ndhwc"
    probes = (max(convs, key=lambda w: w.shape[0] * w.shape[1]), min(convs, key=lambda w: w.shape[0] * w.shape[1]))
    device = torch.device(device)

    @lru_cache(maxsize=None)
    def cases(layout: str):  # built only when a layout is timed (not when the choice is on record)
        return [(torch.randn(1, w.shape[1], PROBE_FRAMES + 2, side, side, device=device, dtype=dtype)
                 .contiguous(memory_format=FORMATS[layout]),
                 w.detach().to(device, dtype).contiguous(memory_format=FORMATS[layout]))
                for w, side in zip(probes, PROBE_SIDES)]

    def run(layout: str) -> None:
        for x, w in cases(layout):
            conv3d(x, w, None, (1, 1, 1), (0, 1, 1), cudnn_workaround=True)

    key = (f"activation layout {device.type} {str(dtype).removeprefix('torch.')} "
           f"w{tuple(probes[0].shape)} w{tuple(probes[1].shape)}")
    return kernel_choice.pick(key, device, {name: (lambda name=name: run(name)) for name in ("ndhwc", "ncdhw")},
                              "ndhwc")


def choose(model: torch.nn.Module, setting: str, kernels: str, dtype: torch.dtype) -> str:
    """The layout of a run of `model` (a `VideoVAE`, on `model.device`) computing in `dtype`, for the
    `activation_layout` `setting` and the `kernel_choice` mode `kernels`: `resolve`'s, except that
    "auto" on CUDA with measured kernels is `measured` on the GPU that runs (NDHWC is unmeasured on
    most GPUs; a GPU or a torch whose NDHWC convs are slower keeps NCDHW)."""
    if setting == "auto" and kernels == "measure" and torch.device(model.device).type == "cuda":
        return measured(model, model.device, dtype)
    return resolve(setting, model.device, dtype)


def for_run(model: torch.nn.Module, setting: str, kernels: str, dtype: torch.dtype) -> str:
    """`choose`, with the model's weights put in the chosen layout (`weights_in`)."""
    chosen = choose(model, setting, kernels, dtype)
    weights_in(model, chosen)
    return chosen
