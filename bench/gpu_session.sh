#!/usr/bin/env bash
# The GPU check sized for a session that is lent a GPU for 15 minutes: one device call of about 8 minutes
# (starting the machine takes 1-3 of the 15), leaving time to rerun a part. The device machine sees only
# the working tree and has no network, so what it needs beside the checkout is prepared here first:
#
#   here:        bash bench/prepare_gpu_carry.sh      # .gpu-carry/: fixtures, core trees, kitchen/aimdo wheels
#   device run:  STREAMVAE_COMMIT=<git rev-parse --short HEAD here> bash bench/gpu_session.sh
#                carry [".gpu-carry"], timeout_s 560
#
# What it measures (issue 33, GPU speed): the clips of the targets, bf16 decode, each side by side
# with the fp32 reference (the error columns: max error, PSNR), StreamVAE's default (NDHWC activations on
# CUDA), the same in NCDHW (the layout before the change: "today's"), and ComfyUI 0.33.0's own VAE with
# the same weights (comfy-kitchen 0.2.40 and comfy-aimdo 0.6.0 installed as its users have them); every
# row has upstream's model FLOPs over its time against the same process's bf16 GEMM rate ("% GEMM"). Rows run
# in that order within each part's budget: if one runs out, the NCDHW row (last) is the one skipped.
# The memory sweep of issue 32 is the second call, bench/gpu_memory_session.sh.
#
# Results: gpu_check's JSON lines in $OUT (the device tool brings them back), a table in the output.
set -u
py=${PYTHON:-python3}
carry=$PWD/.gpu-carry
export STREAMVAE_SHARED=$carry STREAMVAE_COMFYUI=$carry/comfyui-0.3.75 STREAMVAE_COMFYUI_033=$carry/comfyui-0.33.0
export STREAMVAE_CORE_SITE=/tmp/streamvae-core-site PYTHONUNBUFFERED=1
out="${OUT:-bench/results/gpu}"
# 0. comfy-kitchen 0.2.40 and comfy-aimdo 0.6.0 as core's users have them, for core 0.33.0's rows only.
$py -m pip install -q --no-index --no-deps --no-compile --target "$STREAMVAE_CORE_SITE" "$carry"/wheels/*.whl
# 1. The CUDA tests (pytest -m gpu): the Triton kernels natively, both layouts, the kernel choice.
$py -m bench.gpu_check --parts tests --part-budget 60 --out "$out" | tail -30
# 2. Wan2.1 81x480x832 decode (target <= 0.9 s, >= 1.8x core 0.33.0).
$py -m bench.gpu_check --parts decode --workloads wan21:81x480x832 --part-budget 100 --out "$out" \
    --variants reference bf16 bf16-core_0.33.0 bf16-ncdhw
# 3. Wan2.2 81x704x1280 decode (target <= 2.0 s).
$py -m bench.gpu_check --parts decode --workloads wan22:81x704x1280 --part-budget 90 --out "$out" \
    --variants reference bf16 bf16-core_0.33.0 bf16-ncdhw
# 4. SeedVR2 81x720x1248 decode (target <= 3.0 s; core 0.33.0's native SeedVR2 VAE with comfy-kitchen).
$py -m bench.gpu_check --parts decode --workloads seedvr2:81x720x1248 --part-budget 120 --out "$out" \
    --variants reference bf16 bf16-core_0.33.0 bf16-ncdhw
# 5. Encode of the Wan2.1 clip: NDHWC against NCDHW (target >= 1.5x).
$py -m bench.gpu_check --parts encode --workloads wan21:81x480x832 --part-budget 50 --out "$out" \
    --variants reference bf16 bf16-ncdhw
# 6. Where the default's time goes now (bench.gpu_profile, Wan2.1 480p): the "layout conversion" kind
#    (cuDNN's nchwToNhwc / nhwcToNchw, 14 % of the NCDHW decode in section 0) should be gone.
$py -m bench.gpu_check --parts profile --workloads wan21:81x480x832 --part-budget 45 --out "$out" | tail -30
