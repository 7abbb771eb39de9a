"""What the GPU path decides, tested on the CPU by making torch report a given GPU: precision, what
counts as out of memory on each backend, the Triton probe's fallback, the attention kernel, the
conv dispatch's cuDNN route, CUDA-graph-safe compiled blocks, and weights loaded per half. Each
test asserts the decision the code takes, and where there is a result, that it is the right one."""
import logging
from types import SimpleNamespace

import pytest
import torch
import vae
import torch.nn.functional as F

from vae.kernels import Optimizations, attention, backend, conv, kernel_check, kernel_choice, norm_act
from vae.run.compile import CompileSettings, _guarded, uses_cuda_graphs
from tests.reference import assert_exact, load_tiny, tiny_checkpoint
from vae.run import recovery


def pretend_gpu(monkeypatch, major=8, minor=0, hip_arch=None, name="Fake GPU"):
    """Make torch report one CUDA device of compute capability major.minor (or a ROCm GPU)."""
    props = SimpleNamespace(major=major, minor=minor, name=name, gcnArchName=hip_arch or "", total_memory=24 * 2**30,
                            multi_processor_count=80)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.version, "hip", "6.2" if hip_arch else None)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what torch says even on Turing


# -- precision -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("major, hip_arch, expected", [
    (7, None, False),      # Turing: bf16 only emulated, although is_bf16_supported() says yes
    (8, None, True),       # Ampere
    (9, None, True),       # Hopper
    (12, None, True),      # Blackwell
    (9, "gfx1030", False),  # RDNA2
    (9, "gfx1100", True),   # RDNA3
    (9, "gfx90a:sramecc+:xnack-", True),  # MI200
    (9, "gfx942", True),    # MI300
    (9, "gfx906", False),   # MI50
])
def test_native_bf16_follows_the_hardware(monkeypatch, major, hip_arch, expected):
    pretend_gpu(monkeypatch, major=major, hip_arch=hip_arch)
    assert backend.native_bf16("cuda") is expected
    assert backend.auto_dtype("cuda", "decode") == (torch.bfloat16 if expected else torch.float32)
    assert backend.auto_dtype("cuda", "encode") == torch.float32  # bf16 encode hurts image-to-video
    assert recovery.half_fallback_dtype(torch.device("cuda")) == (torch.bfloat16 if expected else torch.float32)


def test_mps_gets_bf16_from_macos_14(monkeypatch):
    for version_ok in (False, True):
        monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: version_ok, raising=False)
        assert backend.native_bf16("mps") is version_ok
        assert backend.auto_dtype("mps", "decode") == (torch.bfloat16 if version_ok else torch.float32)


@pytest.mark.parametrize("native", [False, True])
def test_cpu_auto_decodes_in_bf16_only_with_native_bf16(monkeypatch, native):
    """AVX-512 BF16 / AMX: bf16 decode (46-49 dB against fp32, about 1.6x faster); otherwise fp32. Encode
    stays fp32, and an fp16 overflow on the CPU still falls back to fp32."""
    monkeypatch.setattr(backend, "cpu_has_native", lambda dtype: native)
    assert backend.auto_dtype("cpu", "decode") == (torch.bfloat16 if native else torch.float32)
    assert backend.auto_dtype("cpu", "encode") == torch.float32
    assert recovery.half_fallback_dtype(torch.device("cpu")) == torch.float32


def test_encoder_weights_are_not_rounded_through_the_decode_dtype():
    """fp32 checkpoint, encode fp32 / decode bf16: the encoder keeps the file's exact fp32 weights."""
    from safetensors.torch import load_file

    import vae

    stored = load_file(str(tiny_checkpoint("wan21")))
    model = vae.load(stored, dtype=torch.bfloat16, encode_dtype=torch.float32, decode_dtype=torch.bfloat16)
    assert model.encode_dtype == torch.float32 and model.decode_dtype == torch.bfloat16
    encoder_key = next(k for k in stored if k.startswith("encoder.") and stored[k].dim() == 5)
    assert torch.equal(model.state_dict()[encoder_key], stored[encoder_key].float())
    assert stored[encoder_key].dtype == torch.float32
    assert not torch.equal(stored[encoder_key].bfloat16().float(), stored[encoder_key])  # bf16 would have rounded it


# -- out of memory on every backend ------------------------------------------------------------------


