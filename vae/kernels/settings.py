"""The switches of one run: what a user or a fallback may change about how the blocks compute.

Only choices with a reason to exist in the product have a flag: the fused norms the GPU Optimizations
node exposes, Winograd and Triton (each replaced by torch's op where it cannot run), the attention
kernel, the conv kernel choice, the activation layout, the cuDNN workaround, and the exact tiles' rule
for small convs. The optimizations no one needs to turn off (the buffered causal pad, SDPA, the native
pixel shuffle, in-place residuals, the skipped zero-head taps, the sub-pixel upsample conv) are the
blocks' only code; the upstream implementations they are tested against are the references
(diffusers', ComfyUI's and the upstream repositories' models, tests/). An `Optimizations` value belongs to one run, not to a model: the
caller passes it to `vae.encode`/`vae.decode` (`opts=`), and the engine hands it to every block
through the run's `RunContext`; nothing else decides which kernel runs.
"""
from dataclasses import dataclass, fields, replace

from .attention import KERNELS
from .kernel_choice import MODES
from .activation_layout import LAYOUTS


@dataclass(frozen=True)
class Optimizations:
    # Norm + SiLU computed in one step (fp32 statistics) and written straight into the input buffer
    # of the causal conv that consumes it, instead of norm -> new tensor -> SiLU -> new tensor -> cat.
    fused_norm_act: bool = True
    # CPU causal convs with a 3x3 spatial kernel (stride 1, >= 96-128 channels) by Winograd F(4x4, 3x3):
    # 2.25 instead of 9 multiply-adds per output pixel and channel pair, equal up to float32 rounding.
    winograd_conv: bool = True
    # On CUDA, the norm + SiLU steps as Triton kernels (triton_norm.py): statistics in one pass
    # over the group, the scaled SiLU written in a second, into any strided output.
    triton_norm: bool = True
    # Exact tiling: a low-resolution conv whose whole frame is no larger than the largest tile buffer
    # already used runs untiled (same result, no higher peak; small tiles there multiply the time,
    # as the conv streams its weights once per tile).
    whole_frame_small_convs: bool = True
    # Which SDPA kernel the mid-block attention asks for (attention.KERNELS): "auto" lets PyTorch
    # pick; a forced kernel that cannot take the model's head width is replaced (attention.choose).
    attention: str = "auto"
    # Cap of the Winograd filter-transform cache in bytes (filter_cache.filter_cache); None: an eighth of
    # the RAM within 1-4 GiB, or STREAMVAE_WINOGRAD_CACHE_GB.
    winograd_cache_bytes: int | None = None
    # The PyTorch 2.9/2.10 cuDNN regression (backend.py): on an affected NVIDIA install, half-precision
    # conv3d calls cuDNN directly instead of PyTorch's vol2col path (~3x the memory, several times
    # slower). No effect on any other install, device or dtype.
    conv3d_workaround: bool = True
    # How the exact kernel of each conv (and, on GPUs, norm) is picked (kernel_choice.py): "measure" =
    # the candidate measured fastest once per layer shape on this machine, remembered on disk;
    # "defaults" = fixed rules (tuned on an AVX2 CPU), the same kernels on every machine.
    kernel_choice: str = "measure"
    # The memory layout of the activations from the first conv to the last (layout.py): "ndhwc"
    # (channels last: cuDNN's and oneDNN's native conv layout, no conversion around each conv),
    # "ncdhw" (channel planes, upstream's), or "auto" (run.kernel_plan.choose: by device and dtype; on CUDA with
    # measured kernels, the layout whose convs the GPU runs faster).
    activation_layout: str = "auto"

    def __post_init__(self):
        if self.attention not in KERNELS:
            raise ValueError(f"attention must be one of {KERNELS}, got {self.attention!r}")
        if self.kernel_choice not in MODES:
            raise ValueError(f"kernel_choice must be one of {MODES}, got {self.kernel_choice!r}")
        if self.activation_layout not in LAYOUTS:
            raise ValueError(f"activation_layout must be one of {LAYOUTS}, got {self.activation_layout!r}")

    @classmethod
    def straightforward(cls) -> "Optimizations":
        """Every switch off and the default kernels: the reference behaviour, the baseline in benchmarks
        and tests."""
        return cls(kernel_choice="defaults", activation_layout="ncdhw", **{f.name: False for f in fields(cls) if isinstance(f.default, bool)})

    def with_(self, **changes) -> "Optimizations":
        return replace(self, **changes)
