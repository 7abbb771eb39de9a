#!/usr/bin/env bash
# The GPU check sized for a session that is lent a GPU for 15 minutes: one device call of about 8 minutes
# (starting the machine takes 1-3 of the 15), leaving time to rerun a part. The device machine sees only
# the working tree and has no network, so what it needs beside the checkout is prepared here first:
#
#   here:        bash bench/prepare_gpu_carry.sh      # .gpu-carry/: fixtures, core trees, kitchen/aimdo wheels
#   device run:  STREAMVAE_COMMIT=<git rev-parse --short HEAD here> bash bench/gpu_session.sh
#                carry [".gpu-carry"], timeout_s 560
#
# Results: gpu_check's JSON lines in $OUT (the device tool brings them back), a table in the output; every
# row has its max error against the fp32 reference (every switch off, TF32 off) of the same workload.
set -u
py=${PYTHON:-python3}
carry=$PWD/.gpu-carry
export STREAMVAE_SHARED=$carry STREAMVAE_COMFYUI=$carry/comfyui-0.3.75 STREAMVAE_COMFYUI_033=$carry/comfyui-0.33.0
export STREAMVAE_CORE_SITE=/tmp/streamvae-core-site PYTHONUNBUFFERED=1
out="${OUT:-bench/results/gpu}"
# 0. comfy-kitchen 0.2.40 and comfy-aimdo 0.6.0 as core's users have them, for core 0.33.0's rows only.
$py -m pip install -q --no-index --no-deps --no-compile --target "$STREAMVAE_CORE_SITE" "$carry"/wheels/*.whl
# 1. The CUDA tests (pytest -m gpu).
$py -m bench.gpu_check --parts tests --part-budget 120 --out "$out" | tail -40
# 2. SeedVR2 21x720x1280 decode: the fp32 reference, the default, ComfyUI 0.33.0's native SeedVR2 VAE
#    with the same weights (comfy-kitchen active), and the default within 6 GiB (its time and peak; the
#    card sweep at 1080p and 4K is bench/gpu_memory_session.sh, a second call).
$py -m bench.gpu_check --parts decode --workloads seedvr2:21x720x1280 --part-budget 150 --out "$out" \
    --variants reference bf16 bf16-core_0.33.0 bf16-budget_6g
# 3. Wan2.1 81x480x832 decode, side by side: the reference, the default, core 0.33.0's and 0.3.75's WanVAE
#    with the same weights, fixed instead of measured kernels, then torch.compile (its "first s" includes
#    compiling; last, since it may not finish within the part's budget).
$py -m bench.gpu_check --parts decode --families wan21 --part-budget 230 --out "$out" \
    --variants reference bf16 bf16-core_0.33.0 bf16-core_0.3.75 bf16-kernels_defaults bf16-compile
