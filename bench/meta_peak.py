"""Live tensors of a streamed, tiled encode/decode on the meta device: the peak of what the GPU code path
holds at once, without a GPU (no kernel workspaces, no allocator overhead), and the largest tensors then.

    python -m bench.meta_peak --family seedvr2 --op decode --size 1080x1920 --tile 64
    python -m bench.meta_peak --size 1080x1920 --tile 64 --no-chain      # residual blocks conv by conv
    python -m bench.meta_peak --family ltx25 --size 736x1280 --frames 121 --offload host  # a whole decode

It runs the released config's stages the way a frame-streamed plan does (`strategies.FrameStream`,
`strategies.ExactTiles` with chained residual blocks, the caches and waiting frames off the device,
their bands read back as device tensors), one latent frame, then a steady one, and counts every
storage an op creates until the last tensor on it is gone. The mid-block attention counts as
O(tokens) (flash attention; the meta device would build the full score matrix). Slow at 4K (a Python
loop over tiles).
"""
import argparse
import contextlib
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

import vae
import vae.model.layers
from bench import models
from vae import families
from vae.kernels import neighborhood
from vae.run import memory
from vae.run.causal_cache import CausalCache
from vae.run.clip_statistics import EachChunksOwn
from vae.run.run_context import RunContext
from vae.run.strategies.exact_tiles import ExactTiles
from vae.run.strategies.frame_stream import FrameStream

