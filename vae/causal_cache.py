"""Where the causal caches live between chunks: on the compute device, or offloaded.

Between two chunks every temporal module keeps the input frames the next chunk still reads
(`blocks.CausalConv3d`: the last kt - 1 frames of its input, whole frame). Summed over a decoder
they are the largest tensors a streamed decode holds (SeedVR2, fp32: about 17 KiB per output pixel,
1.6 GiB at 256x384 and over 30 GiB at 1080p), and exact tiling cannot cut them, because the next
chunk's tiles read them with halos. Offloaded, only the cache of the module that is running is on
the compute device (its old frames while it reads them, its new ones until they are stored):

- "none": on the compute device.
- "host": CPU memory for a GPU: pinned (page-locked) buffers copied with non-blocking transfers,
  pageable ones where pinning fails, within the RAM the machine has free (past that: disk). With
  CPU compute the device is the host, so this is "none".
- "disk": a temporary file in the temp directory (TMPDIR; any device; with CPU compute the one
  memory outside the process; the operating system may keep it in its reclaimable page cache).
"""
import contextlib
import logging
import tempfile
import warnings

import torch
import torch.nn as nn

from .devices import host_available

CACHE_OFFLOADS = ("none", "host", "disk")
log = logging.getLogger("streamvae")


def check_offload(value: str) -> str:
    """A user's `cache_offload`: "auto" (decided by the memory plan) or one of CACHE_OFFLOADS."""
    if value != "auto" and value not in CACHE_OFFLOADS:
        raise ValueError(f"cache_offload must be 'auto' or one of {CACHE_OFFLOADS}, got {value!r}")
    return value


def _raw(t: torch.Tensor):
    """The bytes of a contiguous CPU tensor as a writable buffer (no copy)."""
    return t.reshape(-1).view(torch.uint8).numpy()


class _DiskStore:
    """Tensors in one temporary file. A key keeps its slot (also when popped) and reuses it while its
    tensor fits, so the file stays as large as one set of caches, however long the clip."""

    def __init__(self):
        self.file = tempfile.TemporaryFile(prefix="streamvae-cache-")
        self.slots: dict[nn.Module, tuple[int, int]] = {}  # offset, capacity in bytes
        self.live: dict[nn.Module, tuple[torch.Size, torch.dtype]] = {}
        self.end = 0

    def put(self, key, frames: torch.Tensor, owned: bool = False) -> None:
        host = frames.detach().to("cpu").contiguous()
        offset, capacity = self.slots.get(key, (self.end, 0))
        if capacity < host.nbytes:
            offset, capacity = self.end, host.nbytes
            self.end += capacity
        self.file.seek(offset)
        self.file.write(_raw(host))
        self.slots[key], self.live[key] = (offset, capacity), (host.shape, host.dtype)

    def get(self, key, device) -> torch.Tensor:
        shape, dtype = self.live[key]
        host = torch.empty(shape, dtype=dtype)
        self.file.seek(self.slots[key][0])
        if self.file.readinto(_raw(host)) != host.nbytes:
            raise OSError(f"StreamVAE: the causal-cache file {self.file.name} came back short; is its disk full?")
        return host.to(device)

    def discard(self, key) -> None:
        self.live.pop(key, None)  # the slot stays for the key's next put

    def keys(self):
        return self.live.keys()

    def sizes(self):
        return [(shape, shape.numel() * dtype.itemsize) for shape, dtype in self.live.values()]

    def close(self) -> None:
        self.live.clear()
        self.file.close()


class _DeviceStore:
    """Tensors kept where they are (the compute device)."""

    def __init__(self):
        self.held: dict[nn.Module, torch.Tensor] = {}

    def put(self, key, frames: torch.Tensor, owned: bool) -> None:
        self.held[key] = frames if owned else frames.clone()

    def get(self, key, device) -> torch.Tensor:
        return self.held[key]

    def discard(self, key) -> None:
        self.held.pop(key, None)

    def keys(self):
        return self.held.keys()

    def sizes(self):
        return [(t.shape, t.nbytes) for t in self.held.values()]

    def close(self) -> None:
        self.held.clear()


