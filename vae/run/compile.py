"""torch.compile for the VAE's blocks, with a clean fallback to eager execution.

Compiling `vae.encode` as a whole would trace the streaming engine (Python loops over chunks and
tiles, cache bookkeeping) and recompile for every clip length. Instead every block of the encoder
and decoder (a resnet/down/up/mid block, the input and output convs) is compiled in place, on its
own, as one graph: per frame size once for the first chunk (no causal caches yet) and once for the
chunks after it, with its own recompile count. Steps the engine must run in Python (exact tiles,
offloaded caches: `RunContext.eager_reason`) run the blocks eagerly, and the report says so.

When the backend cannot work here (inductor needs Triton on GPUs, e.g. Windows without
triton-windows, and a C++ compiler on CPUs) or a block fails to compile on its first call, every
block goes back to eager execution and ONE warning says why; nothing crashes. A failure in the
middle of a clip raises `CompileFallback`, and the engine runs that encode/decode again from its
start, eagerly (`recovery.Restart.RUN`), because the blocks' causal caches may already hold part of
the failed step.

    report = compile_blocks(model, CompileSettings(mode="max-autotune-no-cudagraphs"))
    report.status   # "compiled 16 blocks", "eager (fallback: ...)"
    with dynamo_limits(settings):
        y = vae.decode(model, z)
"""
import contextlib
import functools
import logging
import shutil
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..model.video_vae import VideoVAE

log = logging.getLogger("streamvae")

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Inductor modes that replay CUDA graphs: a graph's outputs live in memory the graph's next replay
# overwrites, so a block's output must be copied before the same block runs again (next tile/chunk).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# What dynamo raises for a block at its recompile limit under `dynamo_limits` (torch 2.7+, and before).
LIMIT_HIT_ERRORS = ("FailOnRecompileLimitHit", "FailOnCacheLimitHit")


@dataclass(frozen=True)
class CompileSettings:
    """Arguments of `torch.compile` for each block, plus dynamo's recompilation limits.

    backend: "inductor" (generates Triton/C++ kernels), "cudagraphs", "eager" (trace only), or a
        backend callable as torch.compile takes it.
    mode: inductor mode, one of `MODES`.
    fullgraph: fail instead of splitting a block at a graph break (then the block runs eager).
    dynamic: None lets dynamo decide, False compiles one graph per input shape (fixed tiles), True
        traces shape-generic graphs.
    recompile_limit: recompilations allowed per block before dynamo runs it eagerly (each tile or
        chunk shape costs one); torch's `recompile_limit` (formerly `cache_size_limit`).
    accumulated_recompile_limit: recompilations allowed over all blocks together.
    """

    backend: str | Callable = "inductor"
    mode: str = "default"
    fullgraph: bool = False
    dynamic: bool | None = False
    recompile_limit: int = 64
    accumulated_recompile_limit: int = 512

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")


@dataclass
class CompileReport:
    """What `compile_blocks` did: `compiled` block names, or why everything runs eagerly; then, as
    blocks run, the blocks that ran past dynamo's recompile limit (`over_limit`, eager from then on)
    and the kinds of steps compiled blocks ran eagerly (`eager_steps`, see RunContext.eager_reason)."""

    compiled: list[str] = field(default_factory=list)
    fallback_reason: str | None = None
    warned: bool = False
    over_limit: list[str] = field(default_factory=list)
    eager_steps: set[str] = field(default_factory=set)

    @property
    def status(self) -> str:
        if self.fallback_reason is not None:
            return f"eager (fallback: {self.fallback_reason})"
        if not self.compiled:
            return "eager"
        text = f"compiled {len(self.compiled)} blocks"
        if self.over_limit:
            text = (f"compiled {len(self.compiled) - len(self.over_limit)} of {len(self.compiled)} blocks "
                    f"({', '.join(self.over_limit)} ran past the recompile limit: eager)")
        if self.eager_steps:
            text += f"; {' and '.join(sorted(self.eager_steps))} ran eagerly"
        return text

    def fall_back(self, reason: str) -> None:
        """Record the reason and warn, once per report."""
        if self.fallback_reason is None:
            self.fallback_reason = reason
        if not self.warned:
            self.warned = True
            log.warning("StreamVAE: torch.compile is not usable here, running eager instead: %s", reason)


# --- availability ----------------------------------------------------------------------------------