@pytest.mark.parametrize("error, expected", [
    (backend.OOM("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (backend.OOM("HIP out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.2 GB)"), True),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
    (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"), True),
    (RuntimeError("miopenStatusAllocFailed"), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory"), True),
    (RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8589934592 bytes."), True),
    (MemoryError(), True),
    (RuntimeError("Expected all tensors to be on the same device"), False),
    (ValueError("out of memory"), False),
])
def test_out_of_memory_is_recognised_on_every_backend(error, expected):
    assert backend.is_oom(error) is expected


def test_an_mps_out_of_memory_mid_decode_is_retried_smaller(monkeypatch):
    """The MPS error is a plain RuntimeError: the engine must still shrink and retry, not fail."""
    model = load_tiny("wan21")
    z = torch.randn(1, 16, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    expected = vae.decode(model, z, vae.Settings(temporal_chunk=1))
    conv = model.decoder.head[-1] if hasattr(model.decoder, "head") else None
    target = conv or next(m for m in model.modules() if isinstance(m, torch.nn.Conv3d))
    forward, failed = target.forward, []

    def flaky(*args, **kwargs):
        if not failed:
            failed.append(True)
            raise RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.2 GB)")
        return forward(*args, **kwargs)

    monkeypatch.setattr(target, "forward", flaky)
    assert_exact(vae.decode(model, z, vae.Settings(temporal_chunk=1)), expected, rtol=1e-5, atol=1e-5)
    assert failed


# -- the Triton kernels' first-use check (tests/test_kernel_check.py tests the check itself) ------------


def test_a_kernel_failing_its_check_falls_back_with_one_warning(monkeypatch, caplog, tmp_path):
    """Triton imports but cannot build or run here (old GPU, no C compiler, broken driver): each kernel's
    check fails, one warning names them, the device and the cause, and it is decided once per device."""
    pretend_gpu(monkeypatch, major=7)
    monkeypatch.setenv(kernel_choice.CACHE_ENV, str(tmp_path))
    kernel_check.verdicts.cache_clear()
    failure = "RuntimeError: Triton requires CUDA 11.4+ / sm_75 or newer"
    monkeypatch.setattr(kernel_check, "_check", lambda device, dtype, which: ({k: failure for k in which}, set()))
    with caplog.at_level(logging.WARNING, logger="streamvae"), pytest.warns(RuntimeWarning, match="sm_75"):
        first = kernel_check.verdicts(kernel_check.device_name("cuda"), torch.float32)
        assert kernel_check.verdicts(kernel_check.device_name("cuda:0"), torch.float32) is first  # once per device
    assert not any(v.passed for v in first.values())
    assert sum("failed the first-use check on cuda:0" in r.message for r in caplog.records) == 1
    kernel_check.verdicts.cache_clear()


def test_no_triton_means_the_torch_kernels():
    x = torch.randn(1, 8, 2, 4, 4)
    assert not kernel_check.usable(x, "group_norm_stats")
    assert_exact(norm_act.group_norm_act(x, 4, torch.ones(8), torch.zeros(8), 1e-6, triton=True),
                 norm_act.group_norm_act(x, 4, torch.ones(8), torch.zeros(8), 1e-6, triton=False), rtol=1.3e-6)


# -- attention kernel ------------------------------------------------------------------------------------


@pytest.mark.parametrize("requested, head, dtype, major, expected, noted", [
    ("flash", 512, torch.bfloat16, 9, "efficient", "head dim 512 > 256"),  # SeedVR2's mid-block
    ("flash", 384, torch.bfloat16, 9, "efficient", "head dim 384 > 256"),  # Wan's
    ("flash", 128, torch.bfloat16, 9, "flash", None),
    ("flash", 128, torch.float32, 9, "efficient", "needs fp16/bf16"),
    ("flash", 128, torch.float16, 7, "efficient", "Ampere"),
    ("cudnn", 512, torch.bfloat16, 9, "efficient", "head dim 512 > 128"),
    ("efficient", 512, torch.float32, 9, "efficient", None),
    ("math", 512, torch.bfloat16, 9, "math", None),
    ("auto", 512, torch.bfloat16, 9, "auto", None),
])
def test_a_forced_attention_kernel_that_cannot_take_the_head_is_replaced(monkeypatch, requested, head, dtype, major,
                                                                         expected, noted):
    pretend_gpu(monkeypatch, major=major)
    kernel, note = attention.choose(requested, head, dtype, "cuda")
    assert kernel == expected
    assert (note is None) if noted is None else (noted in note and expected in note)


def test_attention_requests_off_the_gpu_run_pytorchs_choice_and_compute_attention():
    q, k, v = (torch.randn(2, 16, 24) for _ in range(3))
    expected = torch.softmax(q @ k.transpose(1, 2) / 24 ** 0.5, -1) @ v
    for requested in attention.KERNELS:
        kernel, note = attention.choose(requested, 24, q.dtype, "cpu")
        assert kernel == ("math" if requested == "math" else "auto")
        assert (note is None) == (requested in ("auto", "math"))
        assert_exact(attention.sdpa(q, k, v, requested), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="attention must be one of"):
        Optimizations().with_(attention="fastest")


# -- the conv3d workaround is wired into the dispatch ----------------------------------------------------


def emulate_conv3d_regression(monkeypatch) -> list:
    """Every conv meets the PyTorch 2.9 regression (an affected install, a GPU half-precision input), and
    `cudnn_conv3d` is F.conv3d that records its calls (their paddings), returned."""
    calls = []

    def fake_cudnn(x, weight, bias, stride, padding):
        calls.append(tuple(padding))
        return F.conv3d(x, weight, bias, stride, padding)

    monkeypatch.setattr(backend, "cudnn_conv3d", fake_cudnn)
    monkeypatch.setattr(backend, "wants_cudnn_conv3d", lambda t: True)
    return calls


def test_affected_installs_route_half_precision_convs_through_cudnn(monkeypatch):
    x, w, b = torch.randn(1, 4, 3, 6, 6), torch.randn(8, 4, 3, 3, 3), torch.randn(8)
    calls = emulate_conv3d_regression(monkeypatch)
    expected = F.conv3d(x, w, b, 1, (0, 1, 1))
    assert_exact(conv.conv3d(x, w, b, (1, 1, 1), (0, 1, 1), cudnn_workaround=True), expected, rtol=1.3e-6)
    assert calls == [(0, 1, 1)]
    assert_exact(conv.conv3d(x, w, b, (1, 1, 1), (0, 1, 1), cudnn_workaround=False), expected, rtol=1.3e-6)
    assert calls == [(0, 1, 1)]  # the run's Optimizations turned it off: PyTorch's own path


def test_the_workaround_applies_only_where_the_regression_is(monkeypatch):
    gpu_half = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)  # all the decision reads of a tensor
    for affected in (False, True):
        monkeypatch.setattr(backend, "conv3d_regression_affected", lambda: affected)
        assert backend.wants_cudnn_conv3d(gpu_half) is affected
        assert not backend.wants_cudnn_conv3d(SimpleNamespace(is_cuda=True, dtype=torch.float32))
        assert not backend.wants_cudnn_conv3d(SimpleNamespace(is_cuda=False, dtype=torch.bfloat16))


def test_unconnected_gpu_optimizations_node_applies_the_conv3d_workaround(monkeypatch, caplog):
    """Load VAE without GPU Optimizations runs with the node's defaults: on an affected install (emulated)
    every conv of a decode goes through cuDNN directly, the load says so once, and the frames are the
    plain decode's; the node's switch turned off (connected) keeps PyTorch's path."""
    from tests.test_bad_inputs import node_module

    model_nodes = node_module("model")
    model = load_tiny("wan21")
    z = torch.randn(1, 16, 2, 4, 4)
    expected = vae.decode(model, z, opts=Optimizations(kernel_choice="defaults", conv3d_workaround=False))
    calls = emulate_conv3d_regression(monkeypatch)
    monkeypatch.setattr(backend, "conv3d_regression_affected", lambda: True)
    with caplog.at_level(logging.INFO, logger="streamvae"):
        handle = model_nodes.StreamVAEHandle(model, "tiny", torch.device("cuda"), torch.device("cpu"), kernels="defaults")
    assert handle.gpu == model_nodes.GpuOptions() and handle.opts.conv3d_workaround
    assert [r.message for r in caplog.records if "conv3d" in r.message] == [
        f"StreamVAE tiny: PyTorch 2.9 cuDNN conv3d regression detected ({backend.describe()}): workaround on, "
        "half-precision conv3d calls cuDNN directly"]
    assert_exact(vae.decode(model, z, opts=handle.opts), expected, rtol=1e-5, atol=1e-5)
    assert len(calls) > 10
    calls.clear()
    off = model_nodes.StreamVAEHandle(model, "tiny", torch.device("cuda"), torch.device("cpu"), kernels="defaults",
                                      gpu=model_nodes.GpuOptions(conv3d_workaround=False))
    vae.decode(model, z, opts=off.opts)
    assert calls == [] and "workaround off" in off.notes[-1]


def test_tf32_switch_works_on_torch_before_2_9(monkeypatch):
    """torch < 2.9 has no torch.backends.cudnn.conv: the legacy allow_tf32 flags are used."""
    monkeypatch.delattr(type(torch.backends.cudnn), "conv", raising=False)
    api, *_ = backend._tf32_get()
    assert api == "legacy"
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with backend.applied(backend.BackendFlags(tf32=not before[1])):
        assert torch.backends.cudnn.allow_tf32 is (not before[1])
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


# -- torch.compile with CUDA graphs ----------------------------------------------------------------------


def test_graph_replaying_compiled_blocks_return_outputs_the_next_replay_cannot_overwrite(monkeypatch):
    """A CUDA-graphed block writes every output into the same static buffer; without a copy the
    previous tile's output changes when the next tile runs. The guard starts a new graph step per
    call and returns a copy."""
    assert uses_cuda_graphs(CompileSettings(mode="reduce-overhead")) and uses_cuda_graphs(CompileSettings(mode="max-autotune"))
    assert not uses_cuda_graphs(CompileSettings(mode="max-autotune-no-cudagraphs"))
    assert uses_cuda_graphs(CompileSettings(backend="cudagraphs"))
    static = torch.zeros(3)
    steps = []

    def replay(x):  # what a graph replay does: the result lives in the graph's own buffer
        static.copy_(x * 2)
        return static

    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: steps.append(1), raising=False)
    guarded = _guarded(torch.nn.Identity(), "Identity", replay, report=None, all_blocks=[], graphed=True)
    first = guarded(torch.ones(3))
    second = guarded(torch.full((3,), 5.0))
    assert torch.equal(first, torch.full((3,), 2.0)) and torch.equal(second, torch.full((3,), 10.0))
    assert len(steps) == 2
    unguarded = _guarded(torch.nn.Identity(), "Identity", replay, report=None, all_blocks=[], graphed=False)
    first = unguarded(torch.ones(3))
    unguarded(torch.full((3,), 5.0))
    assert torch.equal(first, torch.full((3,), 10.0))  # what the copy prevents


def replaying_backend(gm, example_inputs):
    """A compile backend that treats outputs as a CUDA graph replay does: every call of a graph writes
    its outputs into the same memory, which may be reused while the replay runs (here: filled with
    NaN before the graph reads its inputs), so an output kept from an earlier call is lost."""
    buffers = []

    def replay(*args):
        for buffer in buffers:
            if isinstance(buffer, torch.Tensor):
                buffer.fill_(float("nan"))
        outs = gm(*args)
        if not buffers:
            buffers.extend(o.clone() if isinstance(o, torch.Tensor) else o for o in outs)
        for buffer, o in zip(buffers, outs):
            if isinstance(o, torch.Tensor):
                buffer.copy_(o)
        return type(outs)(buffers)

    return replay


def test_graph_replaying_blocks_keep_their_causal_caches(monkeypatch):
    """A graph-replaying block also leaves graph outputs in the causal caches (the frames the next
    chunk reads), which the block's next replay would overwrite: they are copied, so a chunked decode
    equals the eager one (with the replays emulated on the CPU)."""
    import vae.run.compile as compile_module

    monkeypatch.setattr(compile_module, "uses_cuda_graphs", lambda settings: True)
    model = load_tiny("wan22")
    z = torch.randn(1, model.latent_channels, 3, 2, 3)
    size, one = dict(num_frames=9, height=32, width=48), vae.Settings(temporal_chunk=1)
    expected = vae.decode(model, z, one, **size)
    report = compile_module.compile_blocks(model, CompileSettings(backend=replaying_backend))
    assert_exact(vae.decode(model, z, one, **size), expected, rtol=1e-5, atol=1e-5)
    assert report.status == f"compiled {len(report.compiled)} blocks"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("head", [128, 384, 512])
def test_the_attention_rule_matches_what_the_gpu_runs(head):
    """Each kernel the rule calls usable runs alone (no math fallback allowed); each it calls unusable
    is refused by PyTorch on this GPU."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}
    q, k, v = (torch.randn(1, 1, 1024, head, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    for kernel, member in names.items():
        backend_kernel = getattr(SDPBackend, member, None)
        if backend_kernel is None:
            continue
        usable = attention.unsupported(kernel, head, torch.bfloat16, torch.device("cuda")) is None
        with sdpa_kernel([backend_kernel]):
            if usable:
                assert_exact(F.scaled_dot_product_attention(q, k, v).float(), expected, atol=2e-2,
                                           rtol=2e-2)
            elif kernel != "cudnn":  # cuDNN's own limit moves with its version: only the rule's side is checked
                with pytest.raises(RuntimeError):
                    F.scaled_dot_product_attention(q, k, v)
