"""LTX-2.5's diffusion decoder in temporal chunks (vae/model/ltx25/streaming.py) against the same decoder on the
whole clip at once (`LTX25VAE.decode_clip`, which tests/test_ltx25_core.py compares with core's):

- chunks of 1 and 2 latent frames, frames streamed, the caches offloaded to disk: the whole clip's frames, in
  float64 to 1e-12 (the schedule exact: every window sees what it sees in the whole clip, the border shift, the
  trailing copies, the dropped duplicate frame, the noise's frames) and in float32 to its rounding;
- clips shorter than the decoder's reach in time (1 and 2 latent frames) and longer ones, both variants (the
  released windows, x0 in one step; other windows and strides, v in two steps: a pass per step);
- bands of query rows (a block call's temporaries bounded) give the same frames;
- frames reach a sink before the clip's last chunk, each once and in order (the decode streams: the layers
  hold their windows' frames, not the clip's);
- out of memory in a later chunk: the retry with shorter chunks gives the same frames.
"""
import pytest
import torch

import vae
from ltx25_fixtures import model
from vae.model.ltx25 import streaming


def _latent(frames: int, seed: int = 5) -> torch.Tensor:
    return torch.randn(1, 128, frames, 2, 3, generator=torch.Generator().manual_seed(seed))


def _close(got: torch.Tensor, expected: torch.Tensor, bound: float) -> None:
    assert got.shape == expected.shape
    error = (got - expected).abs().max().item()
    assert error <= bound * max(1.0, expected.abs().max().item()), error


SETTINGS = {
    "one frame a chunk": vae.Settings(temporal_chunk=1),
    "two frames, caches on disk": vae.Settings(temporal_chunk=2, cache_offload="disk"),
    "frames streamed": vae.Settings(stream_frames=True),
}


@pytest.mark.parametrize("frames", [1, 2, 7])
@pytest.mark.parametrize("variant", ["released_windows", "other_windows"])
def test_chunks_give_the_whole_clips_frames_in_float64(variant, frames):
    m = model(variant).double()
    z = _latent(frames).double()
    with torch.no_grad():
        whole = m.decode_clip(z, 0)
    for settings in SETTINGS.values():
        _close(vae.decode(m, z, settings), whole, 1e-12)


def test_bands_of_query_rows_give_the_whole_clips_frames(monkeypatch):
    """A block call in bands of a few query rows (each with the key rows its windows read, `BAND_TOKENS`)."""
    monkeypatch.setattr(streaming, "BAND_TOKENS", 64)
    m = model("released_windows").double()
    z = _latent(3).double()
    with torch.no_grad():
        whole = m.decode_clip(z, 0)
    _close(vae.decode(m, z, vae.Settings(temporal_chunk=1)), whole, 1e-12)


def test_one_latent_frame_a_chunk_gives_the_whole_clips_frames_in_float32():
    """In float32 the chunks' matrix products have other shapes than the whole clip's: rounding only (the
    seeded weights' peaked softmax amplifies it: about 2e-5 of the largest value measured)."""
    m = model("released_windows")
    z = _latent(6)
    with torch.no_grad():
        whole = m.decode_clip(z, 0)
    _close(vae.decode(m, z, vae.Settings(temporal_chunk=1)), whole, 1e-4)


def test_frames_reach_a_sink_before_the_last_chunk_each_once_in_order():
    m = model("released_windows")
    z = _latent(12)
    chunks_done, received = [0], []

    def sink(first, frames):
        received.append((chunks_done[0], first, frames.shape[2]))

    vae.decode(m, z, vae.Settings(temporal_chunk=1), sink=sink, progress=lambda done, total: chunks_done.__setitem__(0, done))
    starts = [first for _, first, _ in received]
    assert starts == sorted(starts) and sum(n for _, _, n in received) == 8 * 11 + 1
    assert all(first + n == after for (_, first, n), after in zip(received, starts[1:]))
    assert received[0][0] < 12 // 2  # the first frames come within the clip's first half of chunks


def test_out_of_memory_in_a_later_chunk_retries_with_shorter_chunks_and_the_same_frames(monkeypatch):
    """The second chunk of two latent frames fails once: the clip replays its first chunk with the caches
    offloaded, writing nothing, and goes on; the frames equal the whole clip's."""
    m = model("released_windows").double()
    z = _latent(6).double()
    with torch.no_grad():
        whole = m.decode_clip(z, 0)
    stages, calls = m.decode_stages(), []

    def failing_once(x, ctx):
        calls.append(x.shape[2])
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return stages[0](x, ctx)

    monkeypatch.setattr(m, "decode_stages", lambda: [failing_once, *stages[1:]])
    _close(vae.decode(m, z, vae.Settings(temporal_chunk=2)), whole, 1e-12)
    assert len(calls) > 3
