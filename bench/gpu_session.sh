#!/usr/bin/env bash
# The GPU check for a session lent a GPU: the parts of bench/gpu_session.py not yet recorded for this code
# and this GPU, most important first, within the seconds given (default 540: a 600 s device call). The
# device machine sees only the working tree and has no network, so what it needs is prepared here first:
#
#   here:        bash bench/prepare_gpu_carry.sh      # .gpu-carry/: fixtures, core trees, kitchen/aimdo wheels
#   device run:  STREAMVAE_COMMIT=<git rev-parse --short HEAD here> bash bench/gpu_session.sh 540
#                carry [".gpu-carry"], timeout_s 590
#   afterwards:  bash bench/gpu_session_collect.sh <files_at>   # results and ledger into bench/results/gpu/
#
# A second window runs what the first did not record: collect first, so its ledger travels.
set -u
py=${PYTHON:-python3}
carry=$PWD/.gpu-carry
export STREAMVAE_SHARED=$carry STREAMVAE_COMFYUI=$carry/comfyui-0.3.75 STREAMVAE_COMFYUI_033=$carry/comfyui-0.33.0
export STREAMVAE_CORE_SITE=/tmp/streamvae-core-site PYTHONUNBUFFERED=1
# A worker still running after 30 s prints its Python stacks into the part's log, every 30 s (bench/common.py).
export STREAMVAE_STACKS_EVERY=${STREAMVAE_STACKS_EVERY:-30}
# comfy-kitchen 0.2.40 and comfy-aimdo 0.6.0 as core's users have them, for core 0.33.0's rows only.
if compgen -G "$carry/wheels/*.whl" > /dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --target "$STREAMVAE_CORE_SITE" "$carry"/wheels/*.whl
fi
# What this GPU is and which kernels, layout and memory calibration StreamVAE takes there (seconds).
$py -m vae doctor
exec $py -m bench.gpu_session --seconds "${1:-540}"
