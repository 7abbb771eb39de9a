#!/usr/bin/env bash
# The "fits every GPU" check, a second device call of about 7 minutes for a 15-minute lease (the first is
# bench/gpu_session.sh): the CUDA calibration of frame streaming, then the memory sweep with the budget
# enforced as a card of that size (torch.cuda.set_per_process_memory_fraction).
#
#   device run:  bash bench/gpu_memory_session.sh       (no carry needed: random weights, no fixtures)
#
# Results in $OUT: the calibration (memory_calibration.json, to copy into vae/), the sweep's JSON lines,
# and the table in the output (plan, predicted and measured peak, seconds, max error against untiled).
set -u
py=${PYTHON:-python3}
out="${OUT:-bench/results/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# 1. CUDA coefficients of the streamed mode (one process per family: the allocator's statistics are exact).
timeout 200 $py -m bench.calibrate_memory --device cuda --modes streamed --families seedvr2 wan21 --ops decode
cp vae/memory_calibration.json "$out/memory_calibration.json"
# 2. SeedVR2 1080p and 4K decode, 21 frames, bf16, within cards of 6/8/12/16 GiB (4K: 10/16), with the
#    untiled 1080p run as the time reference.
timeout 160 $py -m bench.memory_sweep --device cuda --dtype bf16 --frames 21 --sizes 1080x1920 \
    --budgets-gib 6 8 12 16 --out "$out/memory_sweep_cuda_seedvr2_1080p.json"
timeout 100 $py -m bench.memory_sweep --device cuda --dtype bf16 --frames 21 --sizes 2160x3840 --no-untiled \
    --budgets-gib 10 16 --out "$out/memory_sweep_cuda_seedvr2_4k.json"
