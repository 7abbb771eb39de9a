#!/usr/bin/env bash
# After a device call of bench/gpu_session.sh: unpack its results archive into bench/results/gpu/ and append
# its ledger lines to the committed ledger, so the next window skips what this one recorded.
#
#   bash bench/gpu_session_collect.sh /work/.device/<call>/files     # the reply's files_at
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
from=${1:?the folder the device call brought back (files_at)}
dest=bench/results/gpu
mkdir -p "$dest"
tar -xzf "$from/gpu-results.tar.gz" -C "$dest"
cat "$from/ledger.jsonl" >> "$dest/ledger.jsonl"
echo "unpacked into $dest/$(tar -tzf "$from/gpu-results.tar.gz" | head -1 | cut -d/ -f1); ledger:"
tail -n 20 "$dest/ledger.jsonl"
