"""CUDA graphs for fixed-shape tiles: capture the kernels of one call once, replay them for later calls.

A tile of a video VAE launches hundreds of small kernels; with fixed tile shapes (the engine cuts
every frame into equal tiles) the launch overhead can be removed by recording them once into a CUDA
graph and replaying it with new input data copied into the captured input buffer.

    tile_fn = GraphedTile(lambda x: decoder_tile(x))   # a pure function of its tensor arguments
    y = tile_fn(x)                                      # first call per shape: warm-up + capture

Requirements on `fn`: it depends only on its tensor arguments (no state carried between calls, such
as a causal cache held in Python objects, and no host synchronisation such as `.item()`), and it
returns one tensor. Each distinct input signature (shapes, dtypes, device) gets its own graph, at
most `max_graphs` (the oldest is released). A capture that fails (an op that cannot be captured)
makes that signature run eagerly from then on, with one warning.

Without CUDA (or for inputs that are not on a CUDA device) the call is simply `fn(*inputs)`.
"""
import logging
from collections import OrderedDict

import torch

log = logging.getLogger(__name__)


def _signature(inputs) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.device, t.stride()) for t in inputs)


class GraphedTile:
    """`fn(*inputs) -> Tensor` replayed from a CUDA graph per input signature; eager off CUDA.

    copy_output: return a fresh copy of the graph's output (default). With False the returned tensor
        is the graph's static output buffer, overwritten by the next call with the same signature
        (saves one device copy when the caller consumes it at once).
    warmup: eager calls on a side stream before capturing (lets lazy initialisation, cuDNN autotuning
        and the caching allocator settle, as torch.cuda.graphs recommends).
    """

    def __init__(self, fn, *, warmup: int = 2, max_graphs: int = 4, copy_output: bool = True):
        self.fn, self.warmup, self.max_graphs, self.copy_output = fn, warmup, max_graphs, copy_output
        self._graphs: OrderedDict = OrderedDict()  # signature -> (graph, static inputs, static output) | None
        self._warned = False
        self.captures = 0  # graphs captured so far (for callers' reports and tests)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if not (torch.cuda.is_available() and inputs and all(t.is_cuda for t in inputs)):
            return self.fn(*inputs)
        sig = _signature(inputs)
        if sig not in self._graphs:
            self._graphs[sig] = self._capture(inputs)
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        entry = self._graphs[sig]
        if entry is None:  # capture failed for this signature: eager
            return self.fn(*inputs)
        self._graphs.move_to_end(sig)
        graph, static_inputs, static_output = entry
        for static, value in zip(static_inputs, inputs):
            static.copy_(value)
        graph.replay()
        return static_output.clone() if self.copy_output else static_output

    def _capture(self, inputs):
        static_inputs = [t.detach().clone() for t in inputs]
        stream = torch.cuda.Stream(device=inputs[0].device)
        stream.wait_stream(torch.cuda.current_stream(inputs[0].device))
        try:
            with torch.cuda.stream(stream):
                for _ in range(self.warmup):
                    self.fn(*static_inputs)
            torch.cuda.current_stream(inputs[0].device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_output = self.fn(*static_inputs)
        except Exception as error:  # anything that cannot be captured: run this signature eagerly
            if not self._warned:
                self._warned = True
                log.warning("StreamVAE: CUDA graph capture failed, running the tile eagerly: %s", error)
            torch.cuda.synchronize(inputs[0].device)
            return None
        if not isinstance(static_output, torch.Tensor):
            raise TypeError(f"GraphedTile: fn must return one tensor, got {type(static_output).__name__}")
        self.captures += 1
        return graph, static_inputs, static_output

    def reset(self) -> None:
        """Release every captured graph (and the memory it holds)."""
        self._graphs.clear()
