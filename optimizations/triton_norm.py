"""Triton kernels for the fused norm + SiLU steps (CUDA); the torch versions in norm_act.py are the
fallback and the reference.

- Per-frame GroupNorm: a partial-statistics kernel (sum and sum of squares of one frame's group over
  a block of pixels, float32) whose partials are combined in float64, then one pass that applies
  x * scale + shift and SiLU, writing to any strided output (e.g. a causal conv's input buffer).
- RMS norm over channels: one program per block of pixels of one frame walks the channels twice
  (sum of squares, then the scaled write), float32 accumulation.

Inputs and outputs are B,C,T,H,W with arbitrary strides (tiles and buffer views are not contiguous).
The kernels also run under TRITON_INTERPRET=1 on the CPU, which is how CI checks them. Channel loop
bounds are compile-time constants (a model has a handful of widths), which also keeps them plain
Python ints in the interpreter.
"""
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton is optional: the torch kernels are used instead
    triton = None

BLOCK = 1024


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _gn_partial_kernel(x_ptr, sum_ptr, sq_ptr, T, H, W, G, CPG: tl.constexpr, n_blocks,
                           sxb, sxc, sxt, sxh, sxw, BLOCK: tl.constexpr):
        # program (row = b*G*T + g*T + t, block of pixels): sums over the group's channels
        row = tl.program_id(0)
        blk = tl.program_id(1)
        b = row // (G * T)
        g = (row // T) % G
        t = row % T
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < H * W
        h = offs // W
        w = offs % W
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK], dtype=tl.float32)
        for c in range(0, CPG):
            ptr = x_ptr + b * sxb + (g * CPG + c) * sxc + t * sxt + h * sxh + w * sxw
            v = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
            acc += v
            acc2 += v * v
        tl.store(sum_ptr + row * n_blocks + blk, tl.sum(acc, axis=0))
        tl.store(sq_ptr + row * n_blocks + blk, tl.sum(acc2, axis=0))

    @triton.jit
    def _scale_shift_act_kernel(x_ptr, out_ptr, scale_ptr, shift_ptr, C, T, H, W,
                                sxb, sxc, sxt, sxh, sxw, sob, soc, sot, soh, sow,
                                ACT: tl.constexpr, BLOCK: tl.constexpr):
        # program (row = (b*C + c)*T + t, block of pixels): y = x * scale[row] + shift[row]
        row = tl.program_id(0)
        blk = tl.program_id(1)
        b = row // (C * T)
        c = (row // T) % C
        t = row % T
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < H * W
        h = offs // W
        w = offs % W
        v = tl.load(x_ptr + b * sxb + c * sxc + t * sxt + h * sxh + w * sxw, mask=mask, other=0.0).to(tl.float32)
        y = v * tl.load(scale_ptr + row) + tl.load(shift_ptr + row)
        if ACT:
            y = y * tl.sigmoid(y)
        tl.store(out_ptr + b * sob + c * soc + t * sot + h * soh + w * sow, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rms_act_kernel(x_ptr, out_ptr, gamma_ptr, C: tl.constexpr, T, H, W, scale, eps,
                        sxb, sxc, sxt, sxh, sxw, sob, soc, sot, soh, sow,
                        ACT: tl.constexpr, BLOCK: tl.constexpr):
        # program (row = b*T + t, block of pixels): norm over the C channels of each pixel
        row = tl.program_id(0)
        blk = tl.program_id(1)
        b = row // T
        t = row % T
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < H * W
        h = offs // W
        w = offs % W
        base_x = x_ptr + b * sxb + t * sxt + h * sxh + w * sxw
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for c in range(0, C):
            v = tl.load(base_x + c * sxc, mask=mask, other=0.0).to(tl.float32)
            acc += v * v
        inv = scale / tl.maximum(tl.sqrt(acc), eps)
        base_o = out_ptr + b * sob + t * sot + h * soh + w * sow
        for c in range(0, C):
            v = tl.load(base_x + c * sxc, mask=mask, other=0.0).to(tl.float32)
            y = v * inv * tl.load(gamma_ptr + c).to(tl.float32)
            if ACT:
                y = y * tl.sigmoid(y)
            tl.store(base_o + c * soc, y.to(out_ptr.dtype.element_ty), mask=mask)


def group_norm_moments(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-frame group (mean, var) of x (B,C,T,H,W) as float32 B,G,T (float32 partials, float64 sum)."""
    b, c, t, h, w = x.shape
    n_blocks = triton.cdiv(h * w, BLOCK)
    sums = torch.empty((b * groups * t, n_blocks), device=x.device, dtype=torch.float32)
    squares = torch.empty_like(sums)
    _gn_partial_kernel[(b * groups * t, n_blocks)](x, sums, squares, t, h, w, groups, c // groups, n_blocks, *x.stride(), BLOCK=BLOCK)
    count = (c // groups) * h * w
    mean = sums.double().sum(1) / count
    var = (squares.double().sum(1) / count - mean * mean).clamp_min(0)
    return mean.float().view(b, groups, t), var.float().view(b, groups, t)


def scale_shift_act(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, act: bool, out: torch.Tensor) -> torch.Tensor:
    """out = act(x * scale + shift) with scale, shift of shape B,C,T (float32)."""
    b, c, t, h, w = x.shape
    grid = (b * c * t, triton.cdiv(h * w, BLOCK))
    _scale_shift_act_kernel[grid](x, out, scale.contiguous(), shift.contiguous(), c, t, h, w, *x.stride(), *out.stride(),
                                  ACT=act, BLOCK=BLOCK)
    return out


def rms_norm_act(x: torch.Tensor, gamma: torch.Tensor, eps: float, act: bool, out: torch.Tensor) -> torch.Tensor:
    """out = act(x / max(||x||_C, eps) * sqrt(C) * gamma) for x B,C,T,H,W."""
    b, c, t, h, w = x.shape
    grid = (b * t, triton.cdiv(h * w, BLOCK))
    _rms_act_kernel[grid](x, out, gamma.reshape(-1).contiguous(), c, t, h, w, float(c) ** 0.5, eps,
                          *x.stride(), *out.stride(), ACT=act, BLOCK=BLOCK)
    return out