GIB = 2**30


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages that ops create, while a tensor on them lives; not those of `made`
    (tensors made before the count, whose views the ops return: an output buffer written into)."""

    def __init__(self, made: tuple[torch.Tensor, ...] = ()):
        super().__init__()
        self.made = {t.untyped_storage()._cdata for t in made}
        self.storages: dict[int, list] = {}  # storage id -> [bytes, live tensors, shape]
        self.live = self.peak = 0
        self.at_peak: list = []

    def _track(self, t) -> None:
        if not isinstance(t, torch.Tensor):
            return
        key = t.untyped_storage()._cdata
        if key in self.made:
            return
        entry = self.storages.get(key)
        if entry is None:
            entry = self.storages[key] = [t.untyped_storage().nbytes(), 0, tuple(t.shape)]
            self.live += entry[0]
            if self.live > self.peak:
                self.peak = self.live
                self.at_peak = sorted((e[0], e[2]) for e in self.storages.values())[-6:]
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key) -> None:
        entry = self.storages.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                self.live -= entry[0]
                del self.storages[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tree_map(self._track, out)
        return out


class ShapeStore:
    """An offload store that keeps shapes only: what it hands back is a new device tensor (counted)."""

    def __init__(self):
        self.live, self.next = {}, {}

    def put(self, key, frames, owned=False):
        self.live[key] = (frames.shape, frames.dtype)

    def get(self, key, device):
        shape, dtype = self.live[key]
        return torch.empty(shape, dtype=dtype, device="meta")

    def rows(self, key, first, stop, device):
        shape, dtype = self.live[key]
        return torch.empty(shape[:3] + (stop - first,) + shape[4:], dtype=dtype, device="meta")

    def put_rows(self, key, band, first, height):
        self.next[key] = (band.shape[:3] + (height,) + band.shape[4:], band.dtype)

    def commit(self, key):
        self.live[key] = self.next.pop(key)

    def shape(self, key):
        return self.live[key][0]

    def discard(self, key):
        self.live.pop(key, None)

    def keys(self):
        return self.live.keys()

    def sizes(self):
        return []

    def close(self):
        self.live.clear()


def _blocked_na_counted(q, k, v, part, scale, block=None) -> torch.Tensor:
    """`neighborhood.blocked`'s memory without its loop over blocks: the output and one group of blocks' query,
    key and value copies (each group is at most `BLOCKED_CALL_ELEMENTS`; its attention counts as flash
    attention's, as everywhere here)."""
    out = torch.empty(q.shape, dtype=v.dtype, device=q.device)
    group = torch.empty(min(neighborhood.BLOCKED_CALL_ELEMENTS, q.numel() + k.numel() + v.numel()),
                        dtype=neighborhood.compute_dtype(q.dtype, q.device), device=q.device)
    del group
    return out


@contextlib.contextmanager
def flash_attention_counted():
    """The blocks' attention as flash attention's memory (O(tokens)) while counting: the meta device would
    build the full score matrix; the blocked neighbourhood attention as one group of its blocks
    (`_blocked_na_counted`: its loop over thousands of blocks would take minutes at 720p). Restored
    afterwards, so a process that counts (a test) computes again."""
    real = vae.model.layers.sdpa, torch.nn.functional.scaled_dot_product_attention, neighborhood.blocked
    vae.model.layers.sdpa = lambda q, k, v, kernel: torch.empty_like(q)
    torch.nn.functional.scaled_dot_product_attention = lambda q, k, v, **kwargs: torch.empty_like(q)
    neighborhood.blocked = _blocked_na_counted
    try:
        yield
    finally:
        vae.model.layers.sdpa, torch.nn.functional.scaled_dot_product_attention, neighborhood.blocked = real


def count(family: str, op: str, height: int, width: int, tile: int, chain: bool) -> LiveBytes:
    model = models.meta_model(family).requires_grad_(False)
    model.set_dtypes(encode=torch.float32, decode=torch.bfloat16)
    ctx = RunContext(vae.Optimizations(kernel_choice="defaults"), frames_are_images=model.frames_are_images)
    # Norms over the whole clip (HunyuanVideo 1.0) normalise each chunk here: a real run's statistics passes
    # stop where this pass goes on, and the statistics change no shape.
    ctx.clip_statistics = EachChunksOwn()
    # The attention's keys and values stay on the (meta) device, counted live: their cache is made before
    # the causal caches' store is replaced by one that keeps shapes only.
    assert ctx.cache.keys_values.offload == "none"
    store = ShapeStore()
    ctx.cache._store, ctx.cache.offload = store, "host"
    ctx.execution = ExactTiles((height, width), (tile, tile), lambda: None, chain=chain)
    stream = FrameStream(model.decode_stages() if op == "decode" else model.encode_stages())
    sf = model.spatial_factor
    first, steady = ([torch.empty(1, model.latent_channels, 1, height // sf, width // sf, dtype=torch.bfloat16,
                                  device="meta")] * 2 if op == "decode" else
                     [torch.empty(1, model.in_channels, n, height, width, device="meta") for n in (1, 4)])
    # A causal network is steady from its second chunk; one whose convs look ahead once every layer has had
    # frames (each one frame behind the one before it): until a chunk leaves the caches' shapes as they were.
    chunks_max = memory.STEADY_CHUNKS_MAX if model.looks_ahead(op) else 1
    with torch.inference_mode(), flash_attention_counted(), LiveBytes() as live:
        stream.run(first, ctx, lambda y: None)  # each stage's first call: FrameStream knows it had frame 0
        shapes = None
        for _ in range(chunks_max):
            live.peak = live.live  # the steady chunk's peak
            stream.run(steady, ctx, lambda y: None)
            shapes, before = sorted(map(str, store.live.values())), shapes
            if shapes == before:
                break
    return live


def run_peak(family: str, op: str, size: int, frames: int, settings: vae.Settings) -> tuple[vae.Plan, int]:
    """(the CPU plan of `settings`, the peak bytes of live tensors) of one `vae.encode`/`vae.decode` of
    `family`'s released network on the meta device, through the engine as a run takes it: what its code
    path holds at once (the input and output made outside it and not counted; no kernel workspaces, no
    allocator overhead; attention as flash attention). Fixed default kernels."""
    model = models.meta_model(family).requires_grad_(False)
    x = models.make_input(family, dict(op=op, frames=frames, height=size, width=size)).to("meta")
    return _engine_peak(model, op, x, settings)


def own_tiles_peak(family: str, op: str, input_shape: tuple[int, ...], settings: vae.Settings,
                   dtype: torch.dtype) -> tuple[vae.Plan, int]:
    """`run_peak` of a model that runs its own tiles (`ClipExtent.OWN_TILES`), `family`'s released network in
    `dtype`, on an input of `input_shape`; the input and the output buffer (whose views the run writes through)
    are not counted at all."""
    model = models.meta_model(family).requires_grad_(False)
    model.set_dtypes(**{op: dtype})
    return _engine_peak(model, op, torch.empty(input_shape, dtype=dtype, device="meta"), settings, own_io=True)


def untiled_chunks_count(family: str, height: int, width: int, frames: int, dtype: torch.dtype,
                         settings: vae.Settings) -> tuple[vae.Plan, LiveBytes]:
    """(the CPU plan of `settings`, the live tensors) of a decode of `frames` pixel frames of height x width by
    `family`'s released network in `dtype` on the meta device through the engine, for an op in temporal chunks
    of whole frames (`ClipExtent.UNTILED_CHUNKS`: LTX-2.5's decoder): its layers' state offloaded as the
    settings say (host or disk: only what is read back is counted), the output buffer not counted."""
    model = models.meta_model(family).requires_grad_(False)
    model.set_dtypes(decode=dtype)
    sf, tf = model.spatial_factor, model.temporal_factor
    z = torch.empty(1, model.latent_channels, (frames - 1) // tf + 1, height // sf, width // sf, dtype=dtype,
                    device="meta")
    with offloaded_as_shapes():
        return _engine_count(model, "decode", z, settings)


@contextlib.contextmanager
def offloaded_as_shapes():
    """The caches' offload stores (host memory, disk) as `ShapeStore`s while counting: what a run reads back
    from them is a new device tensor (counted), what it keeps there is not. Restored afterwards."""
    real = CausalCache._offload_store
    CausalCache._offload_store = lambda self: ShapeStore()
    try:
        yield
    finally:
        CausalCache._offload_store = real


def _engine_peak(model, op: str, x: torch.Tensor, settings: vae.Settings, own_io: bool = False) -> tuple[vae.Plan, int]:
    """(the CPU plan of `settings`, the peak bytes of live tensors) of `op` of the meta `model` on `x` (`_engine_count`)."""
    plan, live = _engine_count(model, op, x, settings, own_io)
    return plan, live.peak


def _engine_count(model, op: str, x: torch.Tensor, settings: vae.Settings, own_io: bool = False) -> tuple[vae.Plan, LiveBytes]:
    """(the CPU plan of `settings`, the live tensors) of `op` of the meta `model` on `x` through the engine, fixed
    default kernels; the output buffer made before the count, and with `own_io` neither it nor `x` counted
    through the views ops return of them (`LiveBytes.made`)."""
    opts = vae.Optimizations(kernel_choice="defaults")
    plan = vae.plan(model, op, tuple(x.shape), settings, device="cpu", io_on_device=(False, False), opts=opts)
    io = {}
    if op == "decode":
        of = model.spatial_factor * model.decode_upscale
        io["out"] = torch.empty((x.shape[0], model.out_channels, plan.clip.frames, x.shape[3] * of, x.shape[4] * of),
                                device="meta")
    made = (x, *io.values()) if own_io else ()
    with torch.inference_mode(), flash_attention_counted(), LiveBytes(made) as live:
        (vae.decode if op == "decode" else vae.encode)(model, x, plan, opts=opts, **io)
    return plan, live


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default=families.SEEDVR2.name, choices=models.FAMILIES)
    parser.add_argument("--op", default="decode", choices=["decode", "encode"])
    parser.add_argument("--size", default="1080x1920", help="HxW in pixels")
    parser.add_argument("--tile", type=int, default=64)
    parser.add_argument("--no-chain", action="store_true")
    parser.add_argument("--frames", type=int, default=None,
                        help="a whole decode of this many pixel frames through the engine (a family in temporal chunks "
                        "of whole frames: LTX-2.5), bf16, one latent frame per chunk; --offload where its state waits")
    parser.add_argument("--offload", default="host", choices=["none", "host"])
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.lower().split("x"))
    if args.frames is not None:
        plan, live = untiled_chunks_count(args.family, height, width, args.frames, torch.bfloat16,
                                          vae.Settings(temporal_chunk=1, cache_offload=args.offload))
        print(f"{args.family} decode {args.frames}x{args.size} bf16, {plan.describe()}: peak {live.peak / GIB:.2f} GiB "
              f"of live tensors")
        for nbytes, shape in reversed(live.at_peak):
            print(f"  {nbytes / GIB:.2f} GiB {shape}")
        return
    live = count(args.family, args.op, height, width, args.tile, not args.no_chain)
    elem = 2 if args.op == "decode" else 4
    print(f"{args.family} {args.op} {args.size} tile {args.tile} chain {not args.no_chain}: peak "
          f"{live.peak / GIB:.2f} GiB of live tensors ({live.peak / (height * width * elem):.0f} elements per pixel)")
    for nbytes, shape in reversed(live.at_peak):
        print(f"  {nbytes / GIB:.2f} GiB {shape}")


if __name__ == "__main__":
    main()
