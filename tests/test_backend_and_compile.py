"""The pieces behind the two settings nodes: backend flags that are restored, torch.compile per block
with a clean eager fallback and one warning. CPU tests; the GPU-only paths skip without CUDA."""
import logging

import pytest
import torch
import vae
import torch.nn as nn
import torch.nn.functional as F

from vae.kernels import BackendFlags, backend
from vae.run.compile import CompileSettings, compile_blocks, run_with_fallback, blocks, dynamo_limits, is_compiled, unavailable_reason
from reference import assert_exact, load_tiny

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def global_state():
    return torch.backends.cudnn.benchmark, backend._tf32_get()


# -- backend flags -----------------------------------------------------------------------------------


@pytest.mark.parametrize("benchmark, tf32", [(True, True), (False, False)])
def test_backend_flags_are_applied_and_restored(benchmark, tf32):
    before = global_state()
    api = before[1][0]
    with backend.applied(BackendFlags(cudnn_benchmark=benchmark, tf32=tf32)):
        assert torch.backends.cudnn.benchmark is benchmark
        expected = backend._tf32_value(tf32, api)
        assert backend._tf32_get()[1:] == (expected, expected)
    assert global_state() == before


def test_backend_flags_are_restored_after_an_error():
    before = global_state()
    with pytest.raises(RuntimeError, match="boom"):
        with backend.applied(BackendFlags(cudnn_benchmark=not before[0], tf32=True)):
            raise RuntimeError("boom")
    assert global_state() == before


def test_none_leaves_switches_alone():
    before = global_state()
    with backend.applied(BackendFlags()):  # cudnn_benchmark=None, tf32=None
        assert global_state() == before
    with backend.applied(None):
        assert global_state() == before


def test_conv3d_workaround_probe(monkeypatch):
    assert backend.torch_version() >= (2, 0)
    if not torch.cuda.is_available():
        assert not backend.conv3d_regression_affected()  # nothing to work around here
    assert "torch" in backend.describe()


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cudnn_conv3d_matches_conv3d(dtype):
    x = torch.randn(1, 8, 5, 16, 16, device="cuda", dtype=dtype)
    w = torch.randn(16, 8, 3, 3, 3, device="cuda", dtype=dtype) * 0.1
    b = torch.randn(16, device="cuda", dtype=dtype)
    expected = F.conv3d(x.float(), w.float(), b.float(), 1, 1)
    assert_exact(backend.cudnn_conv3d(x, w, b, (1, 1, 1), (1, 1, 1)).float(), expected, rtol=2e-2,
                               atol=2e-2)


# -- torch.compile -------------------------------------------------------------------------------------


