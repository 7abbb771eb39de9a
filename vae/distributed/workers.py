"""One worker process per device, together one torch.distributed group running the engine
with row bands (`distributed.RowBands`), for a
caller that is a single process (ComfyUI): `RankWorkers(model, ["cuda:0", "cuda:1"]).decode(z)`.

The workers are plain subprocesses (`python -m vae.distributed.workers`, the repository root on the path), so a host
process that initialised CUDA or whose main module must not be re-imported (ComfyUI's main.py) is never
forked or re-run. Each worker talks to the caller over its own socket pair (small messages saved with
torch.save and read back with weights_only=True); the group's rendezvous is a file store. Large tensors
travel through files mapped by every process (/dev/shm where it exists): the video to encode is written
once and each rank reads its band of rows, and rank 0 writes decoded chunks into the mapped output and
announces each one, so the caller receives frames while the next chunk decodes.

Failure: a rank that raises sends its message and exits; a rank that dies is seen by the caller within a
poll interval; either way the caller stops every worker and raises the failing rank's message
(`WorkerFailed`). Cancellation (`cancel()` polled by the caller) also stops the workers. The next call
starts new ones.
"""
import dataclasses
import io
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path

import torch
import torch.distributed as dist

from ..kernels import Optimizations
from ..kernels.backend import host_free
from ..run.geometry import pixel_frames
from ..run.progress import Cancelled

POLL_S = 0.1
ROOT = Path(__file__).resolve().parents[2]  # the directory holding `vae`
# Host memory of one worker process besides its weights: the Python and torch runtime (a CPU worker of
# the tiny test model measured 0.33 GiB on Linux, torch 2.13), and CUDA's host side for a GPU worker.
WORKER_HOST_BYTES = {"cpu": int(0.35 * 2**30), "cuda": int(1.5 * 2**30)}


class WorkerFailed(RuntimeError):
    """A worker rank failed or died; the message is the failing rank's, and every worker has been stopped."""


def _send(conn: Connection, message: dict) -> None:
    data = io.BytesIO()
    torch.save(message, data)
    conn.send_bytes(data.getbuffer())


def _recv(conn: Connection) -> dict:
    return torch.load(io.BytesIO(conn.recv_bytes()), weights_only=True)


