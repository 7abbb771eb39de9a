"""Offloaded causal caches (vae/run/causal_cache.py): every family encodes and decodes bit-identically with
its caches on disk or in host memory, the disk store keeps one slot per module, a memory budget
offloads the caches before it tiles, and out of memory offloads them before it shrinks the tile."""
import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vae
from tests.reference import TINY_FAMILIES, load_tiny, tensors
from tests.test_tiling import FIXTURES, _last_causal_conv
from vae.run import memory
from vae.run.causal_cache import CausalCache, _DiskStore, _HostStore
from vae.kernels import activation_layout

FAMILIES = list(TINY_FAMILIES)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return load_tiny(request.param)


def fixture_clips(family):
    video_file, video, latent_file, latent = FIXTURES[family]
    return tensors(family, video_file)[video], tensors(family, latent_file)[latent]


@pytest.mark.parametrize("tile", [None, 32], ids=["untiled", "exact-tile32"])
def test_caches_on_disk_give_the_same_result(model, tile):
    """("host" is "none" with CPU compute; its store is tested below and on CUDA.)"""
    video, z = fixture_clips(model.family)
    for run, x in ((vae.encode, video), (vae.decode, z)):
        on_device = run(model, x, vae.Settings(temporal_chunk=1, tile_size=tile, cache_offload="none"))
        assert torch.equal(run(model, x, vae.Settings(temporal_chunk=1, tile_size=tile, cache_offload="disk")),
                           on_device)


def test_disk_store_round_trips_and_reuses_each_modules_slot():
    cache = CausalCache("disk")
    a, b = torch.nn.Identity(), torch.nn.Identity()
    frames = torch.randn(1, 4, 2, 5, 7)
    cache.put(a, frames[:, :, 1:])  # a non-contiguous view
    cache.put(b, frames.to(torch.bfloat16))
    assert torch.equal(cache.get(a), frames[:, :, 1:]) and torch.equal(cache.get(b), frames.to(torch.bfloat16))
    size = cache._store.end
    for _ in range(3):  # a module that pops and puts every chunk (Wan2.2's held frame) keeps its slot
        cache.pop(a)
        assert a not in cache and cache.get(a) is None
        cache.put(a, frames[:, :, :1])
    assert cache._store.end == size and torch.equal(cache.get(a), frames[:, :, :1])
    assert sorted(n for _, n in cache.sizes()) == [frames[:, :, :1].nbytes, frames.to(torch.bfloat16).nbytes]
    cache.close()
    assert cache._store.file.closed


def test_device_store_writes_a_new_entry_into_the_old_ones_memory():
    """Chunk after chunk a causal conv stores frames of the same shape: they go into the memory of the
    entry it has just read, in its layout (no fresh allocation per chunk), and read back equal."""
    cache, conv = CausalCache("none"), torch.nn.Identity()
    for layout in (torch.contiguous_format, torch.channels_last_3d):
        frames = torch.randn(2, 6, 4, 5, 7).contiguous(memory_format=layout)
        cache.put(conv, frames[:, :, 2:])
        first = cache.get(conv)
        for start in (1, 0):
            cache.put(conv, frames[:, :, start:start + 2])
            assert cache.get(conv).data_ptr() == first.data_ptr()
            assert torch.equal(cache.get(conv), frames[:, :, start:start + 2])
        assert cache.get(conv).is_contiguous(memory_format=layout)
        cache.pop(conv)
    cache.put(conv, frames[:, :, :3])  # another shape: a new entry
    assert torch.equal(cache.get(conv), frames[:, :, :3])


@pytest.mark.parametrize("where", ["disk", "host"])
def test_offloaded_entries_come_back_in_their_layout(where):
    """NDHWC frames stored whole or band by band, on disk (rows first, then channels last) or in host
    memory, come back equal and NDHWC, whole and by rows; NCDHW ones stay NCDHW."""
    store = _DiskStore() if where == "disk" else _HostStore(budget_bytes=1 << 20)
    store.pin = False  # (host) no GPU here: pageable buffers, as after a failed pin
    conv = torch.nn.Identity()
    for layout_name, fmt in (("ndhwc", torch.channels_last_3d), ("ncdhw", torch.contiguous_format)):
        frames = torch.randn(2, 6, 3, 5, 7).contiguous(memory_format=fmt)
        store.put(conv, frames[:, :, 1:], owned=False)
        for got in (store.get(conv, "cpu"), store.rows(conv, 1, 4, "cpu")):
            assert activation_layout.layout_of(got) == layout_name
        assert torch.equal(store.get(conv, "cpu"), frames[:, :, 1:])
        assert torch.equal(store.rows(conv, 1, 4, "cpu"), frames[:, :, 1:, 1:4])
        for first, stop in ((0, 2), (2, 5)):  # a new entry written a band of rows at a time
            store.put_rows(conv, frames[..., first:stop, :] * 2, first, 5)
        store.commit(conv)
        assert torch.equal(store.get(conv, "cpu"), frames * 2) and activation_layout.layout_of(store.get(conv, "cpu")) == layout_name
        store.discard(conv)
    store.close()