class ToyVAE(nn.Module):
    """Two conv blocks per half with plain F.conv3d, shaped like a VideoVAE for `compile_blocks`."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv3d(3, 8, 3, padding=1), nn.SiLU(), nn.Conv3d(8, 4, 1))
        self.decoder = nn.ModuleList([nn.Conv3d(4, 8, 3, padding=1), nn.Conv3d(8, 3, 1)])

    def encode_modules(self):
        return [self.encoder]

    def decode_modules(self):
        return [self.decoder]

    def forward(self, x):
        z = self.encoder(x)
        for block in self.decoder:
            z = block(z)
        return z


def counting_backend(graphs):
    def compiler(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return compiler


def failing_backend(gm, example_inputs):
    raise RuntimeError("no kernels for you")


def warnings_from(caplog):
    return [r for r in caplog.records if r.name == "streamvae" and r.levelno == logging.WARNING]


def test_blocks_are_the_children_of_encoder_and_decoder():
    names = [name for name, _ in blocks(ToyVAE())]
    assert names == ["Sequential.0", "Sequential.2", "ModuleList.0", "ModuleList.1"]
    for family in ("seedvr2", "wan21", "wan22"):
        found = blocks(load_tiny(family))
        assert len(found) >= 8 and all(any(True for _ in m.parameters()) for _, m in found)


def test_compiled_blocks_give_the_same_result():
    graphs = []
    model = ToyVAE()
    x = torch.randn(1, 3, 3, 8, 8)
    expected = model(x)
    report = compile_blocks(model, CompileSettings(backend=counting_backend(graphs)))
    assert_exact(model(x), expected, rtol=1.3e-6)  # assert_close's float32 defaults, scaled
    assert report.status == "compiled 4 blocks" and len(graphs) == 4  # dynamo really traced each block
    assert all(is_compiled(m) for _, m in blocks(model))
    compile_blocks(model, CompileSettings(backend="no_such_backend"))  # recompiling first restores eager
    assert not any(is_compiled(m) for _, m in blocks(model))


def test_unavailable_backend_falls_back_with_one_warning(caplog):
    model = load_tiny("wan22")
    x = torch.rand(1, 3, 5, 32, 32) * 2 - 1
    expected = vae.encode(model, x)
    with caplog.at_level(logging.WARNING, logger="streamvae"):
        report = compile_blocks(model, CompileSettings(backend="no_such_backend"))
        out = vae.encode(model, x)
    assert report.status.startswith("eager (fallback: backend 'no_such_backend' is not registered")
    assert not any(is_compiled(m) for _, m in blocks(model))
    assert len(warnings_from(caplog)) == 1
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_inductor_without_triton_is_reported_unavailable(monkeypatch):
    import vae.run.compile as compile_module

    monkeypatch.setattr(compile_module, "_has_triton", lambda: False)
    reason = unavailable_reason(CompileSettings(backend="inductor"), "cuda")
    assert "Triton" in reason and "triton-windows" in reason
    monkeypatch.setattr(compile_module, "_has_cpp_compiler", lambda: False)
    assert "C++ compiler" in unavailable_reason(CompileSettings(backend="inductor"), "cpu")


def test_compile_failure_mid_run_restarts_eagerly_with_one_warning(caplog):
    """A block that fails to compile on its first call: every block goes back to eager, and the
    engine runs the whole encode again from the start (caches may hold part of the failed step:
    `recovery.Restart.RUN`), with one warning."""
    model = load_tiny("seedvr2")
    x = torch.rand(1, 3, 5, 32, 32) * 2 - 1
    expected = vae.encode(model, x)
    starts = []  # per call of the first conv: whether its chunk holds the clip's frame 0
    model.encoder.conv_in.register_forward_pre_hook(lambda module, args: starts.append(args[1].first_chunk))
    with caplog.at_level(logging.WARNING, logger="streamvae"):
        report = compile_blocks(model, CompileSettings(backend=failing_backend))
        assert report.fallback_reason is None and report.compiled
        out = vae.encode(model, x, vae.Settings(temporal_chunk=1))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert starts == [True, True, False]  # failed in the first chunk; then the clip's two chunks, eagerly
    assert "no kernels for you" in report.status
    assert not any(is_compiled(m) for _, m in blocks(model))
    assert len(warnings_from(caplog)) == 1


def test_run_with_fallback_still_runs_a_callers_encode():
    """`vae.run_with_fallback`, kept for callers written when they restarted the run themselves."""
    model = load_tiny("wan21")
    x = torch.rand(1, 3, 1, 16, 16) * 2 - 1
    expected = vae.encode(model, x)
    compile_blocks(model, CompileSettings(backend=failing_backend))
    torch.testing.assert_close(run_with_fallback(vae.encode, model, x), expected, rtol=0, atol=0)


def test_family_blocks_trace_whole_once_per_chunk_state():
    """Every block of a real decoder traces as one graph (fullgraph: no graph break in the engine's
    convs, norms or caches), twice at most (the first chunk, then the steady state), within a
    recompile limit of 3 per block although its four up blocks share one class; a longer clip compiles
    nothing new, and the result is the eager one up to float32 rounding."""
    model = load_tiny("wan22")
    z = torch.randn(1, model.latent_channels, 3, 2, 3)
    size, one = dict(height=32, width=48), vae.Settings(temporal_chunk=1)
    expected = [vae.decode(model, z[:, :, :n], one, num_frames=4 * n - 3, **size) for n in (2, 3)]
    graphs = []
    settings = CompileSettings(backend=counting_backend(graphs), fullgraph=True, recompile_limit=3)
    report = compile_blocks(model, settings)
    with dynamo_limits(settings):
        short = vae.decode(model, z[:, :, :2], one, num_frames=5, **size)
        traced = len(graphs)
        longer = vae.decode(model, z, one, num_frames=9, **size)
    assert report.status == f"compiled {len(report.compiled)} blocks", report.status
    decode_stages = set(model.decode_stages())
    decoder_blocks = sum(1 for _, module in blocks(model) if module in decode_stages)
    assert decoder_blocks < traced <= 2 * decoder_blocks and len(graphs) == traced
    for got, want in zip((short, longer), expected):
        assert_exact(got, want, rtol=1e-5, atol=1e-5)


class ConvBlock(nn.Conv3d):
    """nn.Conv3d with a forward defined here, as the families' blocks have (torch.compile runs the
    forwards of torch's own modules through one shared wrapper function)."""

    def forward(self, x):
        return super().forward(x)


