"""Normalisation (+ SiLU) kernels shared by the VAE families, torch implementations.

Both norms here produce `act(norm(x))` for x laid out B,C,T,H,W and can write the result into a
caller-provided tensor (`out`), which is how the causal convs receive their input without an extra
copy. Statistics are always computed in float32, also for bf16/fp16 activations.

- Per-frame GroupNorm (SeedVR2): statistics over (C/G, H, W) of each frame, never across time, which
  is what makes temporal chunking exact. Split into `group_norm_stats` and `group_norm_apply` so the
  tiling engine can sum statistics over the tiles of a frame before applying them. On the CPU both
  run over blocks of channel planes that stay in cache (`_cpu_blocks`).
- RMS norm over channels (Wan): x / max(||x||_2, eps) * sqrt(C) * gamma, per position.
"""
import math

import torch
import torch.nn.functional as F

from . import kernel_check, kernel_choice, triton_norm
from .kernel_log import KernelLog
from .activation_layout import is_ndhwc, layout_of


def _use_triton(x: torch.Tensor, enabled: bool, kernel: str) -> bool:
    """Whether the Triton `kernel` (kernel_check.KERNELS) computes this call: asked for, not while
    torch.compile traces a block (inductor generates its own fused kernels there), and usable for x
    (`kernel_check.usable`: a GPU tensor whose device, layout and dtype the kernel passed its first-use
    check in)."""
    # The device test first, inline: on a CPU (without the interpreter) a switched-on Triton costs nothing.
    return (enabled and (x.is_cuda or (x.is_cpu and kernel_check.INTERPRETED)) and not torch.compiler.is_compiling()
            and kernel_check.usable(x, kernel))


def planned_kernels(device, dtype: torch.dtype, triton: bool) -> tuple[str, ...]:
    """The names (as the norms log them) of the kernels a run's norms may take on `device` in `dtype`
    before any runs: "triton" where it is asked for (`triton`), launches there and one of its kernels
    passed its first-use check in `dtype`; "torch" always (a call the Triton kernels cannot take, or
    one measured faster in torch, runs it)."""
    device = torch.device(device)
    # The device test first, as in `_use_triton`: on a CPU (without the interpreter) nothing is asked.
    if not (triton and (device.type == "cuda" or kernel_check.INTERPRETED) and dtype in kernel_check.DTYPES
            and kernel_check.runs_triton(device)):
        return ("torch",)
    if device.type == "cuda" and not torch.cuda.is_available():  # a plan for a GPU this process has not: its
        return ("triton", "torch")                              # kernels are checked there, on first use
    found = kernel_check.verdicts(kernel_check.device_name(device), dtype).values()
    return ("triton", "torch") if any(v.passed for v in found) else ("torch",)


def _logged(log: KernelLog | None, step: str, triton: bool, x: torch.Tensor) -> bool:
    """Adds the call of norm `step` on x to the run's `log` (if any); returns `triton`."""
    if log is not None:
        log.add(step, "triton" if triton else "torch", x)
    return triton


