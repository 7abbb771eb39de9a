"""StreamVAE's benchmarks: every tool is a module run from the repository root, `python -m bench.<tool>`.

- `bench.bench_vae`: every optimization of the full released configs, one process per row (peak memory)
- `bench.bench_kernels`: measured kernels vs fixed defaults vs straightforward vs core, interleaved rounds
- `bench.bench_tiling`, `bench.bench_video_file`, `bench.bench_precision`, `bench.bench_norms`,
  `bench.bench_winograd`, `bench.bench_distributed`: one subject each
- `bench.calibrate_memory`: fits the memory model (vae/model/<family>/memory_calibration.json)
- `bench.gpu_check`, `bench.gpu_profile`, `bench.gpu_session`: the GPU check, profile and the resumable session
- `bench.soak`: many random prompts through a real ComfyUI server (not part of CI)

Shared parts: `models` (the one model builder and inputs), `variants` (the one variant table: what a
row runs), `core_vae` (ComfyUI core's own VAEs with the same weights), `common` (timing, memory,
machine records, tables). Results and the commands that made them: bench/RESULTS.md.
"""