class Copies(TorchDispatchMode):
    """Every copy_ a run makes: whether dst and src are both dense NDHWC, their storages, shape and strides.
    It holds on to both tensors, so no storage a copy saw is freed and its address given to another."""

    def __init__(self):
        super().__init__()
        self.seen, self.held = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            dense = all(x.is_contiguous(memory_format=torch.channels_last_3d) for x in (dst, src))
            self.seen.append((dense, dst.untyped_storage().data_ptr(), src.untyped_storage().data_ptr(),
                              tuple(dst.shape), dst.stride(), src.stride()))
            self.held.append((dst, src))
        return func(*args, **(kwargs or {}))


def test_host_store_copies_only_dense_blocks():
    """A band of an NDHWC cache moves between the GPU and host memory as dense blocks, one per frame (one
    memcpy each): torch moves a view that is not dense through NCDHW temporaries and a transposing copy
    on the CPU, which made a 1080p SeedVR2 decode within 6 GiB on an H100 run for minutes. (Driven on the
    CPU: the copies the store issues are what a GPU would get.)"""
    store = _HostStore(budget_bytes=1 << 20)
    store.pin = False
    conv = torch.nn.Identity()
    padded = torch.randn(2, 6, 3, 7, 9).contiguous(memory_format=torch.channels_last_3d)
    frames = padded[..., 1:-1, 1:-1]  # B,C,T,5,7: a block's input without its padding, not dense
    with Copies() as copies:
        store.put(conv, frames, owned=False)
        got_rows = store.rows(conv, 1, 4, "cpu")
        for first, stop in ((0, 2), (2, 5)):
            store.put_rows(conv, (frames[..., first:stop, :] * 2).contiguous(memory_format=torch.channels_last_3d),
                           first, 5)
        store.commit(conv)
    assert torch.equal(got_rows, frames[..., 1:4, :]) and activation_layout.is_ndhwc(got_rows)
    assert torch.equal(store.get(conv, "cpu"), frames * 2)
    host = {t.untyped_storage().data_ptr() for t in (*store.held.values(), *store.spare.values())}
    across = [c for c in copies.seen if host & {c[1], c[2]}]  # to or from host memory; the rest stays on its device
    assert len(across) >= 3 and all(dense for dense, *_ in across), across


def test_host_store_pins_within_its_budget_and_spills_to_disk_past_it():
    """The host store's tiers, driven on the CPU: pinning fails on a machine without a GPU (exactly
    what a failed pin on a GPU machine raises), so it warns once and uses pageable memory; a module
    whose frames exceed what is left of the budget goes to disk; values always round-trip."""
    store = _HostStore(budget_bytes=1000)
    small, big = torch.randn(1, 2, 3, 4, 5), torch.randn(1, 2, 3, 4, 10)  # B,C,T,H,W: 480 and 960 bytes
    a, b, c = (torch.nn.Identity() for _ in range(3))
    with pytest.warns(RuntimeWarning, match="could not pin host memory"):
        store.put(a, small, owned=False)
    assert not store.pin and a in store.held and store.left == 520
    store.put(b, big, owned=False)  # 960 > 520 left: to disk
    assert b not in store.held and b in store.disk.live
    store.put(c, small, owned=False)  # fits what is left
    assert c in store.held and store.left == 40
    for key, frames in ((a, small), (b, big), (c, small)):
        assert torch.equal(store.get(key, "cpu"), frames)
    store.put(a, small * 2, owned=False)  # same shape: the buffer is reused, the budget unchanged
    assert store.left == 40 and torch.equal(store.get(a, "cpu"), small * 2)
    store.discard(a)
    assert store.left == 520 and set(store.keys()) == {b, c}
    store.close()
    assert store.left == 1000 and store.disk.file.closed


def test_host_budget_defaults_to_what_the_machine_can_spare(monkeypatch):
    from vae.kernels import backend

    monkeypatch.setattr(backend, "host_free", lambda: 40 * 2**30)
    assert backend.host_available() == 36 * 2**30  # 10 % margin
    monkeypatch.setattr(backend, "host_free", lambda: 3 * 2**30)
    assert backend.host_available() == 2**30  # at least 2 GiB stay free
    monkeypatch.setattr(backend, "host_free", lambda: 2**30)
    assert backend.host_available() == 0


