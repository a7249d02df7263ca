#!/usr/bin/env bash
# make demo: mount the sample model, look at it as a user would, unmount.
set -euo pipefail
BIN=$1; BUILD=$2
export PATH="$PWD/$BIN:$PATH"
mkdir -p "$BUILD"
MODEL=$BUILD/sample.gguf
MNT=$BUILD/mnt
python examples/make_sample.py "$MODEL"
mkdir -p "$MNT"
tensorfs unmount "$MNT" 2>/dev/null || true
show() { printf '\n$ %s\n' "$*"; "$@"; }
trap 'tensorfs unmount "$MNT" 2>/dev/null || true' EXIT
show tensorfs inspect "$MODEL"
show tensorfs mount "$MODEL" "$MNT"
show ls "$MNT" "$MNT/blk/0"
show ls -l "$MNT/blk/0/attn_q"
show xxd -l 64 "$MNT/token_embd/weight"
show python -c "import numpy as np; a = np.load('$MNT/blk/0/attn_q/weight.npy'); print(a.dtype, a.shape, 'std', a.std())"
show python -c "import numpy as np; a = np.load('$MNT/token_embd/weight.npy', mmap_mode='r'); print(a.dtype, a.shape, a[1, :4])"
printf '\n$ head -c 300 %s\n' "$MNT/metadata.json"
head -c 300 "$MNT/metadata.json"; echo
show sha256sum "$MNT/token_embd/weight"
show tensorfs unmount "$MNT"
trap - EXIT
echo; echo "demo done: mounted, read and unmounted $MODEL"
