"""The Triton kernels as a GPU would compile and launch them, on a machine without one: their launches at
production sizes, recorded instead of run (on meta tensors), and `triton.compile` of those launches for real
GPU targets (`GPUTarget`), what tests/test_triton_targets.py checks and `python -m bench.triton_targets` runs
in full.

Triton runs its whole pipeline here: TTIR -> TTGIR -> LLVM IR -> PTX -> cubin (with the ptxas it ships) for
NVIDIA GPUs, and -> AMDGCN -> hsaco (with the linker built into it) for AMD ones. Each launch is compiled with
the specialization a GPU launch gives it (an integer argument of 1 a constant, 16-divisible pointers and
integers marked so, 64-bit integers past 2^31), from meta tensors, whose addresses count as aligned (as a
fresh CUDA allocation is).
"""
import contextlib
import re
from dataclasses import dataclass, field

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton._C.libtriton import ir
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, native_specialize_impl

from vae.kernels import na_window, triton_na, triton_norm
from vae.kernels.activation_layout import FORMATS

# The GPUs users run, oldest first: Turing, Ampere, Hopper, Blackwell (data centre, consumer), MI300.
TARGETS = {"sm_75": GPUTarget("cuda", 75, 32), "sm_80": GPUTarget("cuda", 80, 32), "sm_90": GPUTarget("cuda", 90, 32),
           "sm_100": GPUTarget("cuda", 100, 32), "sm_120": GPUTarget("cuda", 120, 32),
           "gfx942": GPUTarget("hip", "gfx942", 64)}
# Every @triton.jit kernel of the pack (helpers called from kernels are compiled inside them), by name, and
# the module each is launched from.
KERNEL_MODULES = {name: module for module in (triton_norm, triton_na) for name, fn in vars(module).items()
                  if isinstance(fn, JITFunction) and name.endswith("_kernel")}
KERNELS = {name: getattr(module, name) for name, module in KERNEL_MODULES.items()}
# Kernels whose maxes may drop a NaN (tl.max, tl.maximum's default) without changing a result, and why:
# `nan_max_problems` does not apply to them.
NAN_DROPPING_MAX_IS_HARMLESS = {
    "_na3d_kernel": "its maxes are the online softmax's running maxima: a NaN score still reaches its query's output "
                    "through its weight exp2(score - max), whatever the max did with it (tests/test_triton_na.py "
                    "checks the NaN outputs against the reference); a NaN-keeping tl.reduce would be interpreted "
                    "element by element in CI, ~4x slower",
}
# The largest grid CUDA launches: x up to 2^31 - 1 programs, y and z up to 65535 (HIP allows at least as many).
GRID_LIMITS = (2**31 - 1, 65535, 65535)


@dataclass(frozen=True)
class Launch:
    """One kernel launch: `kernel[grid](*args, **kwargs)`."""

    kernel: str
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict = field(default_factory=dict)

    def bound(self) -> dict:
        """Every argument of the kernel by name."""
        return KERNELS[self.kernel].signature.bind(*self.args, **self.kwargs).arguments


