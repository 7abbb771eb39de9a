"""Where the causal caches live between chunks: on the compute device, or offloaded.

Between two chunks every temporal module keeps the input frames the next chunk still reads
(`blocks.CausalConv3d`: the last kt - 1 frames of its input, whole frame). Summed over a decoder
they are the largest tensors a streamed decode holds (SeedVR2, fp32: about 17 KiB per output pixel,
1.6 GiB at 256x384 and over 30 GiB at 1080p). Offloaded, only the cache of the module that is
running is on the compute device (its old frames while it reads them, its new ones until they are
stored), and under exact tiles only a band of its rows at a time (`rows`, `put_rows`: the next
chunk's tiles read the caches with halos, so a band is the rows one row of tiles reads):

- "none": on the compute device.
- "host": CPU memory for a GPU: pinned (page-locked) buffers, pageable ones where pinning fails,
  within the RAM the machine has free (past that: disk). With CPU compute the device is the host,
  so this is "none".
- "disk": a temporary file in the temp directory (TMPDIR; any device; with CPU compute the one
  memory outside the process; the operating system may keep it in its reclaimable page cache).
  Entries are stored rows first (H,B,C,T,W), so a band of rows is one contiguous read.

The same stores keep the frames that wait their turn when the engine streams a chunk's stages one
frame at a time (`strategies/frame_stream.py`). Closing the cache (the engine does it at the end of
a run, on an error and on a cancel) drops everything: the file goes with it.
"""
import contextlib
import logging
import math
import tempfile
import warnings

import torch

from ..kernels.backend import host_available
from ..kernels.activation_layout import dense_copy, empty_video, is_ndhwc
from .kv_cache import KeyValueCache

CACHE_OFFLOADS = ("none", "host", "disk")
WRITE_BLOCK_BYTES = 16 * 2**20  # a disk write copies at most this much at a time into rows-first order
log = logging.getLogger("streamvae")


def check_offload(value: str) -> str:
    """A user's `cache_offload`: "auto" (decided by the memory plan) or one of CACHE_OFFLOADS."""
    if value != "auto" and value not in CACHE_OFFLOADS:
        raise ValueError(f"cache_offload must be 'auto' or one of {CACHE_OFFLOADS}, got {value!r}")
    return value


def _raw(t: torch.Tensor):
    """The bytes of a contiguous CPU tensor as a writable buffer (no copy)."""
    return t.reshape(-1).view(torch.uint8).numpy()


# An entry on disk is stored rows first, then in its layout: (rows,B,C,T,W), or (rows,B,T,W,C) for NDHWC
# frames, so a band of rows is one contiguous read and comes back in the layout it was written in.
_ROWS_FIRST = {False: (3, 0, 1, 2, 4), True: (3, 0, 2, 4, 1)}  # B,C,T,rows,W -> rows first
_FROM_ROWS_FIRST = {False: (1, 2, 3, 0, 4), True: (1, 4, 2, 0, 3)}  # and back


def _whole(shape, height: int) -> torch.Size:
    """The shape B,C,T,height,W of an entry that bands of `shape` (B,C,T,rows,W) are written into."""
    return torch.Size((*shape[:3], height, shape[4]))


def _frames_dense(x: torch.Tensor) -> bool:
    """Whether each frame of x (B,C,T,rows,W, NDHWC) is one dense block of rows x W x C elements, as a band
    of rows of a dense NDHWC tensor is."""
    c, w = x.shape[1], x.shape[4]
    return is_ndhwc(x) and (x.shape[4] == 1 or x.stride(4) == c) and (x.shape[3] == 1 or x.stride(3) == w * c)