def _shared_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _mapped(path: str, shape, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `shape` backed by the file at `path`, shared with every process that maps it."""
    return torch.from_file(path, shared=True, size=math.prod(shape), dtype=dtype).view(shape)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cpu_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class RankWorkers:
    """Worker processes on `devices` (e.g. ["cuda:0", "cuda:1"], or ["cpu", "cpu"]) holding a copy of
    `model` (its weights, dtypes and config), running with the kernels `opts` (default `Optimizations()`).
    NCCL when every device is CUDA, else gloo. `timeout` (seconds) bounds every collective and the start. `threads`: torch threads per
    CPU worker (default: the CPU cores shared out)."""

    def __init__(self, model, devices, *, opts: Optimizations | None = None, timeout: float = 120.0,
                 threads: int | None = None):
        self.devices = [str(torch.device(d)) for d in devices]
        if len(self.devices) < 2:
            raise ValueError(f"RankWorkers needs at least two devices, got {self.devices}")
        self.check_machine(self.devices, sum(t.numel() * t.element_size() for t in model.state_dict().values()))
        self.timeout = timeout
        self.spatial_factor, self.temporal_factor = model.spatial_factor, model.temporal_factor
        self.store = tempfile.mkdtemp(prefix="streamvae-ranks-", dir=_shared_dir())
        backend = "nccl" if all(d.startswith("cuda") for d in self.devices) else "gloo"
        threads = threads or max(1, (os.cpu_count() or 1) // len(self.devices))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        self.procs, self.conns = [], []
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.conns, self.store)
        for rank, device in enumerate(self.devices):
            mine, theirs = socket.socketpair()
            args = [sys.executable, "-m", "vae.distributed.workers", str(theirs.fileno()), str(rank), str(len(self.devices)), device,
                    backend, os.path.join(self.store, "rendezvous"), str(timeout), str(threads)]
            self.procs.append(subprocess.Popen(args, cwd=str(ROOT), env=env, pass_fds=[theirs.fileno()]))
            theirs.close()
            self.conns.append(Connection(mine.detach()))
        state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
        setup = {"family": model.family, "config": dataclasses.asdict(model.config),
                 "opts": dataclasses.asdict(opts or Optimizations()), "state": state}
        try:
            for conn in self.conns:
                _send(conn, setup)
        except OSError:
            pass  # a worker that died at start is reported by _run
        self._run(None, lambda rank, message: None, None, "start")

    @staticmethod
    def check_machine(devices, weight_bytes: int) -> None:
        """ValueError, before any process starts, when worker processes on `devices` cannot run on this
        machine: more CPU ranks than CPU cores (each would wait on the others), or more host memory than
        is free (each worker is a torch process that receives a copy of the `weight_bytes` of weights
        and holds it once more as it loads them; a CPU worker keeps it)."""
        devices = [str(torch.device(d)) for d in devices]
        cpus, cores = sum(d == "cpu" for d in devices), cpu_cores()
        if cpus > cores:
            raise ValueError(f"{cpus} CPU workers, but this machine has {cores} CPU core{'s' if cores > 1 else ''}: "
                             f"CPU ranks share its cores (they are for testing); give at most {cores}")
        needed = sum(WORKER_HOST_BYTES["cpu" if d == "cpu" else "cuda"] + 2 * weight_bytes for d in devices)
        free = host_free()
        if needed > free:
            raise ValueError(f"{len(devices)} worker processes need about {needed / 2**30:.1f} GiB of RAM (each a "
                             f"torch process with a copy of the weights), but {free / 2**30:.1f} GiB are free: use "
                             "fewer devices, or free memory")

    @staticmethod
    def check_split(ranks: int, latent_rows: int) -> None:
        """ValueError when a frame of `latent_rows` latent rows cannot be split into `ranks` row bands
        (each rank computes at least one latent row), before anything is sent to a worker."""
        if latent_rows < ranks:
            rows, most = f"{latent_rows} latent row{'s' if latent_rows != 1 else ''}", max(latent_rows, 1)
            raise ValueError(f"this frame is {rows} tall, too short to split over {ranks} devices (each computes at "
                             f"least one latent row): use at most {most} device{'s' if most != 1 else ''} (one: leave "
                             "Load VAE's devices unconnected), or a taller frame")

    @property
    def alive(self) -> bool:
        return self._finalizer.alive and all(p.poll() is None for p in self.procs)

    def close(self) -> None:
        """Stop every worker (SIGKILL after a short grace) and remove the shared files."""
        self._finalizer()

    def _run(self, jobs, on_message, cancel, what: str) -> None:
        """Send jobs[r] to rank r (None: only wait), then handle messages until every rank said "done"."""
        self._check_running()
        try:
            if jobs is not None:
                for conn, job in zip(self.conns, jobs):
                    _send(conn, job)
            pending = set(range(len(self.conns)))
            started = time.monotonic()
            while pending:
                for conn in wait([self.conns[r] for r in pending], timeout=POLL_S):
                    rank = self.conns.index(conn)
                    try:
                        message = _recv(conn)
                    except (EOFError, OSError):
                        self._fail(what)
                    if message["kind"] == "error":
                        self._fail(what, first=message)
                    if message["kind"] == "done":
                        pending.discard(rank)
                    on_message(rank, message)
                if cancel is not None and cancel():
                    raise Cancelled(f"cancelled: the {len(self.procs)} workers were stopped")
                if any(p.poll() is not None for p in self.procs):
                    self._fail(what)
                if what == "start" and time.monotonic() - started > self.timeout:
                    raise WorkerFailed(f"the workers on {self.devices} did not start within {self.timeout:.0f} s")
        except BaseException:
            self.close()
            raise

    def _fail(self, what: str, first: dict | None = None):
        """Raise the most telling failure: a rank's own error over a dead rank over a rank that only saw
        a peer fail (those are collected for up to a second)."""
        errors = [first] if first else []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not any(not e["secondary"] for e in errors):
            for conn in wait(self.conns, timeout=POLL_S):
                try:
                    message = _recv(conn)
                except (EOFError, OSError):
                    continue
                if message["kind"] == "error":
                    errors.append(message)
        primary = [e for e in errors if not e["secondary"]]
        dead = [(r, p.poll()) for r, p in enumerate(self.procs) if p.poll() is not None and p.poll() != 1]
        if primary:
            rank, text = primary[0]["rank"], primary[0]["message"]
        elif dead:
            rank, code = dead[0]
            name = signal.Signals(-code).name if code < 0 else f"exit code {code}"
            text = f"the process exited ({name}; killed, or out of host memory?)"
        elif errors:
            rank, text = errors[0]["rank"], errors[0]["message"]
        else:
            rank, text = None, "a worker closed its connection"
        self.close()
        who = f"rank {rank} ({self.devices[rank]})" if rank is not None else "a worker"
        raise WorkerFailed(f"StreamVAE {what} on {len(self.devices)} devices: {who} failed: {text}\n"
                           f"All {len(self.devices)} worker processes were stopped; fix the cause (or use one device) "
                           "and run again.")

    def decode(self, z: torch.Tensor, *, temporal_chunk=None, num_frames=None, height=None, width=None, out=None,
               sink=None, out_dtype=None, progress=None, cancel=None) -> torch.Tensor | None:
        """Raw latent B,C,T',h,w -> pixels B,3,T,H,W, as `vae.decode` with `bands=RowBands()`: written
        into `out` (or a new tensor on z's device) chunk by chunk as rank 0 announces them, or handed to
        `sink(first, frames)`. `progress(done, total)` per chunk; `cancel()` stops the workers."""
        b, _, n_lat, h, w = z.shape
        self.check_split(len(self.devices), h)
        shape = (b, 3, num_frames or pixel_frames(n_lat, self.temporal_factor), height or h * self.spatial_factor,
                 width or w * self.spatial_factor)
        dtype = out.dtype if out is not None else out_dtype or (z.dtype if z.dtype.is_floating_point else torch.float32)
        if out is None and sink is None:
            out = torch.empty(shape, dtype=dtype, device=z.device)
        frames = self._shared("frames", shape, dtype)

        def on_message(rank, message):
            if message["kind"] == "chunk":
                first, count = message["first"], message["count"]
                part = frames[:, :, first:first + count]
                sink(first, part) if sink is not None else out[:, :, first:first + count].copy_(part)
            elif message["kind"] == "progress" and progress is not None:
                progress(message["done"], message["total"])

        job = {"op": "decode", "z": z.detach().to("cpu"), "frames": self._path("frames"), "shape": shape,
               "dtype": _dtype_name(dtype), "temporal_chunk": temporal_chunk, "num_frames": num_frames,
               "height": height, "width": width}
        self._run([job] * len(self.conns), on_message, cancel, "decode")
        return out

    def encode(self, video: torch.Tensor, *, temporal_chunk=None, return_logvar=False, progress=None, cancel=None):
        """Pixels B,3,T,H,W in [-1, 1] -> raw posterior mean (and logvar), as `vae.encode` with
        `bands=RowBands()`; the video is written once into a shared file and every rank reads its rows."""
        self.check_split(len(self.devices), -(-video.shape[3] // self.spatial_factor))
        dtype = video.dtype if video.dtype.is_floating_point else torch.float32
        self._shared("video", tuple(video.shape), dtype).copy_(video)
        result = {}

        def on_message(rank, message):
            if message["kind"] == "done" and "result" in message:
                result["moments"] = message["result"]
            elif message["kind"] == "progress" and progress is not None:
                progress(message["done"], message["total"])

        job = {"op": "encode", "video": self._path("video"), "shape": tuple(video.shape), "dtype": _dtype_name(dtype),
               "temporal_chunk": temporal_chunk, "return_logvar": return_logvar}
        self._run([job] * len(self.conns), on_message, cancel, "encode")
        moments = [m.to(video.device) for m in result["moments"]]
        return tuple(moments) if return_logvar else moments[0]

    def _check_running(self) -> None:
        if not self._finalizer.alive:
            raise WorkerFailed("these workers were stopped after an earlier failure or cancel; start new ones")

    def _path(self, name: str) -> str:
        return os.path.join(self.store, name)

    def _shared(self, name: str, shape, dtype: torch.dtype) -> torch.Tensor:
        """A new file-backed tensor the workers map by name (replacing an earlier one of that name)."""
        self._check_running()
        with open(self._path(name), "wb") as file:
            file.truncate(math.prod(shape) * torch.empty((), dtype=dtype).element_size())
        return _mapped(self._path(name), shape, dtype)


def _stop(procs, conns, store: str) -> None:
    """SIGTERM every worker still running, SIGKILL what is left after 2 s; close the sockets and files."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + 2.0
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for conn in conns:
        conn.close()
    shutil.rmtree(store, ignore_errors=True)


# --- the worker side: `python -m vae.distributed.workers FD RANK WORLD DEVICE BACKEND STORE TIMEOUT THREADS` ----------

def _build(setup: dict, device: torch.device):
    """The caller's model rebuilt from its config and weights (dtypes kept) on `device`."""
    from ..loading import FAMILIES
    family = next(cls for cls in FAMILIES if cls.family == setup["family"])
    config = family.config_from_state_dict(setup["state"], setup["config"])
    with torch.device("meta"):
        model = family(config)
    model.load_state_dict(setup["state"], strict=True, assign=True)
    return model.to(device).eval()


def _serve(conn: Connection, model, opts: Optimizations, job: dict, rank: int) -> dict:
    """Run one job on this rank; the "done" message (rank 0 of an encode: with the result)."""
    from ..run.engine import decode, encode
    from ..run.planning import Settings
    from .row_bands import RowBands

    settings = Settings(temporal_chunk=job["temporal_chunk"])

    def progress(done, total):
        if rank == 0:
            _send(conn, {"kind": "progress", "done": done, "total": total})

    if job["op"] == "decode":
        frames = _mapped(job["frames"], job["shape"], getattr(torch, job["dtype"])) if rank == 0 else None

        def sink(first, part):
            frames[:, :, first:first + part.shape[2]].copy_(part)
            _send(conn, {"kind": "chunk", "first": first, "count": part.shape[2]})

        decode(model, job["z"], settings, num_frames=job["num_frames"], height=job["height"], width=job["width"],
               sink=sink if rank == 0 else None, bands=RowBands(), progress=progress, opts=opts)
        return {"kind": "done"}
    video = _mapped(job["video"], job["shape"], getattr(torch, job["dtype"]))
    moments = encode(model, video, settings, return_logvar=job["return_logvar"], bands=RowBands(), progress=progress,
                     opts=opts)
    if rank:
        return {"kind": "done"}
    return {"kind": "done", "result": list(moments) if job["return_logvar"] else [moments]}


def _after_peer_failure(error: BaseException) -> bool:
    """Whether `error` is how a collective reports that another rank failed (gloo: the peer closed or
    reset the connection; NCCL: a timeout or an aborted communicator), not a failure of this rank."""
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        phrase in text for phrase in ("Connection reset by peer", "Connection closed by peer", "Socket Timeout",
                                      "NCCL communicator was aborted", "Watchdog caught collective operation timeout"))


def main(argv: list[str]) -> None:
    fd, rank, world, device, backend, store, timeout, threads = argv
    conn, rank = Connection(int(fd)), int(rank)
    try:
        torch.set_num_threads(int(threads))
        device = torch.device(device)
        if device.type == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if (device.index or 0) >= count:
                raise ValueError(f"{device} is not available in this process: torch sees {count} CUDA device(s)")
            torch.cuda.set_device(device)
        setup = _recv(conn)  # read first: the caller sends every rank its copy before we meet
        model, opts = _build(setup, device), Optimizations(**setup["opts"])
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=int(world),
                                timeout=timedelta(seconds=float(timeout)))
        _send(conn, {"kind": "done"})
        while True:
            try:
                job = _recv(conn)
            except EOFError:  # the caller closed the connection or died
                return
            _send(conn, _serve(conn, model, opts, job, rank))
    except BaseException as error:  # reported to the caller, which stops every rank
        traceback.print_exc()
        try:
            _send(conn, {"kind": "error", "rank": rank, "message": f"{type(error).__name__}: {error}",
                         "secondary": _after_peer_failure(error)})
        except OSError:
            pass
        os._exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
