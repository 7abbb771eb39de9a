"""The two settings nodes that feed StreamVAE Load VAE: torch.compile and GPU backend switches."""
from comfy_api.latest import io

from ..vae import COMPILE_MODES, CompileSettings
from ..vae.kernels.attention import KERNELS
from . import core_api
from .model import GpuOptions
from .types import COMPILE, GPU_OPTIONS

DEFAULTS = GpuOptions()  # what Load VAE runs with when the GPU Optimizations node is unconnected
COMPILE_BACKENDS = ("inductor", "cudagraphs", "aot_eager", "eager")


class TorchCompileSettings(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return core_api.schema(
            node_id="StreamVAETorchCompileSettings",
            display_name="StreamVAE Torch Compile Settings",
            category="StreamVAE",
            search_aliases=["torch.compile", "compile", "inductor"],
            description="torch.compile for the VAE's blocks, one graph per block; exact-tile steps run eagerly. Where "
                        "inductor/Triton cannot run, the VAE runs eagerly with one warning. Connect to StreamVAE Load "
                        "VAE.",
            inputs=[
                io.Combo.Input("backend", options=list(COMPILE_BACKENDS), default="inductor", tooltip=(
                    "inductor = generated kernels, the fast one; cudagraphs = CUDA graph replay; aot_eager / eager = "
                    "trace only, for debugging.")),
                io.Combo.Input("mode", options=list(COMPILE_MODES), default="default", tooltip=(
                    "inductor mode: default = quick compile; max-autotune = minutes of compile, fastest; "
                    "reduce-overhead = CUDA graphs, more memory.")),
                io.Boolean.Input("fullgraph", default=False, **core_api.advanced(), tooltip=(
                    "Require one graph per block; a block with a graph break then runs eagerly.")),
                io.Boolean.Input("dynamic", default=False, **core_api.advanced(), tooltip=(
                    "Shape-generic graphs: fewer recompiles when sizes keep changing, but often slower. Off = one "
                    "graph per tile and chunk shape.")),
                io.Int.Input("dynamo_recompile_limit", default=64, min=1, max=4096, step=1, **core_api.advanced(),
                             tooltip="Graphs allowed per block before it runs eagerly; each new frame size costs two "
                                     "or three."),
                io.Int.Input("dynamo_cache_size_limit", default=512, min=1, max=65536, step=1, **core_api.advanced(),
                             tooltip="Compiled graphs kept over all blocks together; raise it when the log says the "
                                     "limit was hit."),
            ],
            outputs=[io.Custom(COMPILE).Output(display_name="COMPILE", tooltip="Connect to StreamVAE Load VAE's compile input.")],
        )

    @classmethod
    def execute(cls, backend="inductor", mode="default", fullgraph=False, dynamic=False, dynamo_recompile_limit=64,
                dynamo_cache_size_limit=512) -> io.NodeOutput:
        return io.NodeOutput(CompileSettings(backend=backend, mode=mode, fullgraph=fullgraph, dynamic=dynamic,
                                             recompile_limit=dynamo_recompile_limit,
                                             accumulated_recompile_limit=dynamo_cache_size_limit))


class GPUOptimizations(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return core_api.schema(
            node_id="StreamVAEGPUOptimizations",
            display_name="StreamVAE GPU Optimizations",
            category="StreamVAE",
            search_aliases=["cudnn", "tf32", "GPU settings", "conv3d"],
            description="Backend switches for StreamVAE on GPUs, applied only while it runs. Load VAE without this "
                        "node runs with these defaults. A switch that does nothing on the device says so on Load VAE.",
            inputs=[
                io.Boolean.Input("cudnn_benchmark", default=DEFAULTS.cudnn_benchmark, tooltip=(
                    "cuDNN times its conv algorithms per tile shape and keeps the fastest: faster with fixed tiles, "
                    "slow first call, possible memory spikes.")),
                io.Boolean.Input("tf32", default=DEFAULTS.tf32, tooltip=(
                    "TensorFloat-32 for fp32 matmuls and convs on Ampere and newer: much faster fp32, 10-bit "
                    "mantissa. No effect in bf16/fp16.")),
                io.Boolean.Input("channels_last_3d", default=DEFAULTS.channels_last_3d, **core_api.advanced(), tooltip=(
                    "Activations and weights channels-last (NDHWC) from the first conv to the last, on any device. "
                    "Off: automatic (NDHWC on CUDA and on CPUs).")),
                io.Boolean.Input("fused_norm_silu", default=DEFAULTS.fused_norm_silu, **core_api.advanced(), tooltip=(
                    "Norm + SiLU in one pass, straight into the next conv's input. Off only to compare with the "
                    "straightforward path.")),
                io.Combo.Input("attention_backend", options=list(KERNELS), default=DEFAULTS.attention,
                               **core_api.advanced(), tooltip=(
                    "Mid-block attention kernel. auto = PyTorch's choice; a forced kernel that cannot take this head "
                    "width is replaced, and Load VAE says so.")),
                io.Boolean.Input("conv3d_workaround", default=DEFAULTS.conv3d_workaround, tooltip=(
                    "Where PyTorch 2.9/2.10 with cuDNN 9.10-9.14 would use ~3x the memory for half-precision conv3d, "
                    "call cuDNN directly. Acts only there.")),
            ],
            outputs=[io.Custom(GPU_OPTIONS).Output(display_name="GPU_OPTIONS",
                                                   tooltip="Connect to StreamVAE Load VAE's gpu_options input.")],
        )

    @classmethod
    def execute(cls, cudnn_benchmark=DEFAULTS.cudnn_benchmark, tf32=DEFAULTS.tf32, channels_last_3d=DEFAULTS.channels_last_3d,
                fused_norm_silu=DEFAULTS.fused_norm_silu, attention_backend=DEFAULTS.attention,
                conv3d_workaround=DEFAULTS.conv3d_workaround) -> io.NodeOutput:
        return io.NodeOutput(GpuOptions(cudnn_benchmark, tf32, channels_last_3d, fused_norm_silu, attention_backend,
                                        conv3d_workaround))
