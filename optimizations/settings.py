"""Switches between the optimized and the straightforward implementation of each block.

Every optimization StreamVAE applies inside the network has a flag here, so the straightforward
path (what the upstream reference code does) can be timed against it side by side and tests can
prove both give the same numbers. A model carries one `Optimizations` instance; the engine hands it
to every block through the execution context.
"""
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Optimizations:
    # Norm + SiLU computed in one step (fp32 statistics) and written straight into the input buffer
    # of the causal conv that consumes it, instead of norm -> new tensor -> SiLU -> new tensor -> cat.
    fused_norm_act: bool = True
    # Causal convs build their input as [cached frames | new frames] in one preallocated buffer
    # (zero or replicate head, asymmetric spatial pads) instead of torch.cat + F.pad copies.
    buffered_causal_pad: bool = True
    # Mid-block attention through F.scaled_dot_product_attention instead of an explicit
    # softmax(q k^T) v that materialises the (tokens x tokens) matrix.
    sdpa_attention: bool = True
    # Upsamplers: pixel shuffle as one view/permute copy written into the next conv's buffer, with the
    # first-chunk frame drop done by indexing; the channel-expanding 1x1 conv runs a few frames at a
    # time so its 4-8x wider output never exists for the whole chunk.
    native_pixel_shuffle: bool = True
    # Residual adds written in place into the freshly computed branch (autograd is off).
    inplace_residual: bool = True

    @classmethod
    def straightforward(cls) -> "Optimizations":
        """Every switch off: the reference behaviour, used as the baseline in benchmarks and tests."""
        return cls(**{f.name: False for f in fields(cls)})

    def with_(self, **changes) -> "Optimizations":
        return replace(self, **changes)
