"""The declared contract between a layer and the run (vae/model/execution.py): a strategy takes only a
`Conv`, `Norm` or `Attention`, checked by type; a frame-wise or pointwise conv is a conv with zero
temporal state."""
import pytest
import torch

import vae
from vae.model.blocks import CausalConv3d, Conv3d, FrameConv2d
from vae.model.execution import Conv, TimeWindow
from vae.run.strategies.exact_tiles import ExactTiles
from vae.run.stream_context import StreamContext


def test_a_strategy_refuses_a_layer_outside_the_contract_and_names_what_it_lacks():
    tiles = ExactTiles((16, 16), (8, 8), lambda: None)
    x = torch.zeros(1, 2, 1, 16, 16)
    with pytest.raises(TypeError, match=r"Conv3d is not a model\.execution\.Conv \(it lacks conv5d, pad_in_time, "
                                        r"spatial_pad, temporal, time_window\)"):
        tiles.conv(torch.nn.Conv3d(2, 2, 3), StreamContext(vae.Optimizations()), x.shape, x, None)


@pytest.mark.parametrize("conv", [FrameConv2d(2, 3, 3, stride=2, spatial_pad=(0, 1, 0, 1)), Conv3d(2, 3, 1),
                                  CausalConv3d(2, 3, (1, 3, 3))], ids=["frame-wise", "pointwise", "causal-1-frame"])
def test_a_conv_without_temporal_state_has_no_head_no_tail_and_keeps_nothing(conv):
    ctx = StreamContext(vae.Optimizations())
    assert isinstance(conv, Conv) and not conv.temporal
    for n, ctx.first_chunk, ctx.last_chunk in ((2, True, False), (2, False, False), (1, False, True)):  # a clip's chunks
        assert conv.time_window(ctx, n) == TimeWindow(head=0, new=n, tail=0, outputs=n, keep=n, cached=False)


def test_a_causal_conv_pads_the_clip_and_keeps_what_its_next_call_reads():
    ctx = StreamContext(vae.Optimizations())
    causal, ahead = CausalConv3d(2, 2, 3), CausalConv3d(2, 2, 3, head="replicate", lookahead=1)
    windows = []
    for n, ctx.first_chunk, ctx.last_chunk in ((2, True, False), (2, False, False), (1, False, True)):
        windows.append((causal.time_window(ctx, n), ahead.time_window(ctx, n)))
        ctx.cache.put(causal, torch.zeros(1, 2, 2, 4, 4))  # what a call keeps: its last kt - 1 input frames
        ctx.cache.put(ahead, torch.zeros(1, 2, 2, 4, 4))
    assert [w for w, _ in windows] == [TimeWindow(2, 2, 0, 2, 2, False), TimeWindow(2, 2, 0, 2, 2, True),
                                       TimeWindow(2, 1, 0, 1, 1, True)]
    assert [w for _, w in windows] == [TimeWindow(1, 2, 0, 1, 1, False), TimeWindow(2, 2, 0, 2, 2, True),
                                       TimeWindow(2, 1, 1, 2, 2, True)]  # the clip's end: one copy of its last frame
    assert CausalConv3d(2, 2, 3, head="replicate", lookahead=1).time_window(ctx, 0) is None  # not started
