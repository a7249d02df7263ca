#!/usr/bin/env bash
# make check-debian13: the README's two commands (make demo, make test) and its quick start on
# a fresh Debian 13.
#     tools/check-debian13.sh ROOT MIRROR
# debootstraps trixie (minbase plus git, make, python3, python3-venv) into ROOT once, clones
# this repository's HEAD into it (and copies ../shared beside it, as CI has it), then runs
# both commands as root in a chroot inside a mount namespace of its own: /dev (for
# /dev/fuse), /proc and /sys are mounted there and vanish with it.
set -euo pipefail
root=${1:?usage: check-debian13.sh ROOT MIRROR}; mirror=${2:?usage: check-debian13.sh ROOT MIRROR}
repo=$(pwd)
[ "$(id -u)" = 0 ] || { echo "check-debian13: needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
[ -e /dev/fuse ] || { echo "check-debian13: /dev/fuse is missing here" >&2; exit 1; }
command -v debootstrap >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; }

mkdir -p "$root"; root=$(cd "$root" && pwd)
if [ ! -e "$root/.bootstrapped" ]; then
  echo "debootstrap trixie into $root from $mirror ..."
  debootstrap --variant=minbase --include=git,make,python3,python3-venv trixie "$root" "$mirror"
  touch "$root/.bootstrapped"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"          # apt-get and pip in the chroot
# A booted Debian has /etc/mtab (systemd-tmpfiles links it to the kernel's table); a bare
# debootstrap has none, and fusermount3 then refuses a user's unmount ("failed to open
# /etc/mtab"), which no machine a user runs would do.
[ -e "$root/etc/mtab" ] || ln -s ../proc/self/mounts "$root/etc/mtab"
rm -rf "$root/root/tensorfs" "$root/root/shared"
git clone -q "$repo" "$root/root/tensorfs"
shared=${SHARED:-$repo/../shared}
if [ -d "$shared" ]; then cp -r "$shared" "$root/root/shared"; chmod -R a-w "$root/root/shared"; fi

# A machine whose HTTPS goes through a proxy with its own CA names it in PIP_CERT: the
# chroot's pip gets the same bundle (pip otherwise trusts only its own certifi).
pip_cert=
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
  cp "$PIP_CERT" "$root/etc/check-debian13-ca.crt"; pip_cert=/etc/check-debian13-ca.crt
fi

unshare --mount --propagation private bash -euo pipefail -c '
  root=$1 pip_cert=$2
  mount --bind "$root" "$root"        # "/" a mount point in the chroot, as on a machine
  mount --rbind /dev "$root/dev"
  mount -t proc proc "$root/proc"
  mount -t sysfs sysfs "$root/sys"
  mount -t tmpfs tmpfs "$root/run"
  mount -t tmpfs tmpfs "$root/tmp"
  exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    ${pip_cert:+PIP_CERT=$pip_cert} \
    bash -euo pipefail -c "cd /root/tensorfs && . /etc/os-release && echo \"== \$PRETTY_NAME\" \
      && echo \"== make demo\" && make demo \
      && echo \"== the README quick start\" && bash tools/readme-quickstart.sh \
      && echo \"== make test\" && make test"
' check-debian13 "$root" "$pip_cert"
echo "check-debian13: make demo, the quick start and make test passed on Debian 13"
