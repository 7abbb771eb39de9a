"""A two-stream pipeline: compute the next tile while the previous one is copied to pinned host memory.

Decoding a long video on a GPU ends every tile (or temporal chunk) with a device-to-host copy of its
pixels, which are many times larger than its latents. On one stream the GPU idles during that copy.
`copy_out_pipeline` runs `compute(item)` on the current stream and the copy of its result on a side
stream, into page-locked (pinned) host buffers with `non_blocking=True`, so the copy of tile i
overlaps the compute of tile i + 1; `sink(item, host)` receives each result, in order, once its copy
has finished:

    def sink(tile, pixels):                 # pixels: a pinned CPU tensor, reused after sink returns
        video[tile.slices].copy_(pixels)

    copy_out_pipeline(tiles, lambda tile: decode_tile(tile), sink)

`depth` results may be in flight (computed, copy queued) at once; each holds its device output and
one pinned buffer. The pinned buffers are pooled by shape and dtype and reused, since pinning is
slow (a page-locking system call) and equal tiles have equal shapes.

Without CUDA, or when a result is not on a CUDA device, each result goes to `sink` straight away
(moved to the CPU if needed): the same calls in the same order, synchronously.
"""
from collections import deque

import torch


class PinnedPool:
    """Page-locked CPU buffers by (shape, dtype), handed out and given back (no re-pinning)."""

    def __init__(self):
        self._free: dict[tuple, list[torch.Tensor]] = {}
        self.allocated = 0  # buffers pinned so far

    def take(self, shape, dtype: torch.dtype) -> torch.Tensor:
        free = self._free.get((tuple(shape), dtype))
        if free:
            return free.pop()
        self.allocated += 1
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=True)

    def give(self, buffer: torch.Tensor) -> None:
        self._free.setdefault((tuple(buffer.shape), buffer.dtype), []).append(buffer)


def copy_out_pipeline(items, compute, sink, *, depth: int = 2, pool: PinnedPool | None = None) -> int:
    """sink(item, compute(item) on the CPU) for every item, in order; returns how many items ran.

    On CUDA the copies run on a side stream into pinned buffers (from `pool`, or a pool for this
    call) and overlap the next items' compute; `sink` must not keep the buffer it gets (copy from it).
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    pending: deque = deque()  # (item, pinned buffer, copy-done event)
    copy_stream, count = None, 0
    pool = pool if pool is not None else PinnedPool()

    def finish_oldest():
        item, host, copied = pending.popleft()
        copied.synchronize()
        try:
            sink(item, host)
        finally:
            pool.give(host)

    try:
        for item in items:
            result = compute(item)
            count += 1
            if not (torch.cuda.is_available() and result.is_cuda):
                sink(item, result if result.device.type == "cpu" else result.cpu())
                continue
            if copy_stream is None:
                copy_stream = torch.cuda.Stream(device=result.device)
            computed = torch.cuda.Event()
            computed.record(torch.cuda.current_stream(result.device))
            host = pool.take(result.shape, result.dtype)
            with torch.cuda.stream(copy_stream):
                copy_stream.wait_event(computed)
                host.copy_(result, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(copy_stream)
            # The allocator must not hand the result's memory to later compute before the copy read it.
            result.record_stream(copy_stream)
            del result
            pending.append((item, host, copied))
            while len(pending) > depth - 1:
                finish_oldest()
        while pending:
            finish_oldest()
    finally:
        for _, _, copied in pending:  # an exception: let queued copies end before their buffers are reused
            copied.synchronize()
    return count
