"""Activations channels-last (NDHWC) end to end: the same numbers as NCDHW for every family, chunks,
exact tiles, frame streaming and caches on disk included; every conv of an NDHWC run reads and writes NDHWC (no
conversion on the way); the CPU norms' channels-last paths equal the channel-plane ones."""
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vae
from tests.reference import TINY_FAMILIES, assert_exact, load_tiny
from vae.kernels import activation_layout, conv, conv_check, kernel_choice, norm_act
from vae.run import kernel_plan

FAMILIES = list(TINY_FAMILIES)  # the Wan variants and the image family: tests/test_wan_variants.py
FIXED = vae.Optimizations(kernel_choice="defaults")
# Every name a conv reaches a dispatch mode by. The engine runs under torch.inference_mode(), where the
# autograd keys are skipped, so F.conv3d (the CUDA path) reaches the mode as the composite aten::conv3d,
# before it decomposes (with autograd on: aten::convolution); the CPU float32 path calls oneDNN directly.
CONVS = ("aten::conv3d", "aten::conv2d", "aten::convolution", "aten::_convolution", "aten::mkldnn_convolution",
         "aten::cudnn_convolution")


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return load_tiny(request.param)


def clip_of(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(1, model.latent_channels, 4, 6, 5, generator=g)
    video = torch.rand(1, 3, 9, 6 * model.spatial_factor, 5 * model.spatial_factor, generator=g) * 2 - 1
    return z, video


def run(model, op, x, settings, layout_name):
    opts = FIXED.with_(activation_layout=layout_name)
    return vae.decode(model, x, settings, opts=opts) if op == "decode" else vae.encode(model, x, settings, opts=opts)


@pytest.mark.parametrize("op", ["decode", "encode"])
def test_ndhwc_equals_ncdhw_with_chunks_tiles_and_frame_streaming(model, op):
    z, video = clip_of(model)
    x = z if op == "decode" else video
    whole = run(model, op, x, vae.Settings(), "ncdhw")
    tile = 2 * model.spatial_factor  # pixels: tiles of 2 latent pixels, a 3x3 grid
    for settings in (vae.Settings(temporal_chunk=1), vae.Settings(temporal_chunk=2, tile_size=tile),
                     vae.Settings(temporal_chunk=1, stream_frames=True),
                     vae.Settings(temporal_chunk=1, tile_size=tile, cache_offload="disk")):  # caches by bands
        assert_exact(run(model, op, x, settings, "ndhwc"), whole, atol=1e-5, rtol=0,
                                   msg=lambda m, s=settings: f"{s}: {m}")


class ConvLayouts(TorchDispatchMode):
    """Records, for every conv the run calls, whether its input and its output are NDHWC, and the name
    of every op it saw (`ops`), so a run where no conv is recognised says what it dispatched instead."""

    def __init__(self):
        super().__init__()
        self.seen = []
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.add(func._schema.name)
        if func._schema.name in CONVS and args[0].shape[1] > 1:
            self.seen.append((activation_layout.is_ndhwc(args[0]), activation_layout.is_ndhwc(out) or out.shape[1] == 1))
        return out

    def no_conv_message(self) -> str:
        return f"no conv recognised (CONVS = {CONVS}); the ops this run dispatched: {sorted(self.ops)}"


@pytest.mark.parametrize("route", ["inference", "autograd", "onednn"])
def test_the_conv_probe_sees_a_conv_whichever_way_torch_dispatches_it(route):
    """F.conv3d under inference mode (the engine's, and the CUDA path's call) reaches the probe as
    aten::conv3d, with autograd on as aten::convolution; the CPU float32 path calls oneDNN directly.
    (Only the input's layout is asserted: torch's own CPU conv3d may return few channels NCDHW, which
    is why the CPU path calls oneDNN.)"""
    x = torch.randn(1, 4, 3, 5, 5).contiguous(memory_format=torch.channels_last_3d)
    weight = torch.randn(6, 4, 3, 3, 3).contiguous(memory_format=torch.channels_last_3d)
    with torch.inference_mode(route != "autograd"), ConvLayouts() as probe:
        if route == "onednn":
            torch.ops.aten.mkldnn_convolution(x, weight, None, [0, 1, 1], [1, 1, 1], [1, 1, 1], 1)
        else:
            torch.nn.functional.conv3d(x, weight, None, 1, (0, 1, 1))
    assert len(probe.seen) == 1 and probe.seen[0][0], probe.no_conv_message()


@pytest.mark.parametrize("op", ["decode", "encode"])
@pytest.mark.parametrize("layout_name", ["ndhwc", "ncdhw"])
@pytest.mark.parametrize("tiled", [False, True])
def test_every_conv_reads_and_writes_the_run_layout(model, op, layout_name, tiled):
    """Chunks of 2 latent frames, or of 1 with tiles (the first chunk of an encode is one frame, and a
    temporal downsampler yields no frame from it: joining nothing must keep the layout)."""
    z, video = clip_of(model)
    settings = vae.Settings(temporal_chunk=1, tile_size=2 * model.spatial_factor) if tiled else \
        vae.Settings(temporal_chunk=2)
    with ConvLayouts() as probe:
        run(model, op, z if op == "decode" else video, settings, layout_name)
    assert len(probe.seen) > 5, probe.no_conv_message()
    wanted = layout_name == "ndhwc"
    fell = [i for i, (inp, out) in enumerate(probe.seen) if inp != wanted or out != wanted]
    assert not fell, f"{len(fell)} of {len(probe.seen)} convs not in {layout_name}, first at conv {fell[0]}"


def test_weights_follow_the_run_and_leave_no_state(model):
    z, _ = clip_of(model)
    first = run(model, "decode", z, vae.Settings(), "ncdhw")
    run(model, "decode", z, vae.Settings(), "ndhwc")
    convs = [p for p in model.parameters() if p.dim() == 5 and p.shape[1] > 1]
    assert convs and all(p.is_contiguous(memory_format=torch.channels_last_3d) for p in convs)
    again = run(model, "decode", z, vae.Settings(), "ncdhw")
    assert all(p.is_contiguous() for p in convs)
    torch.testing.assert_close(again, first, atol=0, rtol=0)


def channels_last_view(shape, mean=0.0, dtype=torch.float32, seed=0):
    """A tile view (inside a larger NDHWC frame) of values around `mean`, and its NCDHW copy."""
    g = torch.Generator().manual_seed(seed)
    b, c, t, h, w = shape
    frame = (torch.randn(b, c, t, h + 3, w + 2, generator=g) * 2 + mean).to(dtype)
    view = frame.contiguous(memory_format=torch.channels_last_3d)[..., 1:1 + h, 2:2 + w]
    assert activation_layout.is_ndhwc(view) and not view.is_contiguous(memory_format=torch.channels_last_3d)
    return view, view.contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mean", [0.0, 300.0])
def test_cpu_norms_in_channels_last_equal_channel_planes(dtype, mean, monkeypatch):
    monkeypatch.setattr(norm_act, "CPU_BLOCK_BYTES", 4 * 6 * 16 * 3)  # several row blocks per frame
    x, planes = channels_last_view((2, 16, 3, 11, 6), mean, dtype)
    exact_mean, exact_var = norm_act.torch_group_moments(planes.double(), 4)
    got_mean, got_var = norm_act.group_norm_moments(x, 4)
    torch.testing.assert_close(got_mean.double(), exact_mean, atol=1e-5 * (1 + mean), rtol=1e-6)  # scaled already
    assert_exact(got_var.double(), exact_var, atol=1e-4, rtol=1e-5)
    weight, bias = torch.randn(16), torch.randn(16)
    rstd = torch.rsqrt(exact_var.float() + 1e-6)
    out = activation_layout.empty_video(x, x.shape)
    norm_act.group_norm_apply(x, exact_mean.float(), rstd, weight, bias, True, out)
    expected = norm_act.group_norm_apply(planes, exact_mean.float(), rstd, weight, bias, True)
    assert activation_layout.is_ndhwc(out)
    assert_exact(out.float(), expected.float(), atol=0 if dtype == torch.float32 else 1e-2, rtol=0)
    gamma = torch.randn(16, 1, 1, 1)
    exact = torch.nn.functional.silu(torch.nn.functional.normalize(planes.double(), dim=1) * 4 * gamma.double())
    got, planes_got = norm_act.rms_norm_act(x, gamma), norm_act.rms_norm_act(planes, gamma)
    assert activation_layout.is_ndhwc(got)
    if dtype == torch.float32:
        assert_exact(got, planes_got, atol=1e-5, rtol=0)
    else:  # half precision: the channels-last blocks round once, the channel-plane path twice
        assert (got.double() - exact).abs().max() <= (planes_got.double() - exact).abs().max()
        assert_exact(got.double(), exact, atol=1e-2, rtol=2**-8)


def test_auto_on_cuda_with_measured_kernels_takes_the_measured_layout(monkeypatch):
    """The decision: "auto" on CUDA with measured kernels is what `measured` finds on that GPU; with
    fixed kernels, an explicit layout or on a CPU, the rule."""
    monkeypatch.setattr(kernel_plan, "measured", lambda model, device, dtype: "ncdhw")
    monkeypatch.setattr(conv_check, "failure", lambda device, dtype: None)  # an emulated GPU's NDHWC convs pass
    gpu, cpu = SimpleNamespace(device=torch.device("cuda")), SimpleNamespace(device=torch.device("cpu"))
    assert kernel_plan.choose(gpu, "auto", "measure", torch.bfloat16) == "ncdhw"
    assert kernel_plan.choose(gpu, "auto", "defaults", torch.bfloat16) == "ndhwc"
    assert kernel_plan.choose(gpu, "ndhwc", "measure", torch.bfloat16) == "ndhwc"
    assert kernel_plan.choose(cpu, "auto", "measure", torch.float32) == "ndhwc"


def test_the_layout_measurement_times_both_layouts_once(monkeypatch, tmp_path):
    """`measured` (what CUDA runs, here on the CPU): both layouts timed on the model's widest and
    narrowest 3x3x3 convs, the choice kept in the machine's record and read back, not timed again."""
    monkeypatch.setenv(kernel_choice.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(kernel_plan, "PROBE_SIDES", (8, 16))
    model = load_tiny("seedvr2")
    chosen = kernel_plan.measured(model, "cpu", torch.float32)
    record = kernel_choice.choices_for("cpu")
    entries = {key: entry for key, entry in record._choices.items() if key.startswith("activation layout cpu float32")}
    assert len(entries) == 1 and set(next(iter(entries.values()))["ms"]) == {"ndhwc", "ncdhw"}
    assert chosen == next(iter(entries.values()))["choice"] in ("ndhwc", "ncdhw")
    timed = []
    monkeypatch.setattr(conv, "conv3d", lambda *args, **kwargs: timed.append(args))
    assert kernel_plan.measured(model, "cpu", torch.float32) == chosen and not timed


def test_auto_layout_by_device():
    assert kernel_plan.resolve("auto", "cuda") == "ndhwc"
    assert kernel_plan.resolve("auto", "cpu") == "ndhwc"
    assert kernel_plan.resolve("auto", "mps") == "ncdhw"
    assert kernel_plan.resolve("ncdhw", "cuda") == "ncdhw"
    assert kernel_plan.resolve("ncdhw", "cpu") == "ncdhw"
    with pytest.raises(ValueError, match="activation_layout"):
        vae.Optimizations(activation_layout="nhwc")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("op", ["decode", "encode"])
@pytest.mark.parametrize("family", FAMILIES)
def test_on_cuda_ndhwc_equals_ncdhw_and_every_conv_is_channels_last(family, op):
    """cuDNN and the Triton norms in NDHWC: the NCDHW result (TF32 off), no conv converted on the way."""
    from vae.kernels import BackendFlags
    from vae.kernels.backend import applied

    model = load_tiny(family, device="cuda")
    x = clip_of(model)[0 if op == "decode" else 1].cuda()
    with applied(BackendFlags(tf32=False)):
        want = run(model, op, x, vae.Settings(temporal_chunk=2), "ncdhw")
        with ConvLayouts() as probe:
            got = run(model, op, x, vae.Settings(temporal_chunk=1, tile_size=2 * model.spatial_factor), "ndhwc")
    assert_exact(got, want, atol=1e-4, rtol=0)
    assert probe.seen, probe.no_conv_message()
    fell = [i for i, (inp, out) in enumerate(probe.seen) if not (inp and out)]
    assert not fell, f"{len(fell)} of {len(probe.seen)} convs not NDHWC, first at conv {fell[0]}: {probe.seen}"


def _parameters(model) -> list:
    """What a run may not change of the model's parameters: each one, its storage, strides, dtype, values."""
    return [(p, p.data_ptr(), p.stride(), p.dtype, p.detach().clone()) for p in model.parameters()]


def _unchanged(model, before) -> None:
    for (param, pointer, stride, dtype, values), now in zip(before, model.parameters(), strict=True):
        assert now is param and now.data_ptr() == pointer and now.stride() == stride and now.dtype == dtype
        assert torch.equal(now.detach(), values)


def test_planning_leaves_the_model_as_it_found_it():
    """`vae.plan` decides and changes nothing: whatever layout, budget or mode it plans, every
    parameter keeps its tensor, storage, strides, dtype and values (the weights are in NCDHW, and the
    plans are NDHWC)."""
    model = load_tiny("wan21")
    z = torch.randn(1, model.latent_channels, 3, 6, 8)
    before = _parameters(model)
    opts = FIXED.with_(activation_layout="ndhwc")
    for op, shape in (("decode", z.shape), ("encode", (1, 3, 9, 48, 64))):
        for settings in (vae.Settings(), vae.Settings(temporal_chunk=2, tile_size=24),
                         vae.Settings(memory_budget=2**20), vae.Settings(temporal_chunk=1, stream_frames=True)):
            assert vae.plan(model, op, shape, settings, opts=opts).activation_layout == "ndhwc"
    _unchanged(model, before)


@pytest.mark.parametrize("setting", ["ndhwc", "ncdhw"])
def test_a_run_puts_the_weights_in_its_plans_layout_and_a_decode_leaves_them(setting):
    """The engine puts the weights in the plan's activation layout before the run (the one change a
    run may make to the model); a decode whose weights are in its layout already (chunks, exact tiles,
    frames streamed) leaves every parameter as it found it: the same tensor, strides and values."""
    model = load_tiny("wan21")
    other = "ncdhw" if setting == "ndhwc" else "ndhwc"
    z = torch.randn(1, model.latent_channels, 3, 6, 8)
    vae.decode(model, z[:, :, :1], opts=FIXED.with_(activation_layout=other))  # the weights in the other layout
    weights = [p for p in model.parameters() if p.dim() == 5 and p.shape[1] > 1 and p[0, 0].numel() > 1]
    assert all(activation_layout.layout_of(w) == other for w in weights)
    opts = FIXED.with_(activation_layout=setting)
    vae.decode(model, z[:, :, :1], opts=opts)
    assert all(activation_layout.layout_of(w) == setting for w in weights)
    for settings in (vae.Settings(temporal_chunk=1), vae.Settings(temporal_chunk=2, tile_size=24),
                     vae.Settings(temporal_chunk=1, stream_frames=True)):
        plan = vae.plan(model, "decode", z.shape, settings, opts=opts)
        assert plan.activation_layout == setting
        before = _parameters(model)
        vae.decode(model, z, plan, opts=opts)
        _unchanged(model, before)
