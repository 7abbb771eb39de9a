"""Triton kernels for the fused norm + SiLU steps (CUDA, ROCm); the torch versions in norm_act.py are
the fallback and the reference.

- Per-frame GroupNorm statistics: one program per (frame's group, block of pixels) computes the
  block's mean and sum of squared deviations (M2) in two passes over the block (the second pass
  reads what the first left in cache), so a large mean never cancels the variance away as
  E[x^2] - E[x]^2 would. The blocks are merged in float64 on the host (Chan's formula).
- Apply: y = (x - mean) * scale + shift (+ SiLU), written to any strided output (a causal conv's
  input buffer). Subtracting the mean first keeps it exact where |mean| >> std; the folded
  x * scale + (shift - mean * scale) would round both terms at the size of the mean.
- RMS norm over channels: one program per block of pixels of one frame walks the channels twice
  (sum of squares, then the scaled write), float32 accumulation.

Each kernel has a channels-last twin for NDHWC activations (`activation_layout.is_ndhwc`): a program holds a
[pixels, channels] tile, so a warp reads runs of contiguous channels instead of gathering one channel
of many pixels with a stride of C; the RMS norm then reads x once (its channel-plane kernel twice).

Inputs and outputs are B,C,T,H,W with arbitrary strides (tiles and buffer views are not contiguous).
Every address is computed in 64-bit: video activations pass 2^31 elements (SeedVR2 at 1080p), where
int32 program ids times strides would wrap. The kernels also run under TRITON_INTERPRET=1 on the CPU,
which is how CI checks them. Channel loop bounds are compile-time constants (a model has a handful of
widths), which also keeps them plain Python ints in the interpreter.

Whether a kernel runs on a device at all is decided by its first-use check there (kernel_check.py).
"""
import contextlib

import torch

from .activation_layout import is_ndhwc

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton is optional: the torch kernels are used instead
    triton = None

BLOCK = 1024
# Elements of a channels-last program's [pixels, channels] tile (channels rounded up to a power of 2).
TILE_ELEMENTS = 4096


