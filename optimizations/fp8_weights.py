"""fp8 weight storage: conv and linear weights kept as float8 between runs, dequantized for one run.

A video VAE's weights sit in memory (or in the offload pool) far longer than they compute. Stored as
float8 e4m3 with one float32 scale per output channel (amax / 448), they take a quarter of their
float32 size and half of bf16. `materialized()` dequantizes them into the compute dtype for the
duration of one encode/decode and frees the copies afterwards:

    store = Fp8WeightStore(model)          # weights now float8 + scales; the parameters are empty
    with store.materialized():
        y = model.decode(z)                # runs in the model's original dtype

The compute is unchanged (there are no fp8 conv kernels on CPUs, and cuDNN has none for conv3d);
what changes is the resident weight memory, the one-off dequantization per run, and the rounding of
the weights to 3 mantissa bits. bench/bench_vae.py measures all three (the "fp8 weight storage" row).
"""
import contextlib

import torch
import torch.nn as nn

FP8 = getattr(torch, "float8_e4m3fn", None)
_WEIGHTED = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def quantize(weight: torch.Tensor, fmt=FP8) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): q float8 of weight's shape, scale float32 (Cout, 1, ...) with q * scale ~ weight."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=tuple(range(1, w.dim())), keepdim=True)
    scale = amax.clamp_min(torch.finfo(torch.float32).tiny) / torch.finfo(fmt).max
    return (w / scale).to(fmt), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


class Fp8WeightStore:
    """The weights of every conv/linear module of `module`, kept as float8 + per-channel scales.

    On construction each weight is quantized and its parameter emptied (numel 0); `materialized()`
    fills the parameters with the dequantized weights (original dtype, device and memory format)
    and empties them again on exit. The parameters stay the same objects, so references held by
    the model (and the Winograd cache, which follows their version counters) remain valid.
    """

    def __init__(self, module: nn.Module, fmt=FP8):
        if fmt is None:
            raise RuntimeError(f"torch {torch.__version__} has no float8 dtype")
        self._entries = []  # (parameter, q, scale, dtype, memory format)
        with torch.no_grad():
            for sub in module.modules():
                if isinstance(sub, _WEIGHTED) and sub.weight is not None:
                    p = sub.weight
                    layout = torch.channels_last_3d if p.dim() == 5 and not p.is_contiguous() else torch.contiguous_format
                    q, scale = quantize(p, fmt)
                    self._entries.append((p, q, scale, p.dtype, layout))
                    p.data = p.data.new_empty(0)
        self._active = False

    @property
    def stored_bytes(self) -> int:
        """Bytes the stored weights take (float8 values + float32 scales)."""
        return sum(q.nbytes + scale.nbytes for _, q, scale, _, _ in self._entries)

    def original_bytes(self) -> int:
        """Bytes the same weights took in their original dtype."""
        return sum(q.numel() * torch.empty(0, dtype=dtype).element_size() for _, q, _, dtype, _ in self._entries)

    @contextlib.contextmanager
    def materialized(self):
        """Dequantized weights in the parameters for the duration of the block (not re-entrant)."""
        if self._active:
            raise RuntimeError("Fp8WeightStore.materialized() is already active")
        self._active = True
        try:
            with torch.no_grad():
                for p, q, scale, dtype, layout in self._entries:
                    p.data = torch.empty(q.shape, dtype=dtype, device=q.device).contiguous(memory_format=layout)
                    p.copy_(dequantize(q, scale, dtype))  # in place: moves the version counter
            yield
        finally:
            for p, *_ in self._entries:
                p.data = p.data.new_empty(0)
            self._active = False
