"""The memory model (vae/run/memory.py, calibrated by bench/calibrate_memory.py) predicts the peak of a
real full-size decode within 15%: each measurement is a fresh process's peak RSS (bench/memory_worker.py),
at sizes the calibration did not use; and the meta-device count behind its CUDA streamed coefficients
counts a steady chunk."""
import pytest

import vae.model.layers
from bench.common import run_worker
from bench.meta_peak import count
from vae.run import memory

# (size in pixels, tile in pixels or None, where the causal caches wait, kernel choice): untiled and
# exact-tiled, none of them calibration points; the last with its caches on disk (the model subtracts
# them). The first measures its kernels (the prediction then counts the Winograd filters it keeps); the
# others run the default kernels, which takes half the time (measuring is most of a small decode's).
POINTS = [(112, None, "none", "measure"), (192, 96, "none", "defaults"), (192, None, "disk", "defaults")]


@pytest.mark.measurement  # each point a decode in a fresh process whose peak RSS is measured: CI's second lane
@pytest.mark.skipif(not memory.CALIBRATION.is_file(), reason="no memory calibration (run bench/calibrate_memory.py)")
@pytest.mark.parametrize("size,tile,offload,kernels", POINTS, ids=["untiled-112px", "exact-192px-tile96", "untiled-192px-disk-caches"])
def test_predicted_peak_is_within_15_percent_of_the_measured_peak(size, tile, offload, kernels, tmp_path,
                                                                  monkeypatch):
    # Its own kernel record: the prediction counts the Winograd transforms of the kernels on record,
    # which must be what this worker ran, not what an earlier test measured.
    monkeypatch.setenv("STREAMVAE_KERNEL_CACHE", str(tmp_path))
    spec = dict(family="seedvr2", op="decode", frames=5, height=size, width=size, tile_size=tile,
                tiling="exact", temporal_chunk=1, cache_offload=offload, kernel_choice=kernels)
    result = run_worker("bench.memory_worker", spec, timeout=600)
    assert result["predicted_bytes"] is not None
    error = result["predicted_bytes"] / result["peak_bytes"] - 1
    assert abs(error) <= 0.15, (result, f"{100 * error:+.1f}%")


def test_the_meta_count_of_a_decoder_that_looks_ahead_reaches_its_last_stage():
    """`bench.meta_peak.count` (the CUDA streamed coefficients of LTX-2 and HV1.5) counts a steady chunk: for
    LTX-2, whose every layer gives a frame one frame late, only after about 22 latent frames does a chunk
    run the last stage (pixels of a quarter of the output's side, before the unpatchify). Two chunks, as a
    causal decoder needs, counted only the latent stages."""
    sdpa = vae.model.layers.sdpa
    live = count("ltx2", "decode", 128, 128, 128, chain=False)
    assert max(shape[-1] for _, shape in live.at_peak) >= 128 // 4, live.at_peak
    assert vae.model.layers.sdpa is sdpa  # the count's stand-in attention is gone: this process computes again
