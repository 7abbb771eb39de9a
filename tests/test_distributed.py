"""Several processes, one exact decode/encode (row bands: `vae.RowBands`, `vae.distributed.workers`), on the CPU with gloo.

One spawn of three real processes runs every distributed case (a 2-rank subgroup and the 3-rank world,
uneven bands, all three families, encode and decode in temporal chunks); the test process compares
each result with its own single-process untiled encode/decode of the same input. The worker-process
path (`RankWorkers`) is checked for the same equality, and for what happens when a rank is killed
mid-decode, fails at start, or the caller cancels: a clear error within seconds and no process left.
"""
import io
import os
import queue
import signal
import time

import psutil
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import vae
from tests.reference import TINY_FAMILIES, load_tiny, tensors
from vae import Cancelled, RowBands, Settings
from vae.distributed import row_bands
from vae.distributed.row_bands import Bands
from vae.distributed.workers import RankWorkers, WorkerFailed

FAMILIES = list(TINY_FAMILIES)
FIXTURES = {  # (file, video input, file, raw decoder input); frames 64x64, latents 8x8 (Wan2.2: 4x4)
    "seedvr2": ("tiny_inputs.safetensors", "video", "tiny_outputs.safetensors", "dec.input"),
    "wan21": ("reference_io.safetensors", "video_in", "reference_io.safetensors", "dec_in_z_raw"),
    "wan22": ("reference_io.safetensors", "video_in", "reference_io.safetensors", "dec_in_z_raw"),
}
# Float32 rounding of the split against the single-process result, relative to the output's magnitude
# (decoded frames reach +-4); measured up to 2.8e-6 of it (SeedVR2 fixture, 2 worker processes, AVX2 CPU).
RTOL = 1e-5
# (ranks, latent rows per rank or None for the even split, temporal chunk); 3 latent frames per fixture
SPLITS = {2: ({"seedvr2": [5, 3], "wan21": [2, 6], "wan22": [3, 1]}, 2), 3: (None, 1)}
RANDOM_LATENT = (5, 8, 6)  # latent frames, rows, columns: 17 frames, a frame wider than tall


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    error, scale = (got - want).abs().max().item(), max(1.0, want.abs().max().item())
    assert error <= RTOL * scale, f"max error {error:.2e} at output magnitude {scale:.2f}"


def _inputs(family: str):
    video_file, video_key, latent_file, latent_key = FIXTURES[family]
    return tensors(family, video_file)[video_key], tensors(family, latent_file)[latent_key]


def _random_latent(model) -> torch.Tensor:
    t, h, w = RANDOM_LATENT
    return torch.randn(1, model.latent_channels, t, h, w, generator=torch.Generator().manual_seed(20))


