"""CUDA graphs of a fixed tile and the compute / copy-out streams pipeline.

Their CPU fallbacks (a plain eager call, synchronous copies) run everywhere; the CUDA paths are
marked `gpu` and skip without CUDA.
"""
import pytest
import torch
import torch.nn.functional as F

from optimizations.cuda_graphs import GraphedTile
from optimizations.streams import PinnedPool, copy_out_pipeline
from reference import load_tiny

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def conv_tile(weight):
    """A tile function with real work: conv3d + SiLU + a reduction-free rescale."""
    return lambda x: F.silu(F.conv3d(x, weight, padding=1)) * 0.5


def tiles(n, device="cpu", shape=(1, 4, 3, 16, 16)):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(shape, generator=g).to(device) for _ in range(n)]


# -- CPU fallbacks -------------------------------------------------------------------------------------


def test_graphed_tile_runs_eagerly_off_cuda():
    weight = torch.randn(4, 4, 3, 3, 3)
    fn = conv_tile(weight)
    graphed = GraphedTile(fn)
    for x in tiles(3):
        assert torch.equal(graphed(x), fn(x))
    assert graphed.captures == 0


def test_graphed_tile_decodes_a_tiny_model_like_eager():
    model = load_tiny("wan21")
    z = torch.randn(1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    graphed = GraphedTile(lambda latent: model.decode(latent))
    torch.testing.assert_close(graphed(z), model.decode(z), rtol=0, atol=0)


def test_pipeline_on_cpu_is_the_plain_loop_in_order():
    weight = torch.randn(4, 4, 3, 3, 3)
    fn, inputs = conv_tile(weight), tiles(5)
    received = []
    count = copy_out_pipeline(range(5), lambda i: fn(inputs[i]), lambda i, y: received.append((i, y.clone())))
    assert count == 5 and [i for i, _ in received] == list(range(5))
    for i, y in received:
        assert y.device.type == "cpu" and torch.equal(y, fn(inputs[i]))


def test_pipeline_passes_errors_through_and_rejects_bad_depth():
    def compute(i):
        if i == 2:
            raise ValueError("tile 2 failed")
        return torch.full((2,), float(i))

    seen = []
    with pytest.raises(ValueError, match="tile 2 failed"):
        copy_out_pipeline(range(4), compute, lambda i, y: seen.append(i))
    assert seen == [0, 1]
    with pytest.raises(ValueError, match="depth"):
        copy_out_pipeline([], compute, lambda i, y: None, depth=0)


# -- CUDA ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
def test_graphed_tile_matches_eager_on_cuda_and_replays_new_inputs():
    weight = torch.randn(4, 4, 3, 3, 3, device="cuda")
    fn = conv_tile(weight)
    graphed = GraphedTile(fn)
    for x in tiles(4, "cuda"):
        torch.testing.assert_close(graphed(x), fn(x), rtol=1e-5, atol=1e-5)
    assert graphed.captures == 1  # one signature, captured once, replayed after
    graphed(tiles(1, "cuda", (1, 4, 3, 8, 8))[0])
    assert graphed.captures == 2


@pytest.mark.gpu
@needs_cuda
def test_graphed_tile_falls_back_when_capture_fails():
    graphed = GraphedTile(lambda x: x * x.sum().item())  # .item() synchronises: not capturable
    x = tiles(1, "cuda")[0]
    torch.testing.assert_close(graphed(x), x * x.sum().item())
    assert graphed.captures == 0


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_pipeline_on_cuda_equals_sequential_copies(depth):
    weight = torch.randn(4, 4, 3, 3, 3, device="cuda")
    fn, inputs = conv_tile(weight), tiles(6, "cuda")
    pool, received = PinnedPool(), {}
    copy_out_pipeline(range(6), lambda i: fn(inputs[i]), lambda i, y: received.__setitem__(i, (y.is_pinned(), y.clone())),
                      depth=depth, pool=pool)
    assert list(received) == list(range(6))
    for i, (pinned, y) in received.items():
        assert pinned and torch.equal(y, fn(inputs[i]).cpu())
    assert pool.allocated <= depth  # buffers are reused, not pinned per tile
