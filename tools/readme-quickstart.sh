#!/usr/bin/env bash
# The README's quick start (the ```sh block after its "quick start" marker), run as written
# from the checkout in a new shell that knows nothing of this one: `env -i`, the standard
# PATH, no profile.  tools/check-debian13.sh runs it after `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
block=$(awk '/<!-- quick start/ {found=1; next} found && /^```sh$/ {inside=1; next}
             inside && /^```$/ {exit} inside {print}' README.md)
[ -n "$block" ] || { echo "readme-quickstart: no quick start block in README.md" >&2; exit 1; }
trap 'fusermount3 -uz mnt 2>/dev/null || true' EXIT
exec env -i HOME="${HOME:-/root}" LANG=C.UTF-8 \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  bash --noprofile --norc -e -o pipefail -c "$block"
