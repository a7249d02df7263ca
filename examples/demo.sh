#!/usr/bin/env bash
# make demo: mount the sample model, look at it as a user would, unmount.
# Uses only what `make demo` installs and what a minimal Debian has (od is coreutils).
set -euo pipefail
BIN=$1; BUILD=$2
case $BIN in /*) export PATH="$BIN:$PATH" ;; *) export PATH="$PWD/$BIN:$PATH" ;; esac
mkdir -p "$BUILD"
MODEL=$BUILD/sample.gguf
MNT=$BUILD/mnt
python examples/make_sample.py "$MODEL"
mkdir -p "$MNT"
tensorfs unmount "$MNT" 2>/dev/null || true

# One word as a shell reads it back: bare when it is safe, else in single quotes.
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then printf '%s' "$1"
  else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
# Print the command exactly as it can be pasted into a shell, then run it.
show() {
  printf '\n$'
  for word in "$@"; do printf ' '; quote "$word"; done
  printf '\n'
  "$@"
}
trap 'tensorfs unmount "$MNT" 2>/dev/null || true' EXIT
echo "Commands as typed in $PWD, with $BIN on PATH (. $BIN/activate):"
show tensorfs inspect "$MODEL"
show tensorfs mount "$MODEL" "$MNT"
show ls "$MNT" "$MNT/blk/0"
show ls -l "$MNT/blk/0/attn_q"
show od -A x -t x1z -N 64 "$MNT/token_embd/weight"
show python -c "import numpy as np; a = np.load(\"$MNT/blk/0/attn_q/weight.npy\"); print(a.dtype, a.shape, \"std\", a.std())"
show python -c "import numpy as np; a = np.load(\"$MNT/token_embd/weight.npy\", mmap_mode=\"r\"); print(a.dtype, a.shape, a[1, :4])"
show head -c 300 "$MNT/metadata.json"; echo
show sha256sum "$MNT/token_embd/weight"
show tensorfs unmount "$MNT"
trap - EXIT
echo; echo "demo done: mounted, read and unmounted $MODEL"
