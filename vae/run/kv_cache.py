"""The keys and values a frame-causal attention keeps of the frames it has seen (`layers.FrameCausalAttention`).

An attention over every position of a clip in which frame t attends only to frames <= t (HunyuanVideo
1.5's mid-block) runs chunk by chunk with exactly the whole clip's result when each chunk's queries
attend to the keys and values of every earlier frame plus their own: no mask, nothing recomputed.
Those keys and values are this cache, one per attention module, in tokens (B,N,C per frame, N = h*w
latent positions). It lives where the run's causal caches live (`causal_cache.CausalCache`, which
owns one):

- on the compute device: one buffer of keys and one of values, frames end to end, so the keys of
  frames [0, t) are one view of it (`prefix`) and an attention call reads them in place (SDPA, no
  copy). The buffer is reserved for the clip's frames when the run says how many (`reserve`), else
  it doubles as frames come.
- offloaded ("host": pinned CPU memory, "disk"): each frame in the offload store, read back onto the
  device for the attention call that needs it (`prefix` then copies frames [0, t) into one buffer,
  freed when the call ends), so between attention calls no key is on the device.

At 1280x720 (80x45 latent cells, 1024 channels, bf16) a frame's keys and values are 14.7 MB, a
121-frame clip's (31 latent frames) 457 MB; `memory.estimate` counts them (`VideoVAE.attention_cache_elements`).
"""
from typing import Callable

import torch


class _DeviceFrames:
    """One module's keys and values on the compute device: two buffers B,capacity*N,C, frames end to end."""

    def __init__(self, capacity: int | None):
        self.capacity, self.frames, self.tokens = capacity, 0, 0
        self.k = self.v = None

    def append(self, k: torch.Tensor, v: torch.Tensor, frames: int) -> None:
        b, n, c = k.shape  # n: this call's tokens, `frames` frames of n // frames each
        per_frame = n // frames
        needed = self.frames + frames
        if self.k is None or needed * per_frame > self.k.shape[1]:
            grown = max(needed, self.capacity or 0, 2 * self.frames)
            keys, values = (k.new_empty((b, grown * per_frame, c)) for _ in range(2))
            if self.k is not None:  # frames so far move into the larger buffers
                keys[:, :self.tokens], values[:, :self.tokens] = self.k[:, :self.tokens], self.v[:, :self.tokens]
            self.k, self.v = keys, values
        self.k[:, self.tokens:self.tokens + n] = k
        self.v[:, self.tokens:self.tokens + n] = v
        self.frames, self.tokens = needed, self.tokens + n

    def prefix(self, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        stop = self.tokens // self.frames * frames
        return self.k[:, :stop], self.v[:, :stop]

    def nbytes(self) -> int:
        return 0 if self.k is None else 2 * self.k.nbytes


class _StoredFrames:
    """One module's keys and values in an offload store, a frame per entry (B,2,1,N,C: keys, values)."""

    def __init__(self, store, device: torch.device):
        self.store, self.device, self.frames, self.bytes = store, device, 0, 0

    def append(self, k: torch.Tensor, v: torch.Tensor, frames: int) -> None:
        b, n, c = k.shape
        per_frame = n // frames
        for i in range(frames):
            part = slice(i * per_frame, (i + 1) * per_frame)
            both = torch.stack([k[:, part], v[:, part]], 1).unsqueeze(2)  # B,2,1,N,C
            self.store.put((self, self.frames), both, owned=True)
            self.frames, self.bytes = self.frames + 1, self.bytes + both.nbytes

    def prefix(self, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [self.store.get((self, i), self.device) for i in range(frames)]  # B,2,1,N,C each
        both = torch.cat(parts, dim=3)[:, :, 0]  # B,2,frames*N,C
        return both[:, 0], both[:, 1]

    def nbytes(self) -> int:
        return self.bytes


class KeyValueCache:
    """The keys and values of the frames each frame-causal attention module has seen in one run.

    `offload` and `device` as in `CausalCache`; `new_store()` makes the offload store ("host"/"disk")
    on first use; `capacity`: the clip's latent frames, which the on-device buffers are sized for (no
    growth, no copies; None: grown as frames come). Tokens are B,N,C; a call appends the keys and
    values of whole frames."""

    def __init__(self, offload: str, device: torch.device, new_store: Callable[[], object], capacity: int | None = None):
        self.offload, self.device, self._new_store = offload, device, new_store
        self._store = None
        self._capacity = capacity
        self._modules: dict[object, _DeviceFrames | _StoredFrames] = {}

    def frames(self, module) -> int:
        """How many frames of `module` are kept."""
        entry = self._modules.get(module)
        return 0 if entry is None else entry.frames

    def append(self, module, k: torch.Tensor, v: torch.Tensor, frames: int) -> None:
        """Keep keys and values (B,frames*N,C each, frame after frame) of `frames` more frames."""
        entry = self._modules.get(module)
        if entry is None:
            if self.offload == "none":
                entry = _DeviceFrames(self._capacity)
            else:
                self._store = self._store or self._new_store()
                entry = _StoredFrames(self._store, self.device)
            self._modules[module] = entry
        entry.append(k, v, frames)

    def prefix(self, module, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B,frames*N,C each, on the compute device) of the module's first `frames`
        frames: views of the on-device buffers, or a copy read back from the offload store."""
        return self._modules[module].prefix(frames)

    def nbytes(self) -> int:
        """Bytes kept, wherever they are."""
        return sum(entry.nbytes() for entry in self._modules.values())

    def close(self) -> None:
        self._modules.clear()
        if self._store is not None:
            self._store.close()
            self._store = None
