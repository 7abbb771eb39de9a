"""The two settings nodes that feed StreamVAE Load VAE: torch.compile and GPU backend switches."""
from comfy_api.latest import io

from ..vae.optimizations import CompileSettings
from ..vae.optimizations.attention import KERNELS
from ..vae.optimizations.compile import MODES
from .model import GpuOptions
from .types import COMPILE, GPU_OPTIONS

DEFAULTS = GpuOptions()  # what Load VAE runs with when the GPU Optimizations node is unconnected
COMPILE_BACKENDS = ("inductor", "cudagraphs", "aot_eager", "eager")


class TorchCompileSettings(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StreamVAETorchCompileSettings",
            display_name="StreamVAE Torch Compile Settings",
            category="StreamVAE",
            description="torch.compile for the VAE's encoder/decoder blocks: one graph per block, compiled for the "
                        "first chunk and for the chunks after it (and a shorter last chunk), per frame size. Exact-tile "
                        "steps and steps with offloaded caches run eagerly (the run's notes say so). Where "
                        "inductor/Triton cannot run (e.g. Windows without triton-windows) the VAE runs eagerly and one "
                        "warning says why. Connect to StreamVAE Load VAE.",
            inputs=[
                io.Combo.Input("backend", options=list(COMPILE_BACKENDS), default="inductor", tooltip=(
                    "inductor = generated Triton (GPU) / C++ (CPU) kernels, the fast one; cudagraphs = replay CUDA "
                    "graphs without kernel generation; aot_eager / eager = trace only, for debugging.")),
                io.Combo.Input("mode", options=list(MODES), default="default", tooltip=(
                    "inductor mode. default = quick compile; max-autotune = benchmark kernels (minutes of compile, "
                    "fastest); -no-cudagraphs skips CUDA graphs; reduce-overhead = CUDA graphs, more memory.")),
                io.Boolean.Input("fullgraph", default=False, tooltip=(
                    "Require one graph per block; a block with a graph break then falls back to eager. Off lets "
                    "dynamo split blocks at graph breaks (recommended).")),
                io.Boolean.Input("dynamic", default=False, tooltip=(
                    "Compile shape-generic graphs. Off = one graph per tile/chunk shape, fastest for fixed tiles; on "
                    "avoids recompiling when sizes keep changing, but is often slower.")),
                io.Int.Input("dynamo_recompile_limit", default=64, min=1, max=4096, step=1, tooltip=(
                    "Graphs allowed per block (each new frame size costs two or three) before that block runs "
                    "eagerly, named in the run's notes; torch._dynamo.config.recompile_limit (formerly "
                    "cache_size_limit).")),
                io.Int.Input("dynamo_cache_size_limit", default=512, min=1, max=65536, step=1, tooltip=(
                    "Compiled graphs kept over all blocks together (torch._dynamo.config.accumulated_recompile_limit); "
                    "raise it when the log says the accumulated limit was hit.")),
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
        return io.Schema(
            node_id="StreamVAEGPUOptimizations",
            display_name="StreamVAE GPU Optimizations",
            category="StreamVAE",
            description="Backend switches for StreamVAE on GPUs (NVIDIA; AMD ROCm where noted). They apply only while "
                        "StreamVAE runs; PyTorch's global settings are restored afterwards. Without this node Load VAE "
                        "runs with these defaults. A switch that has no effect on the device in use says so on Load VAE.",
            inputs=[
                io.Boolean.Input("cudnn_benchmark", default=DEFAULTS.cudnn_benchmark, tooltip=(
                    "cuDNN times its conv algorithms for every new tile shape and keeps the fastest. Faster with "
                    "fixed tiles after a slow first tile; turn off if memory spikes at the start or shapes vary.")),
                io.Boolean.Input("tf32", default=DEFAULTS.tf32, tooltip=(
                    "TensorFloat-32 for float32 matmuls and convs (Ampere and newer): much faster fp32 with a 10-bit "
                    "mantissa. Turn off for bit-exact fp32 comparisons. No effect in bf16/fp16.")),
                io.Boolean.Input("channels_last_3d", default=DEFAULTS.channels_last_3d, tooltip=(
                    "Store conv weights channels-last (NDHWC) so cuDNN picks channels-last kernels: large speed-up "
                    "for conv3d on PyTorch 2.9. Turn off if it is slower on your GPU or PyTorch version.")),
                io.Boolean.Input("fused_norm_silu", default=DEFAULTS.fused_norm_silu, tooltip=(
                    "Norm + SiLU in one pass written straight into the next conv's input buffer (less memory "
                    "traffic). Turn off only to compare against the straightforward path.")),
                io.Combo.Input("attention_backend", options=list(KERNELS), default=DEFAULTS.attention, tooltip=(
                    "Kernel for the mid-block attention (one head of 384-512 channels). auto = PyTorch's choice; "
                    "flash / efficient / cudnn ask for one: a kernel that cannot take this head width (flash: up to "
                    "256, cudnn: up to 128) is replaced by one that can, and Load VAE says which runs; math = the "
                    "reference kernel, slow, for debugging.")),
                io.Boolean.Input("conv3d_workaround", default=DEFAULTS.conv3d_workaround, tooltip=(
                    "PyTorch 2.9/2.10 with cuDNN 9.10-9.14 route half-precision conv3d to a slow path using ~3x the "
                    "memory (ComfyUI#10373); this calls cuDNN directly there. Only acts where that combination is "
                    "detected; turn off if you see wrong colours or crashes in conv layers.")),
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