def unavailable_reason(settings: CompileSettings, device: torch.device | str) -> str | None:
    """Why `settings.backend` cannot compile for `device` here, or None when it should work.

    Checks what can be checked without compiling; a failure during the first real compilation is
    caught by the blocks themselves.
    """
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    if callable(settings.backend):
        return None
    try:
        from torch import _dynamo
    except Exception as error:  # a broken install: any import error means "cannot compile"
        return f"torch._dynamo cannot be imported ({error})"
    known = set(_dynamo.list_backends(exclude_tags=())) | {"eager", "aot_eager"}
    if settings.backend not in known:
        return f"backend {settings.backend!r} is not registered (available: {', '.join(sorted(known))})"
    device = torch.device(device)
    if settings.backend == "inductor":
        if device.type == "cuda" and not _has_triton():
            return "inductor needs Triton for GPU kernels and it is not installed (on Windows: pip install triton-windows)"
        if device.type == "cpu" and not _has_cpp_compiler():
            return "inductor needs a C++ compiler for CPU kernels and none was found"
    return None


def _has_triton() -> bool:
    try:
        from torch.utils._triton import has_triton
    except ImportError:
        return False
    try:
        return bool(has_triton())
    except Exception:  # has_triton probes the driver; any failure means no usable Triton
        return False


def _has_cpp_compiler() -> bool:
    try:
        from torch._inductor import config

        candidates = config.cpp.cxx
    except Exception:  # inductor missing or broken: nothing to compile with
        return False
    if isinstance(candidates, str):
        candidates = (candidates,)
    return any(c and shutil.which(c) for c in candidates)


# --- compiling -------------------------------------------------------------------------------------

def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules compiled one by one: a VideoVAE's stages that hold weights (the units the engine runs
    a chunk through, `VideoVAE.encode_stages` / `decode_stages`, so a frame-streamed run calls the
    compiled forwards too); for another model, or stages that hold none (an image family's per-image
    wrapper), the children of the encoder/decoder modules, lists expanded."""
    if isinstance(model, VideoVAE):
        names = {module: name for name, module in model.named_modules()}
        found = []
        for stage in [*model.encode_stages(), *model.decode_stages()]:
            module = stage.func if isinstance(stage, functools.partial) else stage
            if isinstance(module, nn.Module) and any(True for _ in module.parameters()):
                root, _, path = names[module].partition(".")
                found.append((f"{type(getattr(model, root)).__name__}.{path}" if path else type(module).__name__, module))
        if found:
            return found
    roots = list(model.encode_modules()) + list(model.decode_modules())
    found = []
    for root in roots:
        children = list(root.named_children()) or [("", root)]
        for name, child in children:
            items = list(child.named_children()) if isinstance(child, nn.ModuleList) else [("", child)]
            for sub, module in items:
                if any(True for _ in module.parameters()):
                    found.append((".".join(p for p in (type(root).__name__, name, sub) if p), module))
    return found


def _eager_forward(module: nn.Module):
    """The module's own forward, ignoring a compiled forward installed on the instance."""
    return type(module).forward.__get__(module)


def _own_code_forward(module: nn.Module):
    """`_eager_forward` as a function with a code object of its own. Dynamo keeps compiled graphs and
    counts recompilations per code object, and all blocks of a class share theirs: without a copy
    the recompile limit, meant per block, would be spent by every block of the class together (a
    Wan2.1 decoder has 14 residual blocks, each seeing a few shapes)."""
    f = type(module).forward
    own = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    own.__kwdefaults__ = f.__kwdefaults__
    return own.__get__(module)


class CompileFallback(RuntimeError):
    """A block failed to compile in the middle of an encode/decode.

    Blocks carry state between chunks (causal caches), and a block that fails after a graph break
    may already have run part of its work, so the block cannot simply be re-run eagerly. Every block
    is eager again when this is raised; the engine runs the whole operation again
    (`recovery.restart_point`).
    """


def uses_cuda_graphs(settings: CompileSettings) -> bool:
    """Whether blocks compiled with `settings` replay CUDA graphs (on a CUDA device)."""
    return settings.backend == "cudagraphs" or (settings.backend == "inductor" and settings.mode in CUDA_GRAPH_MODES)