class _HostStore:
    """Tensors in host memory for a GPU, within `budget_bytes` of RAM: page-locked (pinned) buffers,
    one per module and reused while its shape stays, filled and read with non-blocking copies in
    stream order; pageable buffers where pinning fails (pinned memory is a scarce kind of RAM, and
    a failed pin raises a RuntimeError rather than an out-of-memory error); the disk for what does
    not fit the budget or cannot be allocated at all. The budget keeps the machine out of swap."""

    def __init__(self, budget_bytes: int):
        self.left = budget_bytes
        self.pin = True
        self.held: dict[nn.Module, torch.Tensor] = {}
        self.disk: _DiskStore | None = None

    def _buffer(self, frames: torch.Tensor) -> torch.Tensor | None:
        """A host buffer for `frames` (pinned if possible), or None when the host has no room."""
        if frames.nbytes > self.left:
            return None
        if self.pin:
            try:
                return torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
            except RuntimeError as error:
                self.pin = False
                message = (f"StreamVAE: could not pin host memory for the causal caches ({str(error).strip()[:200]}); "
                           "using pageable memory (slower copies, same result)")
                log.warning(message)
                warnings.warn(message, RuntimeWarning, stacklevel=4)
        try:
            return torch.empty(frames.shape, dtype=frames.dtype)
        except (RuntimeError, MemoryError):
            return None

    def put(self, key, frames: torch.Tensor, owned: bool) -> None:
        held = self.held.get(key)
        if held is None or held.shape != frames.shape or held.dtype != frames.dtype:
            if held is not None:
                self.discard(key)
            held = self._buffer(frames)
            if held is None:
                self.disk = self.disk or _DiskStore()
                self.disk.put(key, frames)
                return
            self.held[key] = held
            self.left -= held.nbytes
        held.copy_(frames, non_blocking=held.is_pinned())

    def get(self, key, device) -> torch.Tensor:
        held = self.held.get(key)
        if held is None:
            return self.disk.get(key, device)
        return held.to(device, non_blocking=held.is_pinned())

    def discard(self, key) -> None:
        held = self.held.pop(key, None)
        if held is not None:
            self.left += held.nbytes
        if self.disk is not None:
            self.disk.live.pop(key, None)

    def keys(self):
        return self.held.keys() | (self.disk.live.keys() if self.disk is not None else set())

    def sizes(self):
        return [(t.shape, t.nbytes) for t in self.held.values()] + (self.disk.sizes() if self.disk else [])

    def close(self) -> None:
        for key in list(self.held):
            self.discard(key)
        if self.disk is not None:
            self.disk.close()


class CausalCache:
    """What each temporal module remembers between chunks (see module docstring for `offload`).

    `get` returns a tensor on the compute device that the caller may only read; `put` stores a copy
    of `frames` (with `owned=True` the caller hands over a tensor nobody else writes, which the
    on-device store then keeps without copying). `fallback` is the offload an out-of-memory retry may
    switch to (None: the user chose where the caches live). `host_budget` caps the RAM that "host"
    offloading takes (default: `devices.host_available()`, what the OS has free minus a margin);
    past it the caches go to disk.
    """

    def __init__(self, offload: str = "none", device=None, fallback: str | None = None, host_budget: int | None = None):
        if offload not in CACHE_OFFLOADS:
            raise ValueError(f"cache_offload must be one of {CACHE_OFFLOADS}, got {offload!r}")
        self.device = torch.device(device if device is not None else "cpu")
        if offload == "host" and self.device.type == "cpu":
            offload = "none"
        self.offload = offload
        self.fallback = fallback if fallback != offload else None
        if offload == "host":
            self._store = _HostStore(host_available() if host_budget is None else host_budget)
        else:
            self._store = _DiskStore() if offload == "disk" else _DeviceStore()

    def __contains__(self, module) -> bool:
        return module in self._store.keys()

    def get(self, module) -> torch.Tensor | None:
        return self._store.get(module, self.device) if module in self else None

    def put(self, module, frames: torch.Tensor, owned: bool = False) -> None:
        self._store.put(module, frames, owned)

    def pop(self, module) -> torch.Tensor | None:
        frames = self.get(module)
        self._store.discard(module)
        return frames

    def clear(self) -> None:
        for module in list(self._store.keys()):
            self._store.discard(module)

    @contextlib.contextmanager
    def copying_new_entries(self):
        """Within the block, what is stored on the compute device is replaced by copies when it ends.
        For a compiled block that replays a CUDA graph: the tensors it stores are the graph's outputs,
        which live in the graph's memory pool and are overwritten by a later replay."""
        if not isinstance(self._store, _DeviceStore):
            yield
            return
        before = dict(self._store.held)
        yield
        stored = [key for key, frames in self._store.held.items() if before.get(key) is not frames]
        for key in stored:
            self._store.held[key] = self._store.held[key].clone()

    def sizes(self) -> list[tuple[torch.Size, int]]:
        """(shape, bytes) of every stored tensor."""
        return self._store.sizes()

    def close(self) -> None:
        """Drop everything (and the disk file, if any)."""
        self._store.close()
