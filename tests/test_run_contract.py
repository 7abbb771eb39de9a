"""The declared contract between a layer and the run (vae/model/execution.py): a strategy takes only a
`Conv`, `Norm` or `Attention`, checked by type; a frame-wise or pointwise conv is a conv with zero
temporal state; which chunk holds the clip's first and last frames is said by one loop
(`RunContext.chunks`) and assigned nowhere else; each failure restarts at its declared point
(`recovery.restart_point`)."""
import ast
from pathlib import Path

import pytest
import torch

import vae
from tests.reference import assert_exact
from vae.model.blocks import CausalConv3d, Conv3d, FrameConv2d
from vae.model.execution import Conv, TimeWindow
from vae.run import recovery
from vae.run.compile import CompileFallback
from vae.run.strategies.exact_tiles import ExactTiles
from vae.run.run_context import RunContext

REPO = Path(__file__).resolve().parents[1]


def test_a_strategy_refuses_a_layer_outside_the_contract_and_names_what_it_lacks():
    tiles = ExactTiles((16, 16), (8, 8), lambda: None)
    x = torch.zeros(1, 2, 1, 16, 16)
    with pytest.raises(TypeError, match=r"Conv3d is not a model\.execution\.Conv \(it lacks conv5d, pad_in_time, "
                                        r"spatial_pad, temporal, time_window\)"):
        tiles.conv(torch.nn.Conv3d(2, 2, 3), RunContext(vae.Optimizations()), x.shape, x, None)


@pytest.mark.parametrize("conv", [FrameConv2d(2, 3, 3, stride=2, spatial_pad=(0, 1, 0, 1)), Conv3d(2, 3, 1),
                                  CausalConv3d(2, 3, (1, 3, 3))], ids=["frame-wise", "pointwise", "causal-1-frame"])
def test_a_conv_without_temporal_state_has_no_head_no_tail_and_keeps_nothing(conv):
    ctx = RunContext(vae.Optimizations())
    assert isinstance(conv, Conv) and not conv.temporal
    for _, n in ctx.chunks(5, 2):  # the clip's first, a middle and its last chunk
        assert conv.time_window(ctx, n) == TimeWindow(head=0, new=n, tail=0, outputs=n, keep=n, cached=False)


def test_a_causal_conv_pads_the_clip_and_keeps_what_its_next_call_reads():
    ctx = RunContext(vae.Optimizations())
    causal, ahead = CausalConv3d(2, 2, 3), CausalConv3d(2, 2, 3, head="replicate", lookahead=1)
    windows = []
    for _, n in ctx.chunks(5, 2):
        windows.append((causal.time_window(ctx, n), ahead.time_window(ctx, n)))
        ctx.cache.put(causal, torch.zeros(1, 2, 2, 4, 4))  # what a call keeps: its last kt - 1 input frames
        ctx.cache.put(ahead, torch.zeros(1, 2, 2, 4, 4))
    assert [w for w, _ in windows] == [TimeWindow(2, 2, 0, 2, 2, False), TimeWindow(2, 2, 0, 2, 2, True),
                                       TimeWindow(2, 1, 0, 1, 1, True)]
    assert [w for _, w in windows] == [TimeWindow(1, 2, 0, 1, 1, False), TimeWindow(2, 2, 0, 2, 2, True),
                                       TimeWindow(2, 1, 1, 2, 2, True)]  # the clip's end: one copy of its last frame
    assert CausalConv3d(2, 2, 3, head="replicate", lookahead=1).time_window(ctx, 0) is None  # not started