def test_host_offload_with_cpu_compute_keeps_the_caches_in_place():
    assert CausalCache("host", "cpu").offload == "none"
    with pytest.raises(ValueError, match="cache_offload must be one of"):
        CausalCache("gpu")
    with pytest.raises(ValueError, match="cache_offload must be 'auto' or one of"):
        vae.decode(load_tiny("wan21"), torch.zeros(1, 16, 1, 4, 4), vae.Settings(cache_offload="ram"))


def test_budget_offloads_the_caches_before_it_tiles(caplog):
    m = load_tiny("seedvr2")
    z = torch.randn(1, 16, 3, 16, 12, generator=torch.Generator().manual_seed(4))
    shape = tuple(z.shape)
    clip = vae.run.planning.clip_of(m, "decode", shape)
    on_device, offloaded = (memory.estimate(m, clip, 1, None, cache_offload=o) for o in ("none", "disk"))
    assert offloaded < on_device
    budget = (on_device + offloaded) // 2
    chosen = vae.plan(m, "decode", shape, vae.Settings(memory_budget=budget))
    assert chosen.tile_size is None and chosen.cache_offload == "disk" and chosen.fits
    assert "caches offloaded to disk" in chosen.describe()
    # caches kept on the device and frames not streamed: the budget is met by tiles instead
    kept = vae.plan(m, "decode", shape, vae.Settings(memory_budget=budget, cache_offload="none", stream_frames=False))
    assert kept.tile_size is not None and kept.cache_offload == "none"
    with caplog.at_level(logging.INFO, logger="streamvae"):
        got = vae.decode(m, z, vae.Settings(memory_budget=budget))
    assert "caches offloaded to disk" in caplog.text
    assert torch.equal(got, vae.decode(m, z))


def test_out_of_memory_offloads_the_caches_before_it_tiles(model, monkeypatch, caplog):
    """The last conv runs out of memory while the caches are on the device: the retry moves them to
    disk (rebuilt from the finished first chunk) and stays untiled; the result is unchanged."""
    z = fixture_clips(model.family)[1]
    whole = vae.decode(model, z, vae.Settings(temporal_chunk=1))
    conv = _last_causal_conv(model)
    forward, failures, tiled = conv.forward, [], []

    def flaky(x, ctx, *args, **kwargs):
        tiled.append(ctx.execution is not None)
        if ctx.cache.offload == "none" and not ctx.first_chunk:
            failures.append(x.shape[2])
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return forward(x, ctx, *args, **kwargs)

    monkeypatch.setattr(conv, "forward", flaky)
    with caplog.at_level(logging.WARNING, logger="streamvae"):
        got = vae.decode(model, z, vae.Settings(temporal_chunk=1))
    assert len(failures) == 1 and not any(tiled)
    assert "retrying the chunk with untiled, 1 latent frame(s) per chunk, caches offloaded to disk" in caplog.text
    assert torch.equal(got, whole)


@needs_cuda
@pytest.mark.gpu
def test_host_offload_on_cuda_equals_the_caches_on_the_gpu():
    m = load_tiny("seedvr2", device="cuda")
    z = fixture_clips("seedvr2")[1].cuda()
    cache = CausalCache("host", "cuda")
    assert cache.offload == "host"
    for tile in (None, 32):
        on_gpu = vae.decode(m, z, vae.Settings(temporal_chunk=1, tile_size=tile, cache_offload="none"))
        assert torch.equal(vae.decode(m, z, vae.Settings(temporal_chunk=1, tile_size=tile, cache_offload="host")),
                           on_gpu)
    video = fixture_clips("seedvr2")[0].cuda()
    assert torch.equal(vae.encode(m, video, vae.Settings(temporal_chunk=1, cache_offload="host")),
                       vae.encode(m, video, vae.Settings(temporal_chunk=1)))


@needs_cuda
@pytest.mark.gpu
def test_host_store_on_cuda_pins_and_spills_past_its_budget():
    """Real pinned buffers and non-blocking copies; a budget too small for the last module spills it to disk."""
    frames = [torch.randn(1, 4, 3, 64, 64, device="cuda") * i for i in range(1, 5)]
    store = _HostStore(budget_bytes=3 * frames[0].nbytes)
    keys = [torch.nn.Identity() for _ in frames]
    for key, f in zip(keys, frames):
        store.put(key, f, owned=False)
    assert store.pin and all(store.held[k].is_pinned() for k in keys[:3])
    assert keys[-1] in store.disk.live
    for key, f in zip(keys, frames):
        assert torch.equal(store.get(key, "cuda"), f)