class _Recorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](...)` records the launch instead of running it."""

    def __init__(self, name: str, found: list):
        self.name, self.found = name, found

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.found.append(Launch(self.name, tuple(grid), args, kwargs))


@contextlib.contextmanager
def _recording(found: list):
    """Every kernel's launches appended to `found` instead of run, inside the block."""
    try:
        for name, module in KERNEL_MODULES.items():
            setattr(module, name, _Recorder(name, found))
        yield
    finally:
        for name, module in KERNEL_MODULES.items():
            setattr(module, name, KERNELS[name])


def launches(shape, dtype: torch.dtype, layout: str, groups: int = 32) -> list[Launch]:
    """The launches of the GroupNorm statistics and apply and the RMS norm with SiLU on an input of `shape`
    (B,C,T,H,W) in `dtype` and `layout` ("ncdhw" or "ndhwc"), written in `dtype`: recorded on meta tensors."""
    b, c, t = shape[:3]
    x = torch.empty(shape, dtype=dtype, device="meta", memory_format=FORMATS[layout])
    stats = torch.empty((b, c, t), device="meta")
    found: list[Launch] = []
    with _recording(found):
        triton_norm.group_norm_moments(x, groups)
        triton_norm.center_scale_act(x, stats, stats, stats, True, torch.empty_like(x))
        triton_norm.rms_norm_act(x, torch.empty((c, 1, 1, 1), device="meta"), 1e-12, True, torch.empty_like(x))
    return found


def na_launches(shape, kernel, dtype: torch.dtype) -> list[Launch]:
    """The launch of the neighbourhood-attention kernel on the whole grid of `shape` (B,T,H,W,heads,D) with
    windows `kernel`, q, k and v in `dtype` as views of one qkv projection (the model's layout): recorded on
    meta tensors."""
    b, t, h, w, heads, d = shape
    # B,T,H,W,3,heads,D -> 3 x B,T,H,W,heads,D
    q, k, v = torch.empty((b, t, h, w, 3, heads, d), dtype=dtype, device="meta").unbind(4)
    found: list[Launch] = []
    with _recording(found):
        triton_na.na3d(q, k, v, na_window.part_of(q, k, v, kernel, (0, 0, 0), (0, 0, 0), None), 1.0)
    return found


def source(launch: Launch, target: GPUTarget) -> ASTSource:
    """What a launch compiles on `target`: the kernel with the types, constants and alignment a GPU launch
    of these arguments specializes it to."""
    kernel, backend = KERNELS[launch.kernel], make_backend(target)
    values = launch.bound()
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(kernel.params):
        value = values[param.name]
        kind, spec = ("constexpr", value) if param.is_constexpr else native_specialize_impl(backend, value, False, True,
                                                                                           True)
        signature[param.name] = kind
        if kind == "constexpr":
            constexprs[(i,)] = spec
        elif spec:
            attrs[(i,)] = backend.parse_attr(spec)
    return ASTSource(kernel, signature, constexprs, attrs)


def compiled(launch: Launch, target: GPUTarget) -> dict:
    """The code of every stage Triton compiles `launch` through for `target`, by stage: ttir, ttgir, llir, then
    ptx and cubin (bytes) or amdgcn and hsaco (bytes)."""
    return dict(triton.compile(source(launch, target), target=target).asm)


def ttir(launch: Launch) -> str:
    """The Triton IR of a launch before any compiler pass (the first stage of `compiled`, alone): the same for
    every target, its values named by the kernel's variables."""
    target = TARGETS["sm_90"]
    backend = make_backend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = source(launch, target).make_ir(target, options, backend.get_codegen_implementation(options),
                                            backend.get_module_map(), context)
    return str(module)


def rounding_problems(code: dict[str, str], target: GPUTarget, out_dtype: torch.dtype) -> list[str]:
    """Why `code` may not round its float32 results to `out_dtype` to nearest, as torch does (none: it does).
    kernel_check's bounds take the GPU's rounding for granted (the interpreter truncates to bf16)."""
    if out_dtype == torch.float32:
        return []
    name = "bf16" if out_dtype == torch.bfloat16 else "f16"
    if target.backend == "cuda":
        ptx = code["ptx"]
        if re.search(rf"\bcvt\.r[zmp]i?\.{name}", ptx):
            return [f"PTX converts to {name} other than to nearest"]
        if re.search(rf"\bcvt\.rn\.{name}(x2)?\.f32\b", ptx):
            return []
        # No bf16 conversion before sm_80: LLVM rounds to nearest even by hand (the lowest kept bit plus
        # 0x7fff added, then the upper half taken).
        if name == "bf16" and target.arch < 80 and re.search(r"\bbfe\.u32\s+%r\d+, %r\d+, 16, 1;", ptx) and ", 32767;" in ptx:
            return []
        return [f"PTX has no round-to-nearest conversion to {name}"]
    gcn = code["amdgcn"]
    if name == "f16":
        if "v_cvt_pkrtz_f16_f32" in gcn:
            return ["AMDGCN converts to f16 toward zero (v_cvt_pkrtz_f16_f32)"]
        return [] if re.search(r"\bv_cvt_f16_f32", gcn) else ["AMDGCN has no conversion to f16"]
    if re.search(r"\bv_cvt_pk_bf16_f32\b", gcn):  # the instruction of newer CDNA GPUs: to nearest even
        return []
    # gfx942 rounds by hand as sm_75 does: value + 0x7fff + its lowest kept bit in one v_add3_u32.
    if "0x7fff" in gcn and re.search(r"\bv_add3_u32\b", gcn):
        return []
    return ["AMDGCN has no round-to-nearest conversion to bf16"]


def code_problems(launch: Launch, code: dict[str, str], target: GPUTarget) -> list[str]:
    """`rounding_problems` of the launch's output (float32 where it writes none) and `nan_max_problems` (where
    they apply: NAN_DROPPING_MAX_IS_HARMLESS) of its compiled `code`."""
    out = launch.bound().get("out_ptr")
    problems = rounding_problems(code, target, out.dtype if out is not None else torch.float32)
    if launch.kernel not in NAN_DROPPING_MAX_IS_HARMLESS:
        problems += nan_max_problems(code, target)
    return problems


def nan_max_problems(code: dict[str, str], target: GPUTarget) -> list[str]:
    """Why a max in `code` may turn NaN into a number (none: every one gives NaN where an operand is NaN, as
    torch's max and clamp_min do; tl.maximum's default does not). Read in the TTIR (the kernel's intent), the
    LLVM IR (llvm.maximum, or llvm.maxnum with the result replaced by NaN where `fcmp uno` of its operands
    holds) and, on NVIDIA GPUs, the PTX (max.NaN.f32 from sm_80, else each max.f32 with a setp.nan of its
    operands); AMDGCN's are LLVM's lowering of that IR (its max instructions may take canonicalized copies
    of the operands, not the registers compared)."""
    if "arith.maxnumf" in code["ttir"]:
        return ["a max that drops NaN (tl.maximum without propagate_nan=tl.PropagateNan.ALL)"]
    llir = code["llir"]
    lanes: dict[str, set[str]] = {}  # a vector -> the values put into it (LLVM packs NaN tests into vectors)
    for vector, base, value in re.findall(r"(%\w+) = insertelement <[^>]+> (\S+), \w+ (\S+), ", llir):
        lanes[vector] = lanes.get(base, set()) | {value}
    for vector, base in re.findall(r"(%\w+) = shufflevector <[^>]+> (%\w+), ", llir):
        lanes[vector] = lanes.get(base, set())
    for value, source in re.findall(r"(%\w+) = bitcast (?:<[^>]+>|\w+) (%\w+) to ", llir):  # the same bits
        lanes[value] = lanes.get(source, set()) | {source}
    tested = {x for pair in re.findall(r"= fcmp uno (?:<[^>]+>|\w+) ([^,\s]+), ([^,\s]+)", llir) for operand in pair
              for x in lanes.get(operand, set()) | {operand}}
    guarded = {x for value in re.findall(r"= select [^,]+, (?:<[^>]+>|\w+) (?:splat \([^)]*\)|\S+), (?:<[^>]+>|\w+) (%\w+)", llir)
               for x in lanes.get(value, set()) | {value}}
    tested |= {element for element, vector in re.findall(r"(%\w+) = extractelement <[^>]+> (%\w+), ", llir)
               if vector in tested}
    problems = []
    for result, args in re.findall(r"(%\w+) = (?:tail )?call [^@]*@llvm\.maxnum\.[\w.]+\(([^)]*)\)", llir):
        operands = {arg.rsplit(" ", 1)[-1] for arg in args.split(", ")}
        if not ({x for x in operands if x.startswith("%")} <= tested and result in guarded):
            problems.append(f"LLVM IR: {result} = maxnum({args}) is not replaced by NaN where an operand is NaN")
    if target.backend == "cuda":
        ptx = code["ptx"]
        nan_tests = set(re.findall(r"\bsetp\.nan\.f32\s+[^,]+, ([^,]+), ([^;]+);", ptx))
        maxes = re.findall(r"\bmax(?:\.ftz)?\.f32\s+[^,]+, ([^,]+), ([^;]+);", ptx)
        untested = [pair for pair in maxes if pair not in nan_tests and pair[::-1] not in nan_tests
                    and not all((x, x) in nan_tests for x in pair if x.startswith("%"))]  # max(x, constant): x tested
        if untested:
            problems.append(f"PTX: {len(untested)} of {len(maxes)} max.f32 without a NaN test of their operands")
    return problems


def int32_problems(code: str, launch: Launch) -> list[str]:
    """32-bit arithmetic in the kernel that can wrap at this launch's sizes: a program id used before it is
    widened to 64 bits, or a 32-bit product of two arguments past 2^31 - 1 (e.g. H * W), read from its TTIR
    (`code`: `ttir`; an argument of a helper the kernel calls is taken to be the kernel's of that name)."""
    values = launch.bound()
    problems = []
    for function in re.split(r"\n(?=\s*tt\.func )", code):
        for pid in re.findall(r"(%\w+) = tt\.get_program_id \w : i32", function):
            uses = [line for line in function.splitlines() if re.search(rf"{pid}\b", line) and f"{pid} = " not in line]
            if any(not re.search(rf"arith\.extsi {pid} : i32 to i64", line) for line in uses):
                problems.append(f"program id {pid} used in 32-bit arithmetic")
        for a, b in re.findall(r"= arith\.muli %(\w+), %(\w+) : i32\b", function):
            if a in values and b in values and abs(values[a] * values[b]) >= 2**31:
                problems.append(f"{a} * {b} = {values[a] * values[b]} wraps in int32")
    return problems
