"""Which kernels and activation layout a run takes, decided with its `Plan` (`planning.plan`) before it
runs: the layout (NCDHW or NDHWC, `kernels.activation_layout`) by device type, or on CUDA with measured
kernels timed once on the GPU that runs; and the kernels its convs, norms and attention may take
(`KernelPlan`), named as the run's `KernelLog` names what ran. The engine puts the model's weights
in the layout before the run (`kernels.activation_layout.weights_in`); planning leaves the model as it is."""
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..kernels import Optimizations, attention, conv, conv_check, kernel_choice, norm_act
from ..kernels.activation_layout import FORMATS


def resolve(layout: str, device) -> str:
    """The concrete layout ("ncdhw" or "ndhwc") of a run on `device`.

    "auto": NDHWC on CUDA (cuDNN's conv3d kernels are NDHWC; faster and smaller than NCDHW on the one
    GPU measured) and on a CPU (oneDNN's native layout, and the Winograd kernel's tiles are channels last:
    whole decodes 1.06-1.20x and encodes 1.03-1.22x faster than NCDHW in float32, 1.6-1.9x in bf16;
    bench/RESULTS.md sections 11 and 18); NCDHW elsewhere.
    """
    return layout if layout != "auto" else _auto(device)[0]


def _auto(device) -> tuple[str, str]:
    """("ndhwc" or "ncdhw", why) of "auto" by device type (`resolve`)."""
    device = torch.device(device)
    if device.type == "cuda":
        return "ndhwc", "cuDNN's conv3d kernels are channels-last"
    if device.type == "cpu":
        return "ndhwc", "oneDNN's native layout and the Winograd kernel's tiles are channels-last"
    return "ncdhw", f"no channels-last kernels measured on {device.type}"


def explain(setting: str, device, dtype: torch.dtype, kernels: str, chosen: str | None = None) -> str:
    """Which layout a run on `device` in `dtype` takes and why, for `vae doctor` and run reports:
    `choose`'s decision for the `activation_layout` `setting` and `kernel_choice` mode `kernels`
    (`chosen`: what `choose` gave a model, when one ran)."""
    if setting == "ndhwc" or (setting == "auto" and _auto(device)[0] == "ndhwc"):
        failed = conv_check.failure(device, dtype)
        if failed is not None:
            return f"NCDHW (NDHWC convs failed their first-use check here: {failed})"
    if setting != "auto":
        return f"{setting.upper()} (set by activation_layout)"
    rule, why = _auto(device)
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
        chosen = resolve(setting, model.device)
    if chosen == "ndhwc" and conv_check.failure(model.device, dtype) is not None:
        return "ncdhw"
    return chosen


@dataclass(frozen=True)
class KernelPlan:
    """The kernels a run's convs and norms may take, as its `KernelLog` names them ("onednn",
    "winograd_mkl", "torch", "triton", ...: what ran is one of these), and the attention kernel of each
    of the model's attention head widths (`attention.KERNELS`; "auto": PyTorch's pick)."""

    conv: tuple[str, ...] = ("onednn",)
    norm: tuple[str, ...] = ("torch",)
    attention: tuple[tuple[int, str], ...] = ()

    def describe(self) -> str:
        """e.g. "conv3d onednn or winograd_mkl; norms torch; attention auto (head 384)"."""
        heads = ", ".join(f"{kernel} (head {width})" for width, kernel in self.attention) or "none in this model"
        return f"conv3d {' or '.join(self.conv)}; norms {' or '.join(self.norm)}; attention {heads}"


def conv_weights(modules) -> list[tuple[tuple[int, ...], tuple[int, int, int]]]:
    """(B,C,T,H,W weight shape, stride) of every conv in `modules`; a frame conv as the 1-frame 3-D conv
    it runs as."""
    found = []
    for module in (m for root in modules for m in root.modules()):
        if isinstance(module, torch.nn.Conv3d):
            found.append((tuple(module.weight.shape), tuple(module.stride)))
        elif isinstance(module, torch.nn.Conv2d):
            cout, cin, kh, kw = module.weight.shape
            found.append(((cout, cin, 1, kh, kw), (1, *module.stride)))
    return found


def kernels_for(model, op: str, device, dtype: torch.dtype, layout: str, opts: Optimizations) -> KernelPlan:
    """The `KernelPlan` of `model`'s `op` ("encode"/"decode") on `device` in `dtype` with `layout`
    activations, under `opts`."""
    modules = model.decode_modules() if op == "decode" else model.encode_modules()
    convs = conv.planned_kernels(device, dtype, conv_weights(modules), layout, opts.winograd_conv,
                                 opts.conv3d_workaround, opts.kernel_choice)
    norms = norm_act.planned_kernels(device, dtype, opts.triton_norm)
    heads = tuple((width, attention.choose(opts.attention, width, dtype, device)[0])
                  for width in model.attention_widths())
    return KernelPlan(convs, norms, heads)
