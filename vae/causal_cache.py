"""Where the causal caches live between chunks: on the compute device, or offloaded.

Between two chunks every temporal module keeps the input frames the next chunk still reads
(`blocks.CausalConv3d`: the last kt - 1 frames of its input, whole frame). Summed over a decoder
they are the largest tensors a streamed decode holds (SeedVR2, fp32: about 17 KiB per output pixel,
1.6 GiB at 256x384 and over 30 GiB at 1080p), and exact tiling cannot cut them, because the next
chunk's tiles read them with halos. Offloaded, only the cache of the module that is running is on
the compute device (its old frames while it reads them, its new ones until they are stored):

- "none": on the compute device.
- "host": pinned CPU memory, copied with non-blocking transfers (for CUDA; with CPU compute the
  device is the host, so this is "none").
- "disk": a temporary file in the temp directory (TMPDIR; any device; with CPU compute the one
  memory outside the process; the operating system may keep it in its reclaimable page cache).
"""
import tempfile

import torch
import torch.nn as nn

CACHE_OFFLOADS = ("none", "host", "disk")


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

    def put(self, key, frames: torch.Tensor) -> None:
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

    def sizes(self):
        return [(shape, shape.numel() * dtype.itemsize) for shape, dtype in self.live.values()]

    def close(self) -> None:
        self.file.close()


class CausalCache:
    """What each temporal module remembers between chunks (see module docstring for `offload`).

    `get` returns a tensor on the compute device that the caller may only read; `put` stores a copy
    of `frames` (with `owned=True` the caller hands over a tensor nobody else writes, which the
    on-device store then keeps without copying). `fallback` is the offload an out-of-memory retry may
    switch to (None: the user chose where the caches live).
    """

    def __init__(self, offload: str = "none", device=None, fallback: str | None = None):
        if offload not in CACHE_OFFLOADS:
            raise ValueError(f"cache_offload must be one of {CACHE_OFFLOADS}, got {offload!r}")
        self.device = torch.device(device if device is not None else "cpu")
        if offload == "host" and self.device.type == "cpu":
            offload = "none"
        self.offload = offload
        self.fallback = fallback if fallback != offload else None
        self._held: dict[nn.Module, torch.Tensor] = {}  # on the device ("none") or pinned host memory ("host")
        self._disk = _DiskStore() if offload == "disk" else None

    @property
    def _index(self) -> dict:
        """Module -> what is stored for it (the tensor, or the disk store's shape and dtype)."""
        return self._disk.live if self._disk is not None else self._held

    def __contains__(self, module) -> bool:
        return module in self._index

    def get(self, module) -> torch.Tensor | None:
        if module not in self:
            return None
        if self._disk is not None:
            return self._disk.get(module, self.device)
        held = self._held[module]
        return held if self.offload == "none" else held.to(self.device, non_blocking=True)

    def put(self, module, frames: torch.Tensor, owned: bool = False) -> None:
        if self._disk is not None:
            self._disk.put(module, frames)
        elif self.offload == "none":
            self._held[module] = frames if owned else frames.clone()
        else:  # pinned host buffer per module, reused while the shape stays (stream-ordered copies)
            held = self._held.get(module)
            if held is None or held.shape != frames.shape or held.dtype != frames.dtype:
                held = self._held[module] = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
            held.copy_(frames, non_blocking=True)

    def pop(self, module) -> torch.Tensor | None:
        frames = self.get(module)
        self._index.pop(module, None)
        return frames

    def clear(self) -> None:
        self._index.clear()

    def sizes(self) -> list[tuple[torch.Size, int]]:
        """(shape, bytes) of every stored tensor."""
        if self._disk is not None:
            return self._disk.sizes()
        return [(held.shape, held.nbytes) for held in self._held.values()]

    def close(self) -> None:
        """Drop everything (and the disk file, if any)."""
        self.clear()
        if self._disk is not None:
            self._disk.close()