# The collectives of torch.distributed that take tensors. In the ranks each is replaced by one that refuses a
# tensor off the run's device, as an NCCL group refuses a CPU tensor ("No backend type associated with device
# type cpu"), where gloo on the CPU takes it (isend/irecv are checked inside batch_isend_irecv: P2POp takes
# the real ones only).
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "reduce",
               "gather", "scatter", "all_to_all_single", "send", "recv", "batch_isend_irecv")


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dist.P2POp):
        yield value.tensor
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def check_collective_devices(device: torch.device) -> dict[str, int]:
    """Make this process's collectives raise on a tensor that is not on `device`; returns their calls so far,
    by name, as they are made."""
    calls = {}

    def checked(name, real):
        def collective(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            for tensor in _tensors([*args, *kwargs.values()]):
                if tensor.device != device:
                    raise RuntimeError(f"dist.{name} was given a tensor on {tensor.device}; the run is on {device}: "
                                       "an NCCL group would refuse it")
            return real(*args, **kwargs)
        return collective

    for name in COLLECTIVES:
        setattr(dist, name, checked(name, getattr(dist, name)))
    return calls


class FactoriesOnMeta:
    """torch as vae/distributed/row_bands.py sees it in the ranks: a tensor it makes without a device is on
    the meta device. On a CPU run such a tensor would be on the run's device by chance, unseen by the
    collectives' check; on a GPU it is on the CPU, which an NCCL group refuses."""

    FACTORIES = ("tensor", "as_tensor", "empty", "zeros", "ones", "full", "arange")

    def __getattr__(self, name: str):
        real = getattr(torch, name)
        if name not in self.FACTORIES:
            return real
        return lambda *args, device=None, **kwargs: real(*args, device=device or "meta", **kwargs)


def _rank_main(rank: int, store: str, results) -> None:
    """Every case on this rank of a 3-process gloo world, every collective's tensors checked to be on the
    run's device (the CPU); rank 0 puts what it gathered into `results`."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=3)
    calls = check_collective_devices(torch.device("cpu"))
    row_bands.torch = FactoriesOnMeta()
    pair = dist.new_group([0, 1])
    found = {}
    for family in FAMILIES:
        model = load_tiny(family)
        video, z = _inputs(family)
        for ranks, (rows, chunk) in SPLITS.items():
            if rank >= ranks:
                continue
            group = pair if ranks == 2 else None
            split = rows[family] if rows else None
            found[family, ranks, "decode"] = vae.decode(model, z, Settings(temporal_chunk=chunk),
                                                        bands=RowBands(group, rows=split))
            found[family, ranks, "encode"] = vae.encode(model, video, Settings(temporal_chunk=3 - chunk),
                                                        bands=RowBands(group, rows=split), return_logvar=True)
        found[family, 3, "random"] = vae.decode(model, _random_latent(model), Settings(temporal_chunk=2), num_frames=15,
                                                height=60, width=45, bands=RowBands())
        found[family, 3, "budget"] = vae.decode(model, z, Settings(memory_budget=48 * 2**20), bands=RowBands())
        ndhwc = vae.Optimizations(activation_layout="ndhwc")  # halo rows exchanged between NDHWC bands
        found[family, 3, "ndhwc"] = (vae.encode(model, video, Settings(temporal_chunk=2), bands=RowBands(), opts=ndhwc),
                                     vae.decode(model, z, Settings(temporal_chunk=1), bands=RowBands(), opts=ndhwc))
    model = load_tiny("seedvr2")
    found["bands"] = vae.decode(model, _inputs("seedvr2")[1], Settings(temporal_chunk=2), bands=RowBands(gather=False))
    try:  # ranks that disagree on the settings: every rank refuses, none waits
        vae.decode(model, _inputs("seedvr2")[1], Settings(temporal_chunk=1 + rank), bands=RowBands())
    except ValueError as error:
        found["disagree"] = str(error)
    bands, checked = [None] * 3, [None] * 3
    dist.all_gather_object(bands, found.pop("bands"))  # not through the checked collectives (c10d's own)
    dist.all_gather_object(checked, calls)
    if rank == 0:
        # As bytes: a queued tensor travels as a file descriptor that this process must still hand
        # over when the parent unpickles it, and by then it may have exited.
        payload = io.BytesIO()
        torch.save({**found, "bands": bands, "collectives": checked}, payload)
        results.put(payload.getvalue())
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def gathered(tmp_path_factory):
    """What rank 0 of the spawned world gathered, per case."""
    context = mp.get_context("spawn")
    results = context.Queue()
    store = str(tmp_path_factory.mktemp("distributed") / "store")
    processes = mp.start_processes(_rank_main, args=(store, results), nprocs=3, join=False, start_method="spawn")
    try:
        deadline = time.monotonic() + 300
        while True:  # a rank that failed ends the wait at once (join raises with its traceback)
            try:
                payload = results.get(timeout=1)
                break
            except queue.Empty:
                processes.join(0)
                if time.monotonic() > deadline:
                    raise TimeoutError("the ranks gave no result in 300 s") from None
        found = torch.load(io.BytesIO(payload), weights_only=True)
        processes.join(60)
    finally:
        for process in processes.processes:
            process.kill()
    return found


@pytest.fixture(scope="module")
def single():
    """Untiled single-process encode (mean, logvar) and decode of each family's fixture."""
    found = {}
    for family in FAMILIES:
        model = load_tiny(family)
        video, z = _inputs(family)
        found[family] = vae.encode(model, video, return_logvar=True), vae.decode(model, z), model
    return found


@pytest.mark.parametrize("ranks", sorted(SPLITS))
@pytest.mark.parametrize("family", FAMILIES)
def test_split_decode_equals_single_process_untiled(gathered, single, family, ranks):
    got = gathered[family, ranks, "decode"]
    assert got.shape == single[family][1].shape
    assert_same(got, single[family][1])


@pytest.mark.parametrize("ranks", sorted(SPLITS))
@pytest.mark.parametrize("family", FAMILIES)
def test_split_encode_equals_single_process_untiled(gathered, single, family, ranks):
    for got, want in zip(gathered[family, ranks, "encode"], single[family][0]):
        assert got.shape == want.shape
        assert_same(got, want)


@pytest.mark.parametrize("family", FAMILIES)
def test_split_decode_of_a_longer_wider_latent_trims_like_the_engine(gathered, single, family):
    model = single[family][2]
    want = vae.decode(model, _random_latent(model), Settings(temporal_chunk=5), num_frames=15, height=60, width=45)
    assert gathered[family, 3, "random"].shape == want.shape
    assert_same(gathered[family, 3, "random"], want)


@pytest.mark.parametrize("family", FAMILIES)
def test_split_decode_within_a_memory_budget_per_rank(gathered, single, family):
    assert_same(gathered[family, 3, "budget"], single[family][1])


@pytest.mark.parametrize("family", FAMILIES)
def test_split_runs_with_channels_last_activations_equal_single_process(gathered, single, family):
    mean, decoded = gathered[family, 3, "ndhwc"]
    assert_same(mean, single[family][0][0])
    assert_same(decoded, single[family][1])


def test_each_rank_keeps_its_band_of_rows_when_not_gathered(gathered, single):
    bands = gathered["bands"]
    assert [b.shape[3] for b in bands] == [16, 24, 24]  # 8 latent rows split 2 + 3 + 3, x8 pixels
    assert_same(torch.cat(bands, dim=3), single["seedvr2"][1])


def test_ranks_given_different_settings_all_refuse(gathered):
    assert "different" in gathered["disagree"] and "every rank must call with the same" in gathered["disagree"]


def test_every_collective_takes_tensors_on_the_runs_device(gathered):
    """Every rank ran every case with its collectives checked (a tensor off the run's device stops that rank
    and fails `gathered`); here: the check saw each kind of collective the bands use, on every rank."""
    for calls in gathered["collectives"]:
        assert {"all_reduce", "all_gather", "batch_isend_irecv"} <= set(calls), calls
    assert "send" in gathered["collectives"][1] and "recv" in gathered["collectives"][0]  # the output gathered


def test_bands_reject_more_ranks_than_rows():
    with pytest.raises(ValueError, match="every rank needs at least one row"):
        Bands.split(2, 3)
    assert Bands.split(8, 3).edges == (0, 2, 5, 8)


# The workers' settings: other kernels than the defaults (unfused norms, no Winograd).
WORKER_OPTS = vae.Optimizations(fused_norm_act=False, winograd_conv=False)


@pytest.fixture(scope="module")
def workers():
    """Two CPU workers running WORKER_OPTS."""
    model = load_tiny("seedvr2")
    pool = RankWorkers(model, ["cpu", "cpu"], opts=WORKER_OPTS, timeout=60, threads=1)
    yield model, pool
    pool.close()


def test_worker_processes_decode_and_encode_like_one_process(workers):
    """Against one untiled process with the same settings: kernels that differ (fused vs unfused norms)
    round differently, which is not what this test is about."""
    model, pool = workers
    video, z = _inputs("seedvr2")
    steps = []
    got = pool.decode(z, temporal_chunk=1, progress=lambda done, total: steps.append((done, total)))
    assert steps == [(1, 3), (2, 3), (3, 3)]
    assert_same(got, vae.decode(model, z, opts=WORKER_OPTS))
    mean, logvar = pool.encode(video, temporal_chunk=2, return_logvar=True)
    want_mean, want_logvar = vae.encode(model, video, return_logvar=True, opts=WORKER_OPTS)
    assert_same(mean, want_mean)
    assert_same(logvar, want_logvar)


def worker_processes(parent: int | None = None) -> list:
    """The running `vae.distributed.workers` processes under `parent` (default: this process; zombies not counted)."""
    found = []
    for child in psutil.Process(parent).children(recursive=True):
        try:
            if "vae.distributed.workers" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def _assert_all_stopped(pool) -> None:
    assert all(p.poll() is not None for p in pool.procs), "a worker process was left running"
    assert not worker_processes()
    assert not os.path.exists(pool.store), "the shared files were left behind"


def test_a_rank_killed_mid_decode_stops_all_within_seconds(workers):
    model, pool = workers
    victim = pool.procs[1].pid

    def kill_rank_1(done, total):
        if done == 1:
            os.kill(victim, signal.SIGKILL)

    start = time.monotonic()
    with pytest.raises(WorkerFailed, match=r"rank 1 \(cpu\) failed: the process exited \(SIGKILL"):
        pool.decode(_inputs("seedvr2")[1], temporal_chunk=1, progress=kill_rank_1)
    assert time.monotonic() - start < 10
    _assert_all_stopped(pool)
    with pytest.raises(WorkerFailed, match="start new ones"):
        pool.decode(_inputs("seedvr2")[1])


def test_a_rank_failing_at_start_reports_its_message_and_stops_all():
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match=r"rank 1 \(cuda:9\) failed: ValueError: cuda:9 is not available"):
        RankWorkers(load_tiny("wan21"), ["cpu", "cuda:9"], timeout=60, threads=1)
    assert time.monotonic() - start < 30
    assert not worker_processes()


def test_cancel_stops_the_workers():
    pool = RankWorkers(load_tiny("wan22"), ["cpu", "cpu"], timeout=60, threads=1)
    steps = []
    with pytest.raises(Cancelled):
        pool.decode(_inputs("wan22")[1], temporal_chunk=1, progress=lambda done, total: steps.append(done),
                    cancel=lambda: bool(steps))
    _assert_all_stopped(pool)