def test_one_loop_says_which_chunk_holds_the_first_and_the_last_frame():
    ctx = RunContext(vae.Optimizations())

    def parts(*args, **kwargs):
        return [(first, n, ctx.first_chunk, ctx.last_chunk) for first, n in ctx.chunks(*args, **kwargs)]

    assert parts(7, 3) == [(0, 3, True, False), (3, 3, False, False), (6, 1, False, True)]
    assert parts(7, 2, start=3) == [(3, 2, False, False), (5, 2, False, True)]  # resumed after a retry
    assert parts(7, 2, stop=3) == [(0, 2, True, False), (2, 1, False, False)]  # the frames written, again
    assert parts(4, 2, started=True, ending=False) == [(0, 2, False, False), (2, 2, False, False)]
    images = RunContext(vae.Optimizations(), frames_are_images=True)
    assert [images.first_chunk for _ in images.chunks(3, 1)] == [True, True, True]


def _assigned_flags(tree: ast.AST):
    """(line, function) of every assignment to an attribute `first_chunk` or `last_chunk`."""
    found = []
    for function in (node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.Lambda))):
        for node in ast.walk(function):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            names = [t for target in targets for t in ast.walk(target) if isinstance(t, ast.Attribute)]
            if any(t.attr in ("first_chunk", "last_chunk") for t in names):
                found.append((node.lineno, getattr(function, "name", "<lambda>")))
    return found


def test_first_and_last_chunk_are_assigned_only_by_the_chunk_loop():
    """No model file, strategy, tool or the engine sets them: the context's constructor and its one loop."""
    places = {}
    for path in sorted([*(REPO / "vae").rglob("*.py"), *(REPO / "bench").rglob("*.py"), *(REPO / "nodes").rglob("*.py")]):
        for line, function in _assigned_flags(ast.parse(path.read_text())):
            places.setdefault(f"{path.relative_to(REPO)}:{function}", []).append(line)
    assert set(places) == {"vae/run/run_context.py:__init__", "vae/run/run_context.py:chunks"}, places
    assert _assigned_flags(ast.parse("def f(ctx):\n    ctx.first_chunk, x = True, 1\n")) == [(2, "f")]


def test_each_failure_restarts_at_its_declared_point():
    assert recovery.restart_point(torch.OutOfMemoryError("CUDA out of memory")) is recovery.Restart.CHUNK
    assert recovery.restart_point(RuntimeError("DefaultCPUAllocator: can't allocate memory")) is recovery.Restart.CHUNK
    assert recovery.restart_point(recovery.HalfOverflow("fp16 decode produced Inf/NaN")) is recovery.Restart.RUN
    assert recovery.restart_point(CompileFallback("no kernels")) is recovery.Restart.RUN
    assert recovery.restart_point(recovery.OutOfMemory("at the floor")) is None  # what was tried: to the caller
    assert recovery.restart_point(ValueError("bad input")) is None
    assert recovery.restart_point(vae.Cancelled()) is None


def test_out_of_memory_in_the_prefill_restarts_the_chunk_with_a_smaller_plan(monkeypatch):
    """HunyuanVideo 1.5 with core's unmasked attention runs its prefill stages over the clip first: an
    out-of-memory error there is recovered like one in a chunk (the next smaller plan), and the decode
    equals the one that never failed."""
    torch.manual_seed(0)
    model = vae.Hv15VAE(vae.Hv15Config(block_out_channels=(8, 8, 8, 32, 32), layers_per_block=1, attention="full")).eval()
    z = torch.randn(1, model.latent_channels, 1, 2, 2)
    opts = vae.Optimizations(kernel_choice="defaults")
    want = vae.decode(model, z, vae.Settings(temporal_chunk=1), opts=opts)
    conv, forward = model.decoder.conv_in.conv, model.decoder.conv_in.conv.forward
    failed = []

    def once(x, ctx, *args, **kwargs):
        if ctx.prefill and not failed:
            failed.append(ctx.first_chunk)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return forward(x, ctx, *args, **kwargs)

    monkeypatch.setattr(conv, "forward", once)
    got = vae.decode(model, z, vae.Settings(temporal_chunk=1), opts=opts)  # retried with the caches on disk
    assert failed == [True]
    assert_exact(got, want, atol=1e-5, rtol=0)
