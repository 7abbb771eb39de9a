#!/usr/bin/env bash
# The GPU check sized for a session that is lent a GPU for 15 minutes: one device call of about 8 minutes
# (starting the machine takes 1-3 of the 15), leaving time to rerun a part. The device machine sees only
# the working tree, so the shared fixtures and core's ComfyUI tree are copied in and carried:
#
#   mkdir -p .shared && cp -r ../shared/reference .shared/ && echo /.shared/ >> .git/info/exclude
#   device run:  STREAMVAE_COMMIT=<git rev-parse --short HEAD here> bash bench/gpu_session.sh
#                carry [".shared", ".cache/ComfyUI"], timeout_s 560
#
# Results: gpu_check's JSON lines in $OUT (the device tool brings them back), a table in the output.
set -u
export STREAMVAE_SHARED="${STREAMVAE_SHARED:-$PWD/.shared}"
out="${OUT:-bench/results/gpu}"
# 1. The CUDA tests (pytest -m gpu).
python -m bench.gpu_check --parts tests --part-budget 150 --out "$out" | tail -40
# 2. Wan2.1 81x480x832 decode, side by side: the fp32 reference, the default, fixed instead of measured
#    kernels, core's VAE with the same weights, then torch.compile (its "first s" includes compiling;
#    last, since it may not finish within the part's budget).
python -m bench.gpu_check --parts decode --families wan21 --part-budget 330 --out "$out" \
    --variants reference bf16 bf16-kernels_defaults bf16-core_0.3.75 bf16-compile
