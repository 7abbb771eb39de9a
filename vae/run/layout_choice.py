"""Which activation layout a run takes (NCDHW or NDHWC, `kernels.layout`): by device and dtype, or on
CUDA with measured kernels timed once on the GPU that runs. The planner records the choice in the
`Plan` (`planning.plan`), which also puts the model's weights in that layout; a decode only reads it."""
from functools import lru_cache

import torch

from ..kernels import conv, conv_check, kernel_choice
from ..kernels.layout import FORMATS


def resolve(layout: str, device, dtype: torch.dtype) -> str:
    """The concrete layout ("ncdhw" or "ndhwc") of a run on `device` computing in `dtype`.

    "auto": NDHWC on CUDA (cuDNN's conv3d kernels are NDHWC; faster and smaller than NCDHW on the one
    GPU measured) and for half precision on a CPU with native bf16/fp16 kernels (whole decodes and
    encodes faster than NCDHW); NCDHW for float32 on a CPU, where the two tie, and on a CPU without
    native half precision, which computes it in float32.
    """
    return layout if layout != "auto" else _auto(device, dtype)[0]


def _auto(device, dtype: torch.dtype) -> tuple[str, str]:
    """("ndhwc" or "ncdhw", why) of "auto" by device and dtype (`resolve`)."""
    device = torch.device(device)
    if device.type == "cuda":
        return "ndhwc", "cuDNN's conv3d kernels are channels-last"
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        if conv.cpu_has_native(dtype):
            return "ndhwc", "this CPU has native half-precision convs, faster channels-last"
        return "ncdhw", "this CPU has no native half-precision convs: computed in float32, where the layouts tie"
    return "ncdhw", f"float32 on {device.type}: the layouts tie"


def explain(setting: str, device, dtype: torch.dtype, kernels: str, chosen: str | None = None) -> str:
    """Which layout a run on `device` in `dtype` takes and why, for `vae doctor` and run reports:
    `choose`'s decision for the `activation_layout` `setting` and `kernel_choice` mode `kernels`
    (`chosen`: what `choose` gave a model, when one ran)."""
    if setting == "ndhwc" or (setting == "auto" and _auto(device, dtype)[0] == "ndhwc"):
        failed = conv_check.failure(device, dtype)
        if failed is not None:
            return f"NCDHW (NDHWC convs failed their first-use check here: {failed})"
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


# `measured`'s probes: output frames, and the frame side in pixels of the widest and of the narrowest
# conv (a decoder's low- and full-resolution ends).
PROBE_FRAMES, PROBE_SIDES = 2, (64, 256)


def measured(model: torch.nn.Module, device, dtype: torch.dtype) -> str:
    """The layout in which `model`'s convs run faster on `device` in `dtype`, timed once per machine
    (kernel_choice, keyed by the two weights' shapes): its widest and its narrowest 3x3x3 conv, each on
    PROBE_FRAMES output frames at PROBE_SIDES, inputs and weights in the layout timed. NDHWC unless
    NCDHW is kernel_choice.MIN_GAIN faster."""
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
            conv.conv3d(x, w, None, (1, 1, 1), (0, 1, 1), cudnn_workaround=True)

    key = (f"activation layout {device.type} {str(dtype).removeprefix('torch.')} "
           f"w{tuple(probes[0].shape)} w{tuple(probes[1].shape)}")
    return kernel_choice.pick(key, device, {name: (lambda name=name: run(name)) for name in ("ndhwc", "ncdhw")},
                              "ndhwc")


def choose(model: torch.nn.Module, setting: str, kernels: str, dtype: torch.dtype) -> str:
    """The layout of a run of `model` (a `VideoVAE`, on `model.device`) computing in `dtype`, for the
    `activation_layout` `setting` and the `kernel_choice` mode `kernels`: `resolve`'s, except that
    "auto" on CUDA with measured kernels is `measured` on the GPU that runs (NDHWC was measured on one
    GPU type only; a GPU or a torch whose NDHWC convs are slower keeps NCDHW). NDHWC, chosen or set, is
    taken only where its convs passed their first-use check on that device in that dtype
    (`kernels.conv_check`); where they failed the run keeps NCDHW."""
    if setting == "auto" and kernels == "measure" and torch.device(model.device).type == "cuda":
        chosen = measured(model, model.device, dtype)
    else:
        chosen = resolve(setting, model.device, dtype)
    if chosen == "ndhwc" and conv_check.failure(model.device, dtype) is not None:
        return "ncdhw"
    return chosen
