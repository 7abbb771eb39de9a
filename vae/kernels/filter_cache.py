"""The filter-transform cache of the Winograd convs (winograd.py): transforms kept per weight, capped.

A transform is 4x its weight in float32, so a model's transforms may not all fit; what does not is
recomputed every temporal chunk. The cache keeps the most valuable ones (`FilterCache`), one cache per
cap per process (`filter_cache`).
"""
import os
import threading
import weakref
from collections import OrderedDict
from functools import lru_cache

import torch

# Byte cap of the filter-transform cache: an eighth of physical memory, clamped to 1..4 GiB
# (STREAMVAE_WINOGRAD_CACHE_GB overrides it). A transform is 4x its weight in float32, so an uncapped
# cache grows to 16x a bf16 model's 3x3 conv weights: 2.2 GiB for the SeedVR2 decoder, 1.0 GiB for
# Wan2.1's, 7.7 GiB for Wan2.2's. What does not fit is recomputed every temporal chunk, which is why the
# cap grows with the machine's memory (a 1 GiB cap cost SeedVR2 much of its speed: bench/RESULTS.md
# section 1).
MIN_CACHE_BYTES, MAX_CACHE_BYTES = 1 << 30, 4 << 30


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX (Windows): unknown
        return None


def cache_bytes_for(ram: int | None, override: str | None = None) -> int:
    """The cache cap for `ram` bytes of physical memory (None: unknown), or `override` GiB when set."""
    if override:
        return int(float(override) * 2**30)
    return MIN_CACHE_BYTES if ram is None else min(max(ram // 8, MIN_CACHE_BYTES), MAX_CACHE_BYTES)


def default_cache_bytes() -> int:
    return cache_bytes_for(physical_memory_bytes(), os.environ.get("STREAMVAE_WINOGRAD_CACHE_GB"))


class FilterCache:
    """Filter transforms per weight, capped at `limit_bytes`, kept by priority, scan-resistant.

    Entries are keyed by the weight's anchor (the tensor, or the base of a view such as
    weight.unsqueeze(2) or a tap slice) and the view's layout. An anchor's entries are dropped when
    it is freed (weakref.finalize), so no model's transforms outlive it, and when it changes in place
    (version counter). Not a WeakKeyDictionary: that compares tensor keys elementwise. A transform
    larger than the whole cap is returned without being kept.

    A model's convs are visited in the same cycle every chunk. Plain LRU keeps nothing useful when
    one cycle needs more than the cap (each entry is evicted just before its next use), so an entry
    may be evicted only once it has gone unused for longer than the longest reuse interval seen (in
    calls), or for a new entry of higher priority (the caller's measure of what a cached transform
    saves per byte: the conv's frame size). Otherwise the new transform is computed but not kept. A
    cycle then hits on the most valuable part that fits, and the entries of a model no longer used
    age out for a new one.
    """

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self.bytes = 0
        self._entries: OrderedDict = OrderedDict()  # (id(anchor), view key) -> (U, priority), oldest use first
        # id(anchor) -> [weakref(anchor), version, {view key: last use}] (uncached keys too)
        self._anchors: dict[int, list] = {}
        self._tick = 0  # calls so far
        self._reuse = 0  # longest interval (in calls) between two uses of one key
        self._lock = threading.RLock()  # a finalizer may run inside get() (garbage collection)

    def __len__(self) -> int:
        return len(self._entries)

    def anchors(self) -> set[int]:
        return set(self._anchors)

    def holds_or_admits(self, weight: torch.Tensor, key: tuple, nbytes: int, priority: float = 0) -> bool:
        """Whether (weight, key) is cached, or a transform of `nbytes` at `priority` computed now would be
        kept: as `get` decides, which first counts this use of the key (a key seen a cycle ago makes the
        cycle that long, and the entries used within it stay)."""
        with self._lock:
            aid = self._live_anchor(weight)
            if aid is not None and (aid, key) in self._entries:
                return True
            last = None if aid is None else self._anchors[aid][2].get(key)
            reuse = self._reuse if last is None else max(self._reuse, self._tick + 1 - last)
            return self._victims(nbytes, priority, self._tick + 1, reuse) is not None

    def has(self, weight: torch.Tensor, key: tuple) -> bool:
        """Whether the value for (weight, key) is cached now."""
        with self._lock:
            aid = self._live_anchor(weight)
            return aid is not None and (aid, key) in self._entries

    def get(self, weight: torch.Tensor, key: tuple, compute, priority: float = 0, nbytes: int | None = None) -> torch.Tensor:
        """The cached value for (weight, key), else compute(), kept if the cap allows. `nbytes`: the size
        of compute()'s value, when known: what it displaces is dropped before it is computed, so the
        cache and the new value together stay within the cap (otherwise a full cache's peak is the cap
        plus a transform: 0.45 GB for a 1024-channel 3x3x3 conv)."""
        anchor = weight if weight._base is None else weight._base
        version = -1 if weight.is_inference() else weight._version  # inference tensors have no counter
        aid = id(anchor)
        with self._lock:
            record = self._anchors.get(aid)
            if record is None or record[0]() is not anchor:  # new anchor (or a reused id)
                if record is not None:
                    self._drop_anchor(aid)
                weakref.finalize(anchor, self.drop_anchor, aid)
                record = self._anchors[aid] = [weakref.ref(anchor), version, {}]
            elif record[1] != version:  # changed in place: every view's transform is stale
                self._drop_entries(aid)
                record[1] = version
            self._tick += 1
            last = record[2].get(key)
            if last is not None:
                self._reuse = max(self._reuse, self._tick - last)
            record[2][key] = self._tick
            entry = self._entries.get((aid, key))
            if entry is not None:
                self._entries.move_to_end((aid, key))
                return entry[0]
            for victim in (self._victims(nbytes, priority) or []) if nbytes is not None else []:
                self._evict(victim)
        value = compute()
        with self._lock:
            victims = self._victims(value.nbytes, priority)
            if self._anchors.get(aid) is record and record[1] == version and victims is not None:
                for victim in victims:
                    self._evict(victim)
                self._entries[(aid, key)] = (value, priority)
                self.bytes += value.nbytes
        return value

    def clear(self) -> None:
        with self._lock:
            for aid in list(self._anchors):
                self._drop_anchor(aid)

    def holds(self, weight: torch.Tensor) -> bool:
        """Whether a transform of `weight` (or of another view of its tensor) is kept."""
        with self._lock:
            aid = self._live_anchor(weight)
            return aid is not None and any((aid, key) in self._entries for key in self._anchors[aid][2])

    def discard(self, weight: torch.Tensor) -> None:
        """Drop the transforms of `weight` (and of the other views of its tensor)."""
        with self._lock:
            aid = self._live_anchor(weight)
            if aid is not None:
                self._drop_entries(aid)

    def _live_anchor(self, weight: torch.Tensor) -> int | None:
        """The id of the tensor under `weight` when this cache keeps an entry for it (lock held)."""
        anchor = weight if weight._base is None else weight._base
        record = self._anchors.get(id(anchor))
        return id(anchor) if record is not None and record[0]() is anchor else None

    def drop_anchor(self, aid: int) -> None:
        """Forget a freed anchor's entries (its finalizer: by then the anchor's weakref is dead, which
        tells it from a live tensor that reused the id)."""
        with self._lock:
            record = self._anchors.get(aid)
            if record is not None and record[0]() is None:
                self._drop_anchor(aid)

    def _victims(self, nbytes: int, priority: float, tick: int | None = None, reuse: int | None = None) -> list | None:
        """The entries to evict so that `nbytes` at `priority` fit (lowest priority, then least recently
        used, first), or None when it cannot be kept: larger than the cap, or only entries of the current
        cycle with at least its priority stand in the way (`tick` and `reuse`: the cache's, unless
        given)."""
        if nbytes > self.limit_bytes:
            return None
        need = self.bytes + nbytes - self.limit_bytes
        if need <= 0:
            return []
        tick = self._tick if tick is None else tick
        reuse = self._reuse if reuse is None else reuse
        evictable = [(entry[1], key) for key, entry in self._entries.items()
                     if entry[1] < priority or tick - self._anchors[key[0]][2][key[1]] > reuse]
        victims = []
        for _, key in sorted(evictable, key=lambda item: item[0]):  # stable: least recent first within a priority
            if need <= 0:
                break
            victims.append(key)
            need -= self._entries[key][0].nbytes
        return victims if need <= 0 else None

    def _evict(self, key) -> None:
        value, _ = self._entries.pop(key)
        self.bytes -= value.nbytes

    def _drop_entries(self, aid: int) -> None:
        for key in self._anchors[aid][2]:
            if (aid, key) in self._entries:
                self._evict((aid, key))

    def _drop_anchor(self, aid: int) -> None:
        self._drop_entries(aid)
        del self._anchors[aid]


@lru_cache(maxsize=None)
def filter_cache(limit_bytes: int | None = None) -> FilterCache:
    """The process's filter-transform cache with this cap (None: `default_cache_bytes()`): one per
    cap, shared by every model and run that asks for it, so transforms outlive a run but no setting
    of one run changes another's cache."""
    return FilterCache(default_cache_bytes() if limit_bytes is None else limit_bytes)