if triton is not None:

    @triton.jit
    def _frame_offsets(row, blk, T, W, BLOCK: tl.constexpr):
        """(t, h, w) of a block of pixels of frame row % T, all int64."""
        t = row % T
        offs = blk * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        return t, offs // W, offs % W, offs

    @triton.jit
    def _gn_partial_kernel(x_ptr, count_ptr, shift_ptr, delta_ptr, m2_ptr, T, H, W, G, CPG: tl.constexpr, n_blocks,
                           sxb, sxc, sxt, sxh, sxw, BLOCK: tl.constexpr):
        # program (row = b*G*T + g*T + t, block of pixels): count, mean (as shift + delta: their float32
        # sum would round at the size of the mean) and M2 of the group's channels
        row = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1).to(tl.int64)
        b = row // (G * T)
        g = (row // T) % G
        t, h, w, offs = _frame_offsets(row, blk, T, W, BLOCK)
        mask = offs < H * W
        base = x_ptr + b * sxb + g * CPG * sxc + t * sxt + h * sxh + w * sxw
        # channel pointers advance by the stride: a loop index times a stride would be int32
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        ptr = base
        for c in range(0, CPG):
            acc += tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
            ptr += sxc
        n = tl.sum(mask.to(tl.float32), axis=0) * CPG
        shift = tl.sum(acc, axis=0) / n
        # second pass around the approximate block mean: the residual sum corrects it exactly
        d1 = tl.zeros([BLOCK], dtype=tl.float32)
        d2 = tl.zeros([BLOCK], dtype=tl.float32)
        ptr = base
        for c in range(0, CPG):
            v = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
            d = tl.where(mask, v - shift, 0.0)
            d1 += d
            d2 += d * d
            ptr += sxc
        s1 = tl.sum(d1, axis=0)
        slot = row * n_blocks + blk
        tl.store(count_ptr + slot, n)
        tl.store(shift_ptr + slot, shift)
        tl.store(delta_ptr + slot, s1 / n)
        tl.store(m2_ptr + slot, tl.maximum(tl.sum(d2, axis=0) - s1 * s1 / n, 0.0))

    @triton.jit
    def _center_scale_act_kernel(x_ptr, out_ptr, mean_ptr, scale_ptr, shift_ptr, C, T, H, W,
                                 sxb, sxc, sxt, sxh, sxw, sob, soc, sot, soh, sow,
                                 ACT: tl.constexpr, BLOCK: tl.constexpr):
        # program (row = (b*C + c)*T + t, block of pixels): y = (x - mean[row]) * scale[row] + shift[row]
        row = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1).to(tl.int64)
        b = row // (C * T)
        c = (row // T) % C
        t, h, w, offs = _frame_offsets(row, blk, T, W, BLOCK)
        mask = offs < H * W
        v = tl.load(x_ptr + b * sxb + c * sxc + t * sxt + h * sxh + w * sxw, mask=mask, other=0.0).to(tl.float32)
        y = (v - tl.load(mean_ptr + row)) * tl.load(scale_ptr + row) + tl.load(shift_ptr + row)
        if ACT:
            y = y * tl.sigmoid(y)
        tl.store(out_ptr + b * sob + c * soc + t * sot + h * soh + w * sow, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rms_act_kernel(x_ptr, out_ptr, gamma_ptr, C: tl.constexpr, T, H, W, scale, eps,
                        sxb, sxc, sxt, sxh, sxw, sob, soc, sot, soh, sow,
                        ACT: tl.constexpr, BLOCK: tl.constexpr):
        # program (row = b*T + t, block of pixels): norm over the C channels of each pixel
        row = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1).to(tl.int64)
        b = row // T
        t, h, w, offs = _frame_offsets(row, blk, T, W, BLOCK)
        mask = offs < H * W
        base_x = x_ptr + b * sxb + t * sxt + h * sxh + w * sxw
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        ptr = base_x
        for c in range(0, C):  # pointers advance by the stride (a loop index times a stride is int32)
            v = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
            acc += v * v
            ptr += sxc
        inv = scale / tl.maximum(tl.sqrt(acc), eps)
        ptr = base_x
        ptr_o = out_ptr + b * sob + t * sot + h * soh + w * sow
        for c in range(0, C):
            v = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
            y = v * inv * tl.load(gamma_ptr + c).to(tl.float32)
            if ACT:
                y = y * tl.sigmoid(y)
            tl.store(ptr_o, y.to(out_ptr.dtype.element_ty), mask=mask)
            ptr += sxc
            ptr_o += soc


    # --- channels-last (NDHWC) variants: a program holds a [pixels, channels] tile, so a warp reads
    # whole runs of contiguous channels (the kernels above read one channel of many pixels, which in
    # NDHWC is a gather with a stride of C elements).

    @triton.jit
    def _pixel_channel_tile(row, blk, T, H, W, C, sb, sc, st, sh, sw, BLOCK_P: tl.constexpr, C_P2: tl.constexpr):
        """(offsets [BLOCK_P, C_P2], mask) of pixels blk*BLOCK_P.. of frame row % T of batch row // T."""
        b = row // T
        t = row % T
        p = blk * BLOCK_P + tl.arange(0, BLOCK_P).to(tl.int64)
        c = tl.arange(0, C_P2).to(tl.int64)
        offs = b * sb + t * st + (p // W)[:, None] * sh + (p % W)[:, None] * sw + c[None, :] * sc
        return offs, (p < H * W)[:, None] & (c < C)[None, :]

    @triton.jit
    def _group_tile(x_ptr, b, t, first, H, W, sxb, sxc, sxt, sxh, sxw, G: tl.constexpr, CPG: tl.constexpr,
                    G_P2: tl.constexpr, CPG_P2: tl.constexpr, BLOCK_P: tl.constexpr):
        """(values float32, mask) of the [groups, channels of a group, pixels] tile of pixels first.. of
        frame t of batch b (the channels are what is contiguous in memory, whatever the axis order; the
        pixels last make the long sums tree-shaped in the interpreter too, as they are on the GPU)."""
        p = first + tl.arange(0, BLOCK_P).to(tl.int64)
        g = tl.arange(0, G_P2).to(tl.int64)
        c = tl.arange(0, CPG_P2).to(tl.int64)
        chan = g[:, None, None] * CPG + c[None, :, None]
        offs = b * sxb + t * sxt + (p // W)[None, None, :] * sxh + (p % W)[None, None, :] * sxw + chan * sxc
        mask = (g < G)[:, None, None] & (c < CPG)[None, :, None] & (p < H * W)[None, None, :]
        return tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32), mask

    @triton.jit
    def _gn_partial_cl_kernel(x_ptr, count_ptr, shift_ptr, delta_ptr, m2_ptr, T, H, W, n_blocks,
                              sxb, sxc, sxt, sxh, sxw, G: tl.constexpr, CPG: tl.constexpr, G_P2: tl.constexpr,
                              CPG_P2: tl.constexpr, BLOCK_P: tl.constexpr, STEPS: tl.constexpr):
        # program (block of STEPS * BLOCK_P pixels, row = b*T + t): per group, the block's count, mean
        # (shift + delta) and M2, in two passes over the block's tiles as the channel-plane kernel does:
        # the first gives the approximate mean (the shift), the second the sums of the deviations from it
        # (which correct it exactly) and of their squares; the second reads what the first left in cache.
        blk = tl.program_id(0).to(tl.int64)
        row = tl.program_id(1).to(tl.int64)
        b = row // T
        t = row % T
        first = blk * STEPS * BLOCK_P
        n = tl.zeros([G_P2], dtype=tl.float32)
        total = tl.zeros([G_P2], dtype=tl.float32)
        for i in range(0, STEPS):
            v, mask = _group_tile(x_ptr, b, t, first + i * BLOCK_P, H, W, sxb, sxc, sxt, sxh, sxw, G, CPG, G_P2,
                                  CPG_P2, BLOCK_P)
            n += tl.sum(tl.sum(mask.to(tl.float32), axis=2), axis=1)
            total += tl.sum(tl.sum(v, axis=2), axis=1)
        shift = total / tl.maximum(n, 1.0)
        s1 = tl.zeros([G_P2], dtype=tl.float32)
        s2 = tl.zeros([G_P2], dtype=tl.float32)
        for i in range(0, STEPS):
            v, mask = _group_tile(x_ptr, b, t, first + i * BLOCK_P, H, W, sxb, sxc, sxt, sxh, sxw, G, CPG, G_P2,
                                  CPG_P2, BLOCK_P)
            d = tl.where(mask, v - shift[:, None, None], 0.0)
            s1 += tl.sum(tl.sum(d, axis=2), axis=1)
            s2 += tl.sum(tl.sum(d * d, axis=2), axis=1)
        g = tl.arange(0, G_P2).to(tl.int64)
        slot = (row * n_blocks + blk) * G + g
        keep = g < G
        tl.store(count_ptr + slot, n, mask=keep)
        tl.store(shift_ptr + slot, shift, mask=keep)
        tl.store(delta_ptr + slot, s1 / tl.maximum(n, 1.0), mask=keep)
        tl.store(m2_ptr + slot, tl.maximum(s2 - s1 * s1 / tl.maximum(n, 1.0), 0.0), mask=keep)

    @triton.jit
    def _center_scale_act_cl_kernel(x_ptr, out_ptr, mean_ptr, scale_ptr, shift_ptr, C, T, H, W,
                                    sxb, sxc, sxt, sxh, sxw, sob, soc, sot, soh, sow,
                                    ACT: tl.constexpr, C_P2: tl.constexpr, BLOCK_P: tl.constexpr):
        # program (block of pixels, row = b*T + t): y = (x - mean) * scale + shift per channel, all channels
        blk = tl.program_id(0).to(tl.int64)  # the many blocks on axis 0 (axis 1 takes at most 65535)
        row = tl.program_id(1).to(tl.int64)
        x_offs, mask = _pixel_channel_tile(row, blk, T, H, W, C, sxb, sxc, sxt, sxh, sxw, BLOCK_P, C_P2)
        o_offs, _ = _pixel_channel_tile(row, blk, T, H, W, C, sob, soc, sot, soh, sow, BLOCK_P, C_P2)
        c = tl.arange(0, C_P2).to(tl.int64)
        at = ((row // T) * C + c) * T + row % T  # index of (b, c, t) in the B,C,T statistics
        keep = c < C
        mean = tl.load(mean_ptr + at, mask=keep, other=0.0)
        scale = tl.load(scale_ptr + at, mask=keep, other=0.0)
        shift = tl.load(shift_ptr + at, mask=keep, other=0.0)
        v = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
        y = (v - mean[None, :]) * scale[None, :] + shift[None, :]
        if ACT:
            y = y * tl.sigmoid(y)
        tl.store(out_ptr + o_offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rms_act_cl_kernel(x_ptr, out_ptr, gamma_ptr, C, T, H, W, scale, eps,
                           sxb, sxc, sxt, sxh, sxw, sob, soc, sot, soh, sow,
                           ACT: tl.constexpr, C_P2: tl.constexpr, BLOCK_P: tl.constexpr):
        # program (block of pixels, row = b*T + t): the norm over each pixel's channels, one read of x
        blk = tl.program_id(0).to(tl.int64)  # the many blocks on axis 0 (axis 1 takes at most 65535)
        row = tl.program_id(1).to(tl.int64)
        x_offs, mask = _pixel_channel_tile(row, blk, T, H, W, C, sxb, sxc, sxt, sxh, sxw, BLOCK_P, C_P2)
        o_offs, _ = _pixel_channel_tile(row, blk, T, H, W, C, sob, soc, sot, soh, sow, BLOCK_P, C_P2)
        c = tl.arange(0, C_P2)
        gamma = tl.load(gamma_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        v = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
        inv = scale / tl.maximum(tl.sqrt(tl.sum(v * v, axis=1)), eps)  # [BLOCK_P]
        y = v * inv[:, None] * gamma[None, :]
        if ACT:
            y = y * tl.sigmoid(y)
        tl.store(out_ptr + o_offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _on_device(x: torch.Tensor):
    """Launch on x's GPU: Triton uses the current CUDA device, which need not be x's (cuda:1)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def group_norm_moments(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-frame group (mean, var) of x (B,C,T,H,W) as float32 B,G,T.

    Per-block (count, mean, M2) from the kernel, merged in float64: mean = sum(n_i m_i) / N,
    M2 = sum(M2_i) + sum(n_i (m_i - mean)^2), var = M2 / N.
    """
    b, c, t, h, w = x.shape
    if is_ndhwc(x):
        counts, shifts, deltas, m2s = _channels_last_partials(x, groups)
    else:
        n_blocks = triton.cdiv(h * w, BLOCK)
        counts = torch.empty((b * groups * t, n_blocks), device=x.device, dtype=torch.float32)
        shifts, deltas, m2s = torch.empty_like(counts), torch.empty_like(counts), torch.empty_like(counts)
        with _on_device(x):
            _gn_partial_kernel[(b * groups * t, n_blocks)](x, counts, shifts, deltas, m2s, t, h, w, groups,
                                                           c // groups, n_blocks, *x.stride(), BLOCK=BLOCK)
    counts, means, m2s = counts.double(), shifts.double() + deltas.double(), m2s.double()
    total = counts.sum(1, keepdim=True)
    mean = (counts * means).sum(1, keepdim=True) / total
    var = (m2s.sum(1, keepdim=True) + (counts * (means - mean) ** 2).sum(1, keepdim=True)) / total
    return mean.float().view(b, groups, t), var.float().view(b, groups, t)


def _pixels_per_program(channels: int) -> int:
    """Pixels of a channels-last program's [pixels, channels] tile: about TILE_ELEMENTS in all."""
    return max(1, TILE_ELEMENTS // triton.next_power_of_2(channels))


def channels_last_launch(shape) -> tuple[tuple[int, int], int, int]:
    """(grid, BLOCK_P, C_P2) of the channels-last apply and RMS kernels for an input of `shape`
    (B,C,T,H,W): one program per tile of BLOCK_P pixels x C_P2 channels (C rounded up to a power of 2),
    the pixel blocks on grid axis 0 (axis 1 takes at most 65535; 1080p at 512 channels has 259200)."""
    b, c, t, h, w = shape
    pixels = _pixels_per_program(c)
    return (triton.cdiv(h * w, pixels), b * t), pixels, triton.next_power_of_2(c)


def _channels_last_partials(x: torch.Tensor, groups: int):
    """The per-block (count, shift, delta, M2) of NDHWC x, each float32 (B*G*T, blocks) as the
    channel-planes kernel lays them out; a block is BLOCK pixels (several tiles), as there."""
    b, c, t, h, w = x.shape
    pixels = _pixels_per_program(c)
    steps = max(1, BLOCK // pixels)
    n_blocks = triton.cdiv(h * w, pixels * steps)
    parts = torch.empty((4, b * t, n_blocks, groups), device=x.device, dtype=torch.float32)
    with _on_device(x):
        _gn_partial_cl_kernel[(n_blocks, b * t)](x, *parts, t, h, w, n_blocks, *x.stride(), G=groups, CPG=c // groups,
                                                 G_P2=triton.next_power_of_2(groups),
                                                 CPG_P2=triton.next_power_of_2(c // groups), BLOCK_P=pixels,
                                                 STEPS=steps)
    # 4, (b t), blocks, g -> 4, (b g t), blocks
    return parts.view(4, b, t, n_blocks, groups).permute(0, 1, 4, 2, 3).reshape(4, b * groups * t, n_blocks)


def apply_terms(mean: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(centre, scale, shift), each B,C,T in the statistics' dtype, such that GroupNorm with statistics
    (mean, rstd) B,G,T and the affine (weight, bias) of C channels is (x - centre) * scale + shift."""
    b, groups, t = mean.shape
    c = weight.numel()
    per_group = c // groups
    scale = (rstd.view(b, groups, 1, t) * weight.to(rstd.dtype).view(1, groups, per_group, 1)).reshape(b, c, t)
    centre = mean.view(b, groups, 1, t).expand(b, groups, per_group, t).reshape(b, c, t)
    shift = bias.to(rstd.dtype).view(1, c, 1).expand(b, c, t)
    return centre, scale, shift


def center_scale_act(x: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, act: bool,
                     out: torch.Tensor) -> torch.Tensor:
    """out = act((x - mean) * scale + shift) with mean, scale, shift of shape B,C,T (float32)."""
    b, c, t, h, w = x.shape
    if is_ndhwc(x):
        grid, pixels, c_p2 = channels_last_launch(x.shape)
        with _on_device(x):
            _center_scale_act_cl_kernel[grid](x, out, mean.contiguous(), scale.contiguous(), shift.contiguous(), c, t, h,
                                              w, *x.stride(), *out.stride(), ACT=act, C_P2=c_p2, BLOCK_P=pixels)
        return out
    grid = (b * c * t, triton.cdiv(h * w, BLOCK))
    with _on_device(x):
        _center_scale_act_kernel[grid](x, out, mean.contiguous(), scale.contiguous(), shift.contiguous(), c, t, h, w,
                                       *x.stride(), *out.stride(), ACT=act, BLOCK=BLOCK)
    return out


def rms_norm_act(x: torch.Tensor, gamma: torch.Tensor, eps: float, act: bool, out: torch.Tensor) -> torch.Tensor:
    """out = act(x / max(||x||_C, eps) * sqrt(C) * gamma) for x B,C,T,H,W."""
    b, c, t, h, w = x.shape
    if is_ndhwc(x):
        grid, pixels, c_p2 = channels_last_launch(x.shape)
        with _on_device(x):
            _rms_act_cl_kernel[grid](x, out, gamma.reshape(-1).contiguous(), c, t, h, w, float(c) ** 0.5, eps,
                                     *x.stride(), *out.stride(), ACT=act, C_P2=c_p2, BLOCK_P=pixels)
        return out
    grid = (b * t, triton.cdiv(h * w, BLOCK))
    with _on_device(x):
        _rms_act_kernel[grid](x, out, gamma.reshape(-1).contiguous(), c, t, h, w, float(c) ** 0.5, eps,
                              *x.stride(), *out.stride(), ACT=act, BLOCK=BLOCK)
    return out