def _traced_act(y: torch.Tensor, act: bool, out: torch.Tensor | None) -> torch.Tensor:
    """The end of a norm while torch.compile traces: dynamo cannot trace ops writing into a
    non-contiguous `out` (a view of a conv's input buffer), so the result is computed functionally
    and copied in; inductor fuses the copy into the norm's kernel."""
    y = F.silu(y) if act else y
    return y if out is None else out.copy_(y)


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def group_norm_stats(x: torch.Tensor, groups: int, eps: float, triton: bool = False,
                     log: KernelLog | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-frame group statistics of x (B,C,T,H,W) -> (mean, rstd), each float32 of shape B,G,T."""
    mean, var = group_norm_moments(x, groups, triton, log)
    return mean, torch.rsqrt(var + eps)


def group_norm_moments(x: torch.Tensor, groups: int, triton: bool = False,
                       log: KernelLog | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-frame group (mean, biased variance) of x (B,C,T,H,W), float32 (float64 for float64 x), B,G,T.
    `log`: the run's record of what ran (kernel_log.py)."""
    if _logged(log, "group_norm_stats", _use_triton(x, triton, "group_norm_stats"), x):
        return triton_norm.group_norm_moments(x, groups)
    if x.device.type == "cpu" and x.dtype != torch.float64 and not torch.compiler.is_compiling():
        return _cpu_group_moments(x, groups)
    return torch_group_moments(x, groups)


# Half-precision statistics off the CPU without Triton upcast at most this many elements at a time.
UPCAST_BLOCK_ELEMENTS = 1 << 24


def torch_group_moments(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`group_norm_moments` by torch.var_mean (GPUs without Triton, float64; on the CPU, the baseline
    of bench/bench_norms.py)."""
    b, c, t, h, w = x.shape
    grouped = x.reshape(b, groups, c // groups, t, h * w)
    if x.dtype == _stat_dtype(x):
        var, mean = torch.var_mean(grouped, dim=(2, 4), unbiased=False)
        return mean, var
    # Half-precision input: upcast a few groups of one frame at a time, so the fp32 copy stays small
    # (a whole 1080p frame of 128 channels would be 1 GiB).
    var = x.new_empty((b, groups, t), dtype=torch.float32)
    mean = torch.empty_like(var)
    step = max(1, UPCAST_BLOCK_ELEMENTS // max(1, b * (c // groups) * h * w))  # groups per block
    for i in range(t):
        for g in range(0, groups, step):
            part = grouped[:, g:g + step, :, i].float()  # B,groups,C/G,H*W
            var[:, g:g + step, i], mean[:, g:g + step, i] = torch.var_mean(part, dim=(2, 3), unbiased=False)
    return mean, var


def merge_group_moments(parts: list[tuple[torch.Tensor, torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine per-tile (mean, var, count) of the same frames into whole-frame (mean, var).

    Chan's pairwise update keeps float32 accurate where E[x^2]-E[x]^2 would cancel.
    """
    mean, var, count = parts[0]
    for m, v, n in parts[1:]:
        total = count + n
        delta = m - mean
        mean = mean + delta * (n / total)
        var = (var * count + v * n + delta * delta * (count * n / total)) / total
        count = total
    return mean, var


def group_norm_apply(
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    act: bool,
    out: torch.Tensor | None = None,
    triton: bool = False,
    log: KernelLog | None = None,
) -> torch.Tensor:
    """(x - mean) * rstd * weight + bias (statistics B,G,T), then SiLU if `act`.

    Computed as (x - mean) * scale + bias with a per (frame, channel) scale in the statistics'
    precision. The mean is subtracted first: folding it into one multiply-add (x * scale + shift)
    rounds both terms at the size of the mean, which loses the result where |mean| >> std.
    """
    b, c, t = x.shape[:3]
    centre, scale, shift = triton_norm.apply_terms(mean, rstd, weight, bias)
    if torch.compiler.is_compiling():
        centre, scale, shift = (v.reshape(b, c, t, 1, 1) for v in (centre, scale, shift))
        return _traced_act(torch.addcmul(shift, x.to(scale.dtype) - centre, scale).to(x.dtype), act, out)
    if out is None:
        out = torch.empty_like(x)
    if _logged(log, "group_norm_apply", _use_triton(x, triton, "group_norm_apply"), x):
        return triton_norm.center_scale_act(x, centre, scale, shift, act, out)
    if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16):
        half_act = _cpu_channels_last_act if is_ndhwc(x) else _cpu_half_center_scale_act
        return half_act(x, centre, scale, shift, act, out)
    centre, scale, shift = (v.reshape(b, c, t, 1, 1) for v in (centre, scale, shift))
    if x.dtype == scale.dtype:
        torch.sub(x, centre, out=out)
        torch.addcmul(shift, out, scale, out=out)
    else:
        # bf16/fp16: per-frame float32 arithmetic; rounding mean and scale to half precision would
        # cost accuracy where |mean| >> std.
        for i in range(t):
            out[:, :, i] = torch.addcmul(shift[:, :, i], x[:, :, i].float() - centre[:, :, i], scale[:, :, i])
    if act:
        F.silu(out, inplace=True)
    return out


# On the CPU, torch.var_mean reads a frame's channels far slower than memory allows, and half-precision
# input needs float32 copies. The statistics, and the apply step of half-precision input, run here over blocks
# of whole channel planes (of one frame, or of several whole frames where frames are small), about
# CPU_BLOCK_BYTES in float32: each block is read from memory once and stays in cache for the few ops on
# it; much smaller blocks lose to per-op overheads. Side by side with upstream's ops: bench/bench_norms.py,
# bench/RESULTS.md sections 9b and 11c.
CPU_BLOCK_BYTES = 4 << 20


def _block_extent(x: torch.Tensor) -> tuple[int, int]:
    """(channels, frames) of x (B,C,T,H,W) per block: about CPU_BLOCK_BYTES of float32 channel planes
    (H x W), at least one; whole frames (all channels) are taken together when they are smaller."""
    c, t = x.shape[1:3]
    planes = max(1, CPU_BLOCK_BYTES // (4 * x.shape[3] * x.shape[4]))
    return (planes, 1) if planes < c else (c, min(t, planes // c))


def _cpu_blocks(x: torch.Tensor):
    """(batch index, channel slice, frame slice) covering x (B,C,T,H,W) in blocks of `_block_extent`."""
    b, c, t = x.shape[:3]
    step_c, step_t = _block_extent(x)
    for i in range(b):
        for f0 in range(0, t, step_t):
            for c0 in range(0, c, step_c):
                yield i, slice(c0, min(c0 + step_c, c)), slice(f0, min(f0 + step_t, t))


def _cpu_scratch(x: torch.Tensor) -> torch.Tensor:
    """A float32 buffer for one block of `_cpu_blocks(x)`."""
    return torch.empty(math.prod(_block_extent(x)) * x.shape[3] * x.shape[4], dtype=torch.float32)


def _cpu_group_moments(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`group_norm_moments` on the CPU, blockwise: each channel's mean and centred sum of squares over
    the frame (`_cpu_plane_moments`, or `_cpu_channels_last_moments` for NDHWC x), merged per group in
    float64 with Chan's formula (equal counts). Any strides (tiles are views)."""
    b, c, t, h, w = x.shape
    n = h * w
    moments = _cpu_channels_last_moments if is_ndhwc(x) else _cpu_plane_moments
    plane_mean, plane_m2 = (v.view(b, groups, c // groups, t) for v in moments(x))  # float64 B,C,T each
    mean = plane_mean.mean(2)
    m2 = plane_m2.sum(2) + n * (plane_mean - mean.unsqueeze(2)).square().sum(2)
    return mean.float(), (m2 / (n * (c // groups))).float()


def _cpu_plane_moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per channel plane of x (B,C,T,H,W) in NCDHW: (mean, centred sum of squares), float64 B,C,T.
    Each block is centred on its plane's float32 mean; the centred values' mean corrects it and is
    added in float64 (a float32 sum rounds at the size of the mean, which the merge would see where
    |mean| >> std)."""
    b, c, t, h, w = x.shape
    n = h * w
    plane_mean, plane_fix, plane_m2 = torch.empty(3, b, c, t, dtype=torch.float32)
    scratch = _cpu_scratch(x)
    for i, chans, frames in _cpu_blocks(x):
        block = x[i, chans, frames]  # (channels, frames, H, W)
        centred = scratch[:block.numel()].view(block.shape)
        if block.dtype == torch.float32:
            mean = block.sum((2, 3), keepdim=True).div_(n)
            torch.sub(block, mean, out=centred)
        else:  # converted first: arithmetic on mixed dtypes takes a slow casting loop
            mean = centred.copy_(block).sum((2, 3), keepdim=True).div_(n)
            centred.sub_(mean)
        residual = centred.sum((2, 3)).div_(n)
        plane_mean[i, chans, frames], plane_fix[i, chans, frames] = mean.view(residual.shape), residual
        plane_m2[i, chans, frames] = centred.square_().sum((2, 3)) - residual * residual * n
    return plane_mean.double() + plane_fix, plane_m2.double()


def _channels_last_blocks(x: torch.Tensor):
    """(batch index, frame, row slice, float32 copy (rows, W, C) of those pixel rows) covering NDHWC x
    (B,C,T,H,W) in blocks of about CPU_BLOCK_BYTES, which stay in cache for the few ops on them; every
    block's copy is in the same buffer."""
    b, c, t, h, w = x.shape
    rows = max(1, CPU_BLOCK_BYTES // (4 * w * c))
    scratch = torch.empty(rows * w * c, dtype=torch.float32)
    for i in range(b):
        for f in range(t):
            for r0 in range(0, h, rows):
                src = x[i, :, f, r0:r0 + rows].permute(1, 2, 0)  # (rows, W, C)
                yield i, f, slice(r0, r0 + src.shape[0]), scratch[:src.numel()].view(src.shape).copy_(src)


def _channels_last_map(x: torch.Tensor, out: torch.Tensor, act: bool, op) -> torch.Tensor:
    """out = act(op(block)) of NDHWC x, block by block (`_channels_last_blocks`): `op(i, f, block)`
    changes the float32 block (rows, W, C) in place; the result is rounded once into out."""
    for i, f, rows, work in _channels_last_blocks(x):
        op(i, f, work)
        if act:
            F.silu(work, inplace=True)
        out[i, :, f, rows].permute(1, 2, 0).copy_(work)
    return out


def _cpu_channels_last_moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_cpu_plane_moments` of NDHWC x: blocks of pixel rows (rows*W, C), whose per-channel sums run
    along the contiguous channels; each block's (mean, M2) per channel, merged over the frame's
    blocks in float64 with Chan's formula."""
    b, c, t, h, w = x.shape
    mean, m2 = torch.zeros(2, b, c, t, dtype=torch.float64)
    for i, f, rows, work in _channels_last_blocks(x):
        block = work.view(-1, c)  # (pixels, C) float32
        n, seen = block.shape[0], (rows.start * w)  # pixels in this block and in the frame before it
        centre = block.mean(0)
        block.sub_(centre)
        fix = block.mean(0)  # corrects the float32 mean's rounding
        block_mean = centre.double() + fix
        block_m2 = (block.square().sum(0) - fix * fix * n).double()
        delta = block_mean - mean[i, :, f]
        total = seen + n
        mean[i, :, f] += delta * (n / total)
        m2[i, :, f] += block_m2 + delta * delta * (seen * n / total)
    return mean, m2


def _cpu_half_center_scale_act(x, centre, scale, shift, act: bool, out: torch.Tensor) -> torch.Tensor:
    """out = act((x - centre) * scale + shift) for half-precision x on the CPU, blockwise in float32,
    rounded once; centre, scale, shift float32 (B,C,T). (In float32 the whole-tensor ops are as fast.)"""
    scratch = _cpu_scratch(x)
    for i, chans, frames in _cpu_blocks(x):
        src = x[i, chans, frames]
        work = scratch[:src.numel()].view(src.shape)
        at = [v[i, chans, frames].unsqueeze(-1).unsqueeze(-1) for v in (centre, scale, shift)]
        work.copy_(src).sub_(at[0])  # converted first: arithmetic on mixed dtypes takes a slow casting loop
        torch.addcmul(at[2], work, at[1], out=work)
        if act:
            F.silu(work, inplace=True)
        out[i, chans, frames] = work
    return out


def _cpu_channels_last_act(x, centre, scale, shift, act: bool, out: torch.Tensor) -> torch.Tensor:
    """`_cpu_half_center_scale_act` for NDHWC x: blocks of pixel rows (rows, W, C) converted to float32,
    which stay in cache for the few ops on them (one pass over memory, one rounding); with the blocked
    statistics, faster than upstream's ops in bf16. Float32 keeps the whole-tensor ops, as fast there."""

    def apply(i, f, work):
        work.sub_(centre[i, :, f])  # per channel, along the innermost dim
        torch.addcmul(shift[i, :, f], work, scale[i, :, f], out=work)

    return _channels_last_map(x, out, act, apply)


def _measured_triton(x: torch.Tensor, triton: bool, kernels: str, name: str, run, steps: tuple[str, ...]) -> bool:
    """Whether this norm call takes the Triton kernels: as `triton` says, except that with
    kernels="measure" (Optimizations.kernel_choice) the Triton and torch paths are timed once per
    shape on this GPU (run(use_triton) computes the norm into a scratch output) and the faster runs.
    Keyed without the frame count, so every temporal chunk of a clip takes the same path. `steps`: the
    norm's Triton kernels; nothing is timed where none of them may run (`_use_triton`)."""
    if kernels != "measure" or not any(_use_triton(x, triton, step) for step in steps):
        return triton
    shape = tuple(x.shape[:2]) + tuple(x.shape[3:]) if x.dim() == 5 else tuple(x.shape)
    key = f"{name} {x.device.type} {str(x.dtype).removeprefix('torch.')} {shape} {layout_of(x)}"
    return kernel_choice.pick(key, x.device, {"triton": lambda: run(True), "torch": lambda: run(False)}, "triton") == "triton"


def group_norm_act(x, groups, weight, bias, eps, act=True, out=None, triton=False, kernels="defaults", log=None):
    """Per-frame GroupNorm (+SiLU) of x (B,C,T,H,W) in one go (Triton kernels on CUDA if `triton`;
    `kernels` as in `_measured_triton`; `log` as in `group_norm_moments`)."""
    triton = _measured_triton(x, triton, kernels, f"group_norm_act g{groups} act {act}",
                              lambda use: group_norm_act(x, groups, weight, bias, eps, act, None, use),
                              ("group_norm_stats", "group_norm_apply"))
    mean, rstd = group_norm_stats(x, groups, eps, triton, log)
    return group_norm_apply(x, mean, rstd, weight, bias, act, out, triton, log)


# On the CPU a reduction across dim 1 of B,C,T,H,W reads with a stride of T*H*W, slowly;
# adding up channel planes instead (each contiguous, into one float32 plane that stays in cache) is
# faster from about 4096 positions per channel up, slower below (a Python step per channel).
PLANE_SUM_MIN_POSITIONS = 4096


def _channel_norm(x: torch.Tensor) -> torch.Tensor:
    """||x||_2 over dim 1 of x (B,C,...), float32, keepdim."""
    if (x.device.type != "cpu" or x[:1, :1].numel() < PLANE_SUM_MIN_POSITIONS or is_ndhwc(x)
            or torch.compiler.is_compiling()):  # NDHWC: torch reduces the contiguous channels fast
        return torch.linalg.vector_norm(x, dim=1, keepdim=True, dtype=torch.float32)
    squares = torch.zeros((x.shape[0], 1) + x.shape[2:], dtype=torch.float32, device=x.device)
    for channel in range(x.shape[1]):
        plane = x[:, channel:channel + 1].float()  # a no-op for float32
        squares.addcmul_(plane, plane)
    return squares.sqrt_()


def rms_norm_act(x: torch.Tensor, gamma: torch.Tensor, eps: float = 1e-12, act: bool = True,
                 out: torch.Tensor | None = None, triton: bool = False, kernels: str = "defaults",
                 log: KernelLog | None = None) -> torch.Tensor:
    """Wan RMS norm over channels (dim 1) of x (B,C,...) (+SiLU): x / max(||x||, eps) * sqrt(C) * gamma.
    `kernels` as in `_measured_triton`; `log` as in `group_norm_moments`."""
    c = x.shape[1]
    triton = _measured_triton(x, triton, kernels, f"rms_norm_act act {act}",
                              lambda use: rms_norm_act(x, gamma, eps, act, None, use), ("rms_norm",))
    if _logged(log, "rms_norm", x.dim() == 5 and _use_triton(x, triton, "rms_norm"), x):
        return triton_norm.rms_norm_act(x, gamma, eps, act, torch.empty_like(x) if out is None else out)
    if (x.device.type == "cpu" and is_ndhwc(x) and x.dtype in (torch.bfloat16, torch.float16)
            and not torch.compiler.is_compiling()):
        return _cpu_channels_last_rms(x, gamma, eps, act, torch.empty_like(x) if out is None else out)
    norm = _channel_norm(x)
    inv = (math.sqrt(c) / norm.clamp_min(eps)).to(x.dtype)
    if torch.compiler.is_compiling():
        return _traced_act(x * inv * gamma.view((1, c) + (1,) * (x.dim() - 2)).to(x.dtype), act, out)
    if out is None:
        out = torch.empty_like(x)
    torch.mul(x, inv, out=out)
    out.mul_(gamma.view((1, c) + (1,) * (x.dim() - 2)).to(x.dtype))
    if act:
        F.silu(out, inplace=True)
    return out


def _cpu_channels_last_rms(x: torch.Tensor, gamma: torch.Tensor, eps: float, act: bool,
                           out: torch.Tensor) -> torch.Tensor:
    """`rms_norm_act` of half-precision NDHWC x (B,C,T,H,W) on the CPU: blocks of pixel rows (rows*W, C)
    converted to float32, each read once and normalised along its contiguous channels in cache, rounded
    once; the whole-tensor path takes four passes over memory (the norm, two scalings, the SiLU), so bf16
    gains most at high resolution; float32 keeps the whole-tensor path, as fast there."""
    c = x.shape[1]
    gain = gamma.reshape(c).float() * math.sqrt(c)

    def normalise(i, f, work):
        work.div_(torch.linalg.vector_norm(work, dim=-1, keepdim=True).clamp_min_(eps)).mul_(gain)

    return _channels_last_map(x, out, act, normalise)


def pixel_norm_act(x: torch.Tensor, eps: float = 1e-8, scale: torch.Tensor | None = None,
                   shift: torch.Tensor | None = None, act: bool = True, out: torch.Tensor | None = None) -> torch.Tensor:
    """LTX's per-position RMS norm over the channels (dim 1) of x (B,C,...), then an optional per-channel
    affine and SiLU: act(x / sqrt(mean_C(x^2) + eps) * (1 + scale) + shift), `scale` and `shift` of C
    values (the decoder's timestep conditioning) or None. Unlike `rms_norm_act`, eps is added to the
    mean square (upstream's PixelNorm). The statistics are float32."""
    c = x.shape[1]
    gain = None if scale is None else (1 + scale.float()).reshape(c)
    bias = None if shift is None else shift.float().reshape(c)
    if (x.device.type == "cpu" and is_ndhwc(x) and x.dtype in (torch.bfloat16, torch.float16)
            and not torch.compiler.is_compiling()):
        def normalise(i, f, work):  # work: float32 (rows, W, C)
            work.mul_(work.square().mean(-1, keepdim=True).add_(eps).rsqrt_())
            if gain is not None:
                work.mul_(gain)
            if bias is not None:
                work.add_(bias)

        return _channels_last_map(x, torch.empty_like(x) if out is None else out, act, normalise)
    norm = _channel_norm(x)  # float32 sqrt(sum_C x^2)
    inv = (norm * norm).div_(c).add_(eps).rsqrt_().to(x.dtype)
    per_channel = (1, c) + (1,) * (x.dim() - 2)
    if torch.compiler.is_compiling():
        y = x * inv
        y = y if gain is None else y * gain.view(per_channel).to(x.dtype)
        return _traced_act(y if bias is None else y + bias.view(per_channel).to(x.dtype), act, out)
    if out is None:
        out = torch.empty_like(x)
    torch.mul(x, inv, out=out)
    if gain is not None:
        out.mul_(gain.view(per_channel).to(x.dtype))
    if bias is not None:
        out.add_(bias.view(per_channel).to(x.dtype))
    if act:
        F.silu(out, inplace=True)
    return out
