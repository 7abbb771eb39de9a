#!/usr/bin/env bash
# What a GPU machine without network needs for bench/gpu_session.sh, put into .gpu-carry/ (ignored by
# git; a device call names it in `carry`, and everything carried must fit 64 MiB with the checkout):
#
#   reference/       the shared fixtures (tiny checkpoints) that the CUDA tests load       ~18 MB
#   comfyui-0.3.75/  ComfyUI 0.3.75's `comfy` package: its Wan VAEs                         ~1.4 MB
#   comfyui-0.33.0/  ComfyUI 0.33.0's `comfy` package: its Wan, SeedVR2, LTX and HV1.5 VAEs ~2.7 MB
#   wheels/          comfy-kitchen 0.2.40 (its 68 MB wheel repacked without backends/hip,  ~37 MB
#                    ROCm's kernels) and comfy-aimdo 0.6.0, as core's users install them, for
#                    the GPU image's Python 3.12 on x86-64
#
# The trees keep comfy/*.py, comfy/ldm/*.py and the ldm folders the VAEs use (modules, wan, seedvr,
# lightricks for LTX-2 and LTX-2.5, hunyuan_video and models for HV1.5 and HV1.0, minimax for MiniMax-H3);
# the text encoders, tokenizers and other models' networks stay behind. gpu_session.sh installs the
# wheels offline (pip --no-index --no-deps --target) and points bench/core_vae.py at all of it.
#
#   bash bench/prepare_gpu_carry.sh            # from the repository root, with PyPI reachable
#   STREAMVAE_CARRY=DIR bash bench/prepare_gpu_carry.sh --trees-only   # the two trees into DIR (tests)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CARRY=${STREAMVAE_CARRY:-.gpu-carry}
SHARED=${STREAMVAE_SHARED:-../shared}
KITCHEN=comfy-kitchen==0.2.40
AIMDO=comfy-aimdo==0.6.0
PY=${PYTHON:-.venv/bin/python}
TREE_075=${STREAMVAE_COMFYUI:-.cache/ComfyUI}
TREE_033=${STREAMVAE_COMFYUI_033:-.cache/comfyui-0.33.0/ComfyUI}
if [[ ! -f $TREE_033/comfy/ldm/seedvr/vae.py && -f $SHARED/comfyui/ComfyUI-0.33.0.tar.gz ]]; then
    TREE_033=$(mktemp -d)/ComfyUI  # not unpacked by .ci/setup here: from the shared archive
    tar -xzf "$SHARED/comfyui/ComfyUI-0.33.0.tar.gz" -C "$(dirname "$TREE_033")"
fi

log() { printf '[prepare_gpu_carry] %s\n' "$*"; }

rm -rf "$CARRY" && mkdir -p "$CARRY/wheels"

log "reference fixtures from $SHARED/reference"
cp -r "$SHARED/reference" "$CARRY/reference"

# copy_tree SRC DEST: the part of a ComfyUI tree that imports the VAEs of comfy.ldm (wan, seedvr, lightricks,
# hunyuan_video, models, minimax).
copy_tree() {
    local src=$1 dest
    dest=$(cd "$2" && pwd)  # absolute: the copy runs from inside src
    [[ -d $src/comfy ]] || { echo "no ComfyUI tree at $src (run .ci/setup)" >&2; exit 1; }
    log "ComfyUI tree $src -> $dest"
    (cd "$src" && find comfy -name '*.py' -not -path 'comfy/text_encoders/*' -not -path 'comfy/sd1_tokenizer/*' \
        \( -not -path 'comfy/ldm/*' -o -path 'comfy/ldm/modules/*' -o -path 'comfy/ldm/wan/*' \
           -o -path 'comfy/ldm/seedvr/*' -o -path 'comfy/ldm/minimax/*' \
           -o -path 'comfy/ldm/lightricks/*' -o -path 'comfy/ldm/hunyuan_video/*' -o -path 'comfy/ldm/models/*' -o -regex 'comfy/ldm/[^/]*\.py' \) -print0) |
        (cd "$src" && xargs -0 cp --parents -t "$dest")
}
mkdir -p "$CARRY/comfyui-0.3.75" "$CARRY/comfyui-0.33.0"
copy_tree "$TREE_075" "$CARRY/comfyui-0.3.75"
copy_tree "$TREE_033" "$CARRY/comfyui-0.33.0"
[[ ${1:-} == --trees-only ]] && exit 0

log "wheels $KITCHEN $AIMDO (Python 3.12, manylinux x86-64)"
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$CARRY/wheels" "$KITCHEN" "$AIMDO" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

# Repack kitchen without backends/hip (ROCm only; 31 MB compressed), its RECORD without those lines.
$PY - "$CARRY"/wheels/comfy_kitchen-*.whl <<'EOF'
import os, sys, zipfile
path = sys.argv[1]
dropped = "comfy_kitchen/backends/hip/"
with zipfile.ZipFile(path) as src, zipfile.ZipFile(path + ".tmp", "w", zipfile.ZIP_DEFLATED) as dst:
    for info in src.infolist():
        if info.filename.startswith(dropped):
            continue
        data = src.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"".join(line for line in data.splitlines(keepends=True) if not line.startswith(dropped.encode()))
        dst.writestr(info, data)
os.replace(path + ".tmp", path)
EOF
# The repacked wheel must still install (a dry install into a scratch folder, for Python 3.12).
scratch=$(mktemp -d)
$PY -m pip install -q --no-index --no-deps --only-binary=:all: --python-version 3.12 --target "$scratch" \
    "$CARRY"/wheels/*.whl 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
rm -rf "$scratch"

du -sh "$CARRY"/* | sed 's/^/[prepare_gpu_carry]   /'
total=$(( $(du -sb "$CARRY" | cut -f1) + $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) ))
log "carry + checkout: $((total / 1048576)) MiB of the 64 MiB a device call takes"
(( total < 64 * 1048576 )) || { echo "too large for one device call" >&2; exit 1; }