def _owned(out):
    """A copy of a block's output (tensors, or tuples/lists of them) that no graph replay overwrites."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (tuple, list)):
        return type(out)(_owned(o) for o in out)
    return out


def _guarded(module: nn.Module, name: str, compiled, report: CompileReport, all_blocks: list[nn.Module],
             graphed: bool = False):
    """A forward that runs `compiled`, or the eager forward for steps the engine's RunContext says
    cannot be traced (`eager_reason`). On a compilation failure it reverts every block to eager and
    raises `CompileFallback`; a block past dynamo's recompile limit (nothing of it ran) goes back to
    eager alone and runs now. `graphed`: the compiled block replays CUDA graphs, so each call starts
    a new graph step (`cudagraph_mark_step_begin`: the engine keeps earlier outputs alive, e.g. the
    causal caches and the previous chunk's output) and returns a copy of the output, and what it
    stored in the causal caches is copied too."""
    from .run_context import RunContext

    mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None) if graphed else None
    eager = _eager_forward(module)

    def forward(*args, **kwargs):
        ctx = next((a for a in (*args, *kwargs.values()) if isinstance(a, RunContext)), None)
        if ctx is not None and ctx.eager_reason is not None:
            report.eager_steps.add(ctx.eager_reason)
            return eager(*args, **kwargs)
        try:
            if not graphed:
                return compiled(*args, **kwargs)
            if mark_step is not None:
                mark_step()
            # The causal-cache frames the block stores are graph outputs too: copied like its output.
            with ctx.cache.copying_new_entries() if ctx is not None else contextlib.nullcontext():
                return _owned(compiled(*args, **kwargs))
        except Exception as error:
            if type(error).__name__ in LIMIT_HIT_ERRORS:
                report.over_limit.append(name)
                uncompile_blocks([module])
                return eager(*args, **kwargs)
            if not _is_compile_error(error):
                raise
            report.fall_back(_describe(error))
            uncompile_blocks(all_blocks)
            raise CompileFallback(report.fallback_reason) from error

    return forward


def _describe(error: BaseException, limit: int = 400) -> str:
    """"Type: first line" of a compile error, plus dynamo's "Explanation:" line when it has one."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    if lines and lines[0].endswith(":") and len(lines) > 1:  # "backend='inductor' raised:" + the cause
        text += f" {lines[1]}"
    explanation = next((line for line in lines[1:] if line.startswith("Explanation:")), None)
    if explanation:
        text += f" ({explanation[len('Explanation:'):].strip()})"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def run_with_fallback(fn, *args, **kwargs):
    """`fn(*args, **kwargs)`: kept for callers written when the caller ran an encode/decode again after
    a block fell back to eager mid-way; the engine does that itself now (`recovery.Restart.RUN`)."""
    return fn(*args, **kwargs)


def _is_compile_error(error: Exception) -> bool:
    """Failures of dynamo/inductor themselves (not of the model: OOM, cancellation, bad input)."""
    try:
        from torch._dynamo.exc import TorchDynamoException
    except ImportError:
        return False
    if isinstance(error, TorchDynamoException):
        return True
    # Inductor and Triton errors raised outside dynamo's wrappers (e.g. a missing compiler).
    module = type(error).__module__ or ""
    return module.startswith(("torch._inductor", "triton"))


def compile_blocks(model: nn.Module, settings: CompileSettings, device=None) -> CompileReport:
    """Compile every block of `model` in place (see `blocks`); returns what happened.

    `device` is where the model will run (default: where its weights are now); it decides which
    toolchain the backend needs. Calling it again first restores the eager blocks.
    """
    report = CompileReport()
    found = blocks(model)
    uncompile_blocks([m for _, m in found])
    if device is None:
        device = next(model.parameters()).device
    reason = unavailable_reason(settings, device)
    if reason is not None:
        report.fall_back(reason)
        return report
    options = dict(backend=settings.backend, fullgraph=settings.fullgraph, dynamic=settings.dynamic)
    if settings.backend == "inductor" and settings.mode != "default":
        options["mode"] = settings.mode
    modules = [m for _, m in found]
    for name, module in found:
        try:
            compiled = torch.compile(_own_code_forward(module), **options)
        except Exception as error:  # torch.compile itself rejected the arguments
            report.fall_back(f"torch.compile failed for {name}: {error}")
            uncompile_blocks(modules)
            return report
        module.forward = _guarded(module, name, compiled, report, modules, uses_cuda_graphs(settings))
        report.compiled.append(name)
    return report


def uncompile_blocks(modules) -> None:
    """Remove compiled forwards installed by `compile_blocks` (eager execution again)."""
    for module in modules:
        module.__dict__.pop("forward", None)


def is_compiled(module: nn.Module) -> bool:
    return "forward" in module.__dict__


@contextlib.contextmanager
def dynamo_limits(settings: CompileSettings | None):
    """Apply `settings`' recompilation limits to dynamo for the duration of the block, and make a
    block that reaches its limit raise (caught by the block, which then runs eagerly and is reported)
    instead of dynamo silently running it eagerly."""
    if settings is None:
        yield
        return
    try:
        from torch._dynamo import config
    except ImportError:
        yield
        return
    wanted = {}
    for names, value in ((("recompile_limit", "cache_size_limit"), settings.recompile_limit),
                         (("accumulated_recompile_limit", "accumulated_cache_size_limit"), settings.accumulated_recompile_limit),
                         (("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"), True)):
        name = next((n for n in names if hasattr(config, n)), None)
        if name is not None:
            wanted[name] = value
    with config.patch(wanted):
        yield