def _copy_across(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool) -> None:
    """dst.copy_(src) between the host and a GPU (B,C,T,rows,W), one memcpy per frame where both are NDHWC.
    torch copies a view that is not wholly dense (a band of rows of a cache) between devices through
    temporaries made NCDHW-contiguous and a transposing copy on the CPU: seconds per chunk for a 1080p
    cache. A band's frames are dense blocks; a view that is not even that (a block's input without its
    padding, on the device) is made dense first where it is."""
    if not (is_ndhwc(dst) and is_ndhwc(src)):
        dst.copy_(src, non_blocking=non_blocking)
        return
    if not _frames_dense(src):
        src = dense_copy(src)
    whole = all(x.is_contiguous(memory_format=torch.channels_last_3d) for x in (dst, src))
    if whole or not _frames_dense(dst):
        dst.copy_(src, non_blocking=non_blocking)
        return
    for b in range(dst.shape[0]):
        for t in range(dst.shape[2]):
            dst[b:b + 1, :, t:t + 1].copy_(src[b:b + 1, :, t:t + 1], non_blocking=non_blocking)  # 1,C,1,rows,W


class _DiskStore:
    """Tensors B,C,T,H,W in one temporary file, rows first. A key keeps its slot (also when popped)
    and reuses it while its tensor fits, so the file stays as large as one set of caches, however
    long the clip; an entry written band by band (`put_rows`) goes to the key's second slot and
    replaces the first on `commit`, because the old rows are read until the last band is written."""

    def __init__(self):
        self.file = tempfile.TemporaryFile(prefix="streamvae-cache-")
        self.slots: dict[object, tuple[int, int]] = {}  # offset, capacity in bytes
        self.spare: dict[object, tuple[int, int]] = {}  # a key's other slot, for its next band-written entry
        self.live: dict[object, tuple[torch.Size, torch.dtype, bool]] = {}  # shape, dtype, NDHWC
        self.next: dict[object, tuple[int, int, torch.Size, torch.dtype, bool]] = {}
        self.end = 0

    def _slot(self, nbytes: int, reuse: tuple[int, int] | None) -> tuple[int, int]:
        if reuse is not None and reuse[1] >= nbytes:
            return reuse
        self.end += nbytes
        return self.end - nbytes, nbytes

    def _write_rows(self, offset: int, frames: torch.Tensor, first_row: int, ndhwc: bool) -> None:
        """frames B,C,T,rows,W into rows [first_row, first_row + rows) of the entry at `offset` (an
        NDHWC entry when `ndhwc`)."""
        row_bytes = frames[..., :1, :].numel() * frames.element_size()
        step = max(1, WRITE_BLOCK_BYTES // max(1, row_bytes))
        for a in range(0, frames.shape[3], step):
            block = frames[..., a:a + step, :].permute(_ROWS_FIRST[ndhwc]).to("cpu").contiguous()  # rows first
            self.file.seek(offset + (first_row + a) * row_bytes)
            self.file.write(_raw(block))

    def put(self, key, frames: torch.Tensor, owned: bool = False) -> None:
        offset, capacity = self._slot(frames.nbytes, self.slots.get(key))
        self._write_rows(offset, frames.detach(), 0, is_ndhwc(frames))
        self.slots[key], self.live[key] = (offset, capacity), (frames.shape, frames.dtype, is_ndhwc(frames))

    def get(self, key, device) -> torch.Tensor:
        return self.rows(key, 0, self.live[key][0][3], device)

    def rows(self, key, first: int, stop: int, device) -> torch.Tensor:
        (b, c, t, _, w), dtype, ndhwc = self.live[key]
        shape = (b, c, t, stop - first, w)
        host = torch.empty([shape[i] for i in _ROWS_FIRST[ndhwc]], dtype=dtype)  # rows first
        self.file.seek(self.slots[key][0] + first * host[:1].nbytes)
        if self.file.readinto(_raw(host)) != host.nbytes:
            raise OSError(f"StreamVAE: the causal-cache file {self.file.name} came back short; is its disk full?")
        return host.permute(_FROM_ROWS_FIRST[ndhwc]).to(device)  # B,C,T,rows,W

    def put_rows(self, key, band: torch.Tensor, first: int, height: int) -> None:
        if key not in self.next:
            shape = _whole(band.shape, height)
            offset, capacity = self._slot(math.prod(shape) * band.element_size(), self.spare.get(key))
            self.next[key] = (offset, capacity, shape, band.dtype, is_ndhwc(band))
        self._write_rows(self.next[key][0], band.detach(), first, self.next[key][4])

    def commit(self, key) -> None:
        offset, capacity, shape, dtype, ndhwc = self.next.pop(key)
        if key in self.slots:
            self.spare[key] = self.slots[key]
        self.slots[key], self.live[key] = (offset, capacity), (shape, dtype, ndhwc)

    def shape(self, key) -> torch.Size:
        return self.live[key][0]

    def discard(self, key) -> None:
        self.live.pop(key, None)  # the slot stays for the key's next put

    def keys(self):
        return self.live.keys()

    def sizes(self):
        return [(shape, shape.numel() * dtype.itemsize) for shape, dtype, _ in self.live.values()]

    def close(self) -> None:
        self.live.clear()
        self.next.clear()
        self.file.close()


class _DeviceStore:
    """Tensors kept where they are (the compute device)."""

    def __init__(self):
        self.held: dict[object, torch.Tensor] = {}
        self.next: dict[object, torch.Tensor] = {}

    def put(self, key, frames: torch.Tensor, owned: bool) -> None:
        held = self.held.get(key)
        if (not owned and held is not None and held.shape == frames.shape and held.dtype == frames.dtype
                and held.device == frames.device and is_ndhwc(held) == is_ndhwc(frames)):
            # The entry a causal conv read for this call is consumed by now (written into its input
            # buffer): its memory takes the new frames. A fresh copy would cost a new allocation per
            # chunk, which on the CPU is fresh pages (page faults) for anything past a few MB.
            held.copy_(frames)
            return
        self.held[key] = frames if owned else dense_copy(frames)

    def get(self, key, device) -> torch.Tensor:
        return self.held[key]

    def rows(self, key, first: int, stop: int, device) -> torch.Tensor:
        return self.held[key][..., first:stop, :]

    def put_rows(self, key, band: torch.Tensor, first: int, height: int) -> None:
        if key not in self.next:
            self.next[key] = empty_video(band, _whole(band.shape, height))
        self.next[key][..., first:first + band.shape[3], :] = band

    def commit(self, key) -> None:
        self.held[key] = self.next.pop(key)

    def shape(self, key) -> torch.Size:
        return self.held[key].shape

    def discard(self, key) -> None:
        self.held.pop(key, None)

    def keys(self):
        return self.held.keys()

    def sizes(self):
        return [(t.shape, t.nbytes) for t in self.held.values()]

    def close(self) -> None:
        self.held.clear()
        self.next.clear()


class _HostStore:
    """Tensors in host memory for a GPU, within `budget_bytes` of RAM: page-locked (pinned) buffers,
    one per key and reused while its shape stays, filled and read with non-blocking copies in
    stream order; pageable buffers where pinning fails (pinned memory is a scarce kind of RAM, and
    a failed pin raises a RuntimeError rather than an out-of-memory error); the disk for what does
    not fit the budget or cannot be allocated at all. The budget keeps the machine out of swap. An
    entry written band by band goes to a second buffer of the key, swapped in on `commit`."""

    def __init__(self, budget_bytes: int):
        self.left = budget_bytes
        self.pin = True
        self.held: dict[object, torch.Tensor] = {}
        self.spare: dict[object, torch.Tensor] = {}
        self.next: dict[object, torch.Tensor] = {}
        self.disk: _DiskStore | None = None

    def _buffer(self, like: torch.Tensor, shape, reuse: torch.Tensor | None = None) -> torch.Tensor | None:
        """A host buffer of `shape` in like's dtype and layout (pinned if possible), `reuse` when it
        matches, or None when the host has no room (what `reuse` held is given back)."""
        dtype, fmt = like.dtype, torch.channels_last_3d if is_ndhwc(like) else torch.contiguous_format
        if (reuse is not None and reuse.shape == shape and reuse.dtype == dtype
                and reuse.is_contiguous(memory_format=fmt)):
            return reuse
        if reuse is not None:
            self.left += reuse.nbytes
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self.left:
            return None
        buffer = None
        if self.pin:
            try:
                buffer = torch.empty(shape, dtype=dtype, pin_memory=True, memory_format=fmt)
            except RuntimeError as error:
                self.pin = False
                message = (f"StreamVAE: could not pin host memory for the causal caches ({str(error).strip()[:200]}); "
                           "using pageable memory (slower copies, same result)")
                log.warning(message)
                warnings.warn(message, RuntimeWarning, stacklevel=4)
        if buffer is None:
            try:
                buffer = torch.empty(shape, dtype=dtype, memory_format=fmt)
            except (RuntimeError, MemoryError):
                return None
        self.left -= buffer.nbytes
        return buffer

    def _on_disk(self) -> _DiskStore:
        self.disk = self.disk or _DiskStore()
        return self.disk

    def put(self, key, frames: torch.Tensor, owned: bool) -> None:
        held = self._buffer(frames, frames.shape, self.held.pop(key, None))
        if held is None:
            self._on_disk().put(key, frames)
            return
        if self.disk is not None:
            self.disk.discard(key)
        self.held[key] = held
        _copy_across(held, frames, non_blocking=held.is_pinned())

    def get(self, key, device) -> torch.Tensor:
        held = self.held.get(key)
        if held is None:
            return self.disk.get(key, device)
        return held.to(device, non_blocking=held.is_pinned())

    def rows(self, key, first: int, stop: int, device) -> torch.Tensor:
        held = self.held.get(key)
        if held is None:
            return self.disk.rows(key, first, stop, device)
        band = held[..., first:stop, :]  # B,C,T,rows,W
        out = empty_video(band, band.shape, device=device)
        _copy_across(out, band, non_blocking=held.is_pinned())
        return out

    def put_rows(self, key, band: torch.Tensor, first: int, height: int) -> None:
        to_disk = self.disk is not None and key in self.disk.next  # an entry goes wholly to one place
        if key not in self.next and not to_disk:
            buffer = self._buffer(band, _whole(band.shape, height), self.spare.pop(key, None))
            to_disk = buffer is None
            if buffer is not None:
                self.next[key] = buffer
        if to_disk:
            self._on_disk().put_rows(key, band, first, height)
        else:
            held = self.next[key]
            _copy_across(held[..., first:first + band.shape[3], :], band, non_blocking=held.is_pinned())

    def commit(self, key) -> None:
        if key not in self.next:  # its bands went to disk
            self._discard_held(key)
            self.disk.commit(key)
            return
        if key in self.held:
            self.spare[key] = self.held[key]
        self.held[key] = self.next.pop(key)
        if self.disk is not None:
            self.disk.discard(key)

    def shape(self, key) -> torch.Size:
        return self.held[key].shape if key in self.held else self.disk.shape(key)

    def _discard_held(self, key) -> None:
        for buffers in (self.held, self.spare):
            held = buffers.pop(key, None)
            if held is not None:
                self.left += held.nbytes

    def discard(self, key) -> None:
        self._discard_held(key)
        if self.disk is not None:
            self.disk.discard(key)

    def keys(self):
        return self.held.keys() | (self.disk.live.keys() if self.disk is not None else set())

    def sizes(self):
        return [(t.shape, t.nbytes) for t in self.held.values()] + (self.disk.sizes() if self.disk else [])

    def close(self) -> None:
        for key in list(self.held) + list(self.spare):
            self.discard(key)
        self.next.clear()
        if self.disk is not None:
            self.disk.close()


class CausalCache:
    """What each temporal module remembers between chunks (see module docstring for `offload`).

    `get` returns a tensor on the compute device that the caller may only read, and only until the
    module's next `put` (which may write the new frames into the same memory); `put` stores a copy
    of `frames` (with `owned=True` the caller hands over a tensor nobody else writes, which the
    on-device store then keeps without copying). `rows` / `put_rows` / `commit` read and write an
    entry a band of rows at a time: the bands of the new entry are written while the old one is still
    read, and replace it on `commit`. `fallback` is the offload an out-of-memory retry may switch to
    (None: the user chose where the caches live). `host_budget` caps the RAM that "host" offloading
    takes (default: `backend.host_available()`, what the OS has free minus a margin); past it the
    caches go to disk. `advance` counts frames per key (what a module has given so far in this run).
    """

    def __init__(self, offload: str = "none", device=None, fallback: str | None = None, host_budget: int | None = None,
                 attention_frames: int | None = None):
        if offload not in CACHE_OFFLOADS:
            raise ValueError(f"cache_offload must be one of {CACHE_OFFLOADS}, got {offload!r}")
        self.device = torch.device(device if device is not None else "cpu")
        if offload == "host" and self.device.type == "cpu":
            offload = "none"
        self.offload = offload
        self.fallback = fallback if fallback != offload else None
        self._host_budget = host_budget
        self._store = self._offload_store() if offload != "none" else _DeviceStore()
        self._attention_frames = attention_frames
        self._keys_values: KeyValueCache | None = None
        self._counts: dict[object, int] = {}

    @property
    def keys_values(self) -> KeyValueCache:
        """The keys and values of the frames each frame-causal attention has seen, where these caches
        live: made on first use (a model without such an attention never has one), its on-device
        buffers sized for `attention_frames` latent frames (None: grown as frames come)."""
        if self._keys_values is None:
            self._keys_values = KeyValueCache(self.offload, self.device, self._offload_store, self._attention_frames)
        return self._keys_values

    def advance(self, key, frames: int) -> int:
        """The frames counted under `key` so far in this run, before adding `frames`: where a module's
        output of this call starts in the clip, for rules on its frame 0 that a module whose input
        lags (a layer after one that looks ahead) meets on a later chunk than the first."""
        before = self._counts.get(key, 0)
        self._counts[key] = before + frames
        return before

    def _offload_store(self):
        """A new store of this cache's offload ("host" or "disk")."""
        if self.offload == "host":
            return _HostStore(host_available() if self._host_budget is None else self._host_budget)
        return _DiskStore()

    def __contains__(self, module) -> bool:
        return module in self._store.keys()

    def get(self, module) -> torch.Tensor | None:
        return self._store.get(module, self.device) if module in self else None

    def frames(self, module) -> int:
        """How many frames the module's entry holds (0 without one), without reading it."""
        return self._store.shape(module)[2] if module in self else 0

    def put(self, module, frames: torch.Tensor, owned: bool = False) -> None:
        self._store.put(module, frames, owned)

    def rows(self, module, first: int, stop: int) -> torch.Tensor | None:
        """Rows [first, stop) of the module's entry (B,C,T,rows,W on the compute device), or None."""
        return self._store.rows(module, first, stop, self.device) if module in self else None

    def put_rows(self, module, band: torch.Tensor, first: int, height: int) -> None:
        """Write `band` (B,C,T,rows,W) as rows [first, first + rows) of the module's next entry, `height` rows tall."""
        self._store.put_rows(module, band, first, height)

    def commit(self, module) -> None:
        """The entry written by `put_rows` replaces the module's entry."""
        self._store.commit(module)

    def pop(self, module) -> torch.Tensor | None:
        frames = self.get(module)
        self._store.discard(module)
        return frames

    def clear(self) -> None:
        """Drop every module's entry (the causal state of a run that starts again at frame 0); the
        attention keys and values (`keys_values`) stay."""
        for module in list(self._store.keys()):
            self._store.discard(module)
        self._counts.clear()

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
        if self._keys_values is not None:
            self._keys_values.close()
        self._counts.clear()