def test_recompile_limit_counts_per_block_and_is_reported():
    """Blocks of one class keep separate graph caches (a limit of 1 holds for four blocks of one
    class and four shapes); a block past its limit runs eagerly from then on and the status says so."""
    graphs = []
    model = ToyVAE()
    model.encoder = nn.Sequential(ConvBlock(3, 8, 3, padding=1), ConvBlock(8, 4, 1))
    model.decoder = nn.ModuleList([ConvBlock(4, 8, 3, padding=1), ConvBlock(8, 3, 1)])
    small, large = torch.randn(1, 3, 3, 8, 8), torch.randn(1, 3, 3, 8, 12)
    expected = model(small), model(large)
    settings = CompileSettings(backend=counting_backend(graphs), recompile_limit=1)
    report = compile_blocks(model, settings)
    with dynamo_limits(settings):
        assert_exact(model(small), expected[0], rtol=1.3e-6)
        assert report.status == "compiled 4 blocks" and len(graphs) == 4
        assert_exact(model(large), expected[1], rtol=1.3e-6)
    assert len(graphs) == 4
    assert report.status == ("compiled 0 of 4 blocks (Sequential.0, Sequential.1, ModuleList.0, ModuleList.1 "
                             "ran past the recompile limit: eager)")
    assert not any(is_compiled(m) for _, m in blocks(model))


def test_tiled_and_offloaded_steps_run_compiled_blocks_eagerly():
    """Exact tiles (per-tile progress and cancellation) and offloaded caches (file and pinned-memory
    I/O) must not be traced: compiled blocks run those steps eagerly, exactly, and say so."""
    model = load_tiny("seedvr2")
    z = torch.randn(1, model.latent_channels, 2, 4, 4)
    runs = dict(tiled=vae.Settings(temporal_chunk=1, tile_size=16),
                offloaded=vae.Settings(temporal_chunk=1, cache_offload="disk"))
    expected = {k: vae.decode(model, z, settings) for k, settings in runs.items()}
    graphs = []
    report = compile_blocks(model, CompileSettings(backend=counting_backend(graphs)))
    for k, settings in runs.items():
        torch.testing.assert_close(vae.decode(model, z, settings), expected[k], rtol=0, atol=0)
    assert graphs == []
    assert report.status == (f"compiled {len(report.compiled)} blocks; exact-tile steps and steps with caches "
                             "offloaded to disk ran eagerly")


def test_dynamo_limits_are_scoped():
    from torch._dynamo import config

    before = (config.recompile_limit, config.accumulated_recompile_limit, config.fail_on_recompile_limit_hit)
    with dynamo_limits(CompileSettings(recompile_limit=3, accumulated_recompile_limit=7)):
        assert (config.recompile_limit, config.accumulated_recompile_limit, config.fail_on_recompile_limit_hit) == (3, 7, True)
    assert (config.recompile_limit, config.accumulated_recompile_limit, config.fail_on_recompile_limit_hit) == before


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="mode must be one of"):
        CompileSettings(mode="ludicrous")
