"""What a bug report needs to say about the machine and how StreamVAE runs on it (`python -m vae doctor`,
and the `doctor` lines of a node's run report).

`report(device, dtypes)` gives "label: text" lines: the pack and Python; the device (GPU name,
capability, memory, or the CPU's model and instruction sets); torch, CUDA, cuDNN, Triton and the GPU
driver; the kernel record (where, how much is on it); which conv kernels run there and why; the
Triton norm kernels' first-use verdicts in each dtype (checked now where none is on record: this runs
them once on the GPU); the activation layout per dtype and why; and where the memory model's
coefficients come from (measured on that device type, or derived from the CPU's). With a run's model
and plan (`model=`, `plan=`) the layout is the run's and the memory line the plan's mode.
"""
import logging
import platform
import sys

import torch

from .kernels import Optimizations, backend, conv, filter_cache, kernel_check, kernel_choice
from .kernels.backend import dtype_name
from .run import kernel_plan, memory

log = logging.getLogger("streamvae")


def report(device, dtypes, opts: Optimizations | None = None, *, model=None, plan=None) -> list[str]:
    """The doctor's lines for runs on `device` computing in `dtypes`, with the switches `opts` (default:
    all on, as the nodes and the CLI run); `model` (its chosen layout) and `plan` (its memory mode
    and kernels) narrow the layout and memory lines to one run and add its planned kernels."""
    device = torch.device(device)
    opts = opts or Optimizations()
    lines = [f"StreamVAE: {kernel_choice.pack_version()}; Python {platform.python_version()} on {platform.platform()}",
             f"device: {_device(device)}",
             f"versions: {backend.describe()}, Triton {backend.triton_version() or 'not installed'}, "
             f"GPU driver {backend.driver_version() or 'none'}",
             f"kernel record: {_record(device, opts)}",
             f"convolutions: {_convs(device, dtypes, opts)}"]
    for dtype in dtypes:
        lines.append(f"norms in {dtype_name(dtype)}: {_norms(device, dtype, opts)}")
    for dtype in dtypes:
        chosen = None
        if plan is not None and dtype == (model.decode_dtype if plan.op == "decode" else model.encode_dtype):
            chosen = plan.activation_layout  # the run's, as planned
        elif model is not None:
            chosen = kernel_plan.choose(model, opts.activation_layout, opts.kernel_choice, dtype)
        lines.append(f"activation layout in {dtype_name(dtype)}: "
                     f"{kernel_plan.explain(opts.activation_layout, device, dtype, opts.kernel_choice, chosen)}")
    if plan is not None:
        lines.append(f"kernels this run may take (its plan): {plan.kernels.describe()}")
    lines.append(f"memory model on {device.type}: {_memory(device, model, plan)}")
    return lines


def for_run(device, dtype: torch.dtype, opts: Optimizations, model, plan) -> list[str]:
    """`report` for one finished run (a node's run report): a failure to gather the lines costs the
    report its lines, never the run."""
    try:
        return report(device, [dtype], opts, model=model, plan=plan)
    except Exception as error:  # noqa: BLE001 - a report line must never fail a finished run
        log.warning("StreamVAE: no doctor lines for this run (%s: %s)", type(error).__name__, error)
        return [f"doctor: unavailable ({type(error).__name__}: {error})"]


def _device(device: torch.device) -> str:
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        return f"{device}: {backend.describe_device(device)}, {props.total_memory / 2**30:.1f} GiB"
    cpu = kernel_choice.cpu_identity()
    return (f"{backend.describe_device(device)}; CPU {cpu['cpu']} ({cpu['capability']}; {' '.join(cpu['flags']) or 'no AVX'}), "
            f"{torch.get_num_threads()} threads")


def _record(device: torch.device, opts: Optimizations) -> str:
    record = kernel_choice.choices_for(device)
    where = str(record.path) if record.path is not None else "memory only (the cache folder is not writable)"
    used = "used" if opts.kernel_choice == "measure" else f"not used (kernel_choice {opts.kernel_choice})"
    return f"{where}: {record.on_record()} layer shape(s) timed, {used}"


def _convs(device: torch.device, dtypes, opts: Optimizations) -> str:
    if device.type == "cuda":
        parts = ["cuDNN through F.conv3d"]
        if backend.conv3d_regression_affected():
            state = "cuDNN called directly" if opts.conv3d_workaround else "workaround off (conv3d_workaround)"
            parts.append(f"the PyTorch 2.9 cuDNN conv3d regression is present: half precision {state}")
    else:
        native = ", ".join(f"{dtype_name(d)} {'native' if backend.cpu_has_native(d) else 'computed in fp32'}"
                           for d in dtypes if d != torch.float32)
        parts = ["oneDNN direct" + (f" ({native})" if native else "")]
        if opts.winograd_conv:
            parts.append(f"Winograd F(4x4, 3x3) for stride-1 3x3 convs of {conv.WINOGRAD_MIN_CHANNELS}+ channels "
                         f"(filter cache {filter_cache.default_cache_bytes() / 2**30:.1f} GiB)")
    if opts.kernel_choice == "measure":
        wins: dict[str, int] = {}
        for entry in kernel_choice.choices_for(device).recorded(f"conv3d {device.type} ").values():
            wins[entry["choice"]] = wins.get(entry["choice"], 0) + 1
        on_record = ", ".join(f"{name} {count}" for name, count in sorted(wins.items())) or "none yet"
        parts.append(f"the fastest candidate measured once per layer shape (on record: {on_record})")
    else:
        parts.append("fixed rules (kernel_choice defaults)")
    return "; ".join(parts)


def _norms(device: torch.device, dtype: torch.dtype, opts: Optimizations) -> str:
    if not opts.fused_norm_act:
        return "torch's GroupNorm / normalize (fused_norm_act off)"
    if not opts.triton_norm:
        return "the pack's torch kernels (triton_norm off)"
    if not kernel_check.runs_triton(device):
        return f"the pack's torch kernels; {kernel_check.summary(device, dtype)}"
    return kernel_check.summary(device, dtype)


def _memory(device: torch.device, model, plan) -> str:
    if model is None or plan is None:
        return memory.calibration_summary(device.type)
    family, _ = model.memory_calibration(plan.op)
    mode = memory.calibration_mode(model.clip_extent(plan.op), plan.tile_size, plan.tiling, plan.frames_streamed,
                                   plan.cache_offload)
    return f"{family} {plan.op} {mode}: {memory.calibration_source(family, plan.op, mode, device.type)}"


def main(device: str | None, dtype_names: list[str] | None) -> None:
    """Print the report for `device` (default: the GPU, else the CPU) in `dtype_names` (default: what
    "auto" computes decode and encode in there)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtypes = [backend.DTYPES[name] for name in dtype_names] if dtype_names else \
        list(dict.fromkeys(backend.auto_dtype(device, op) for op in ("decode", "encode")))
    print("StreamVAE doctor (paste all of this into a bug report)", file=sys.stdout)
    for line in report(device, dtypes):
        print(f"  {line}")
