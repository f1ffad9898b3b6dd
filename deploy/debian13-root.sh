#!/usr/bin/env bash
# Runs a command on Debian 13 (trixie), the system numaserve targets.
#
#   deploy/debian13-root.sh COMMAND [ARG...]
#
# On Debian 13 it runs COMMAND as it is. On an older Debian host it runs
# COMMAND inside a Debian 13 root made once with debootstrap
# (NUMASERVE_DEBIAN13_ROOT, default /var/cache/numaserve/debian13-root),
# in a mount namespace of its own: /proc, /sys, /dev and the folder above
# the source tree are bound in at the same paths, so the build trees,
# the tests and ccache's cache (kept inside the root) see one set of paths,
# and nothing stays mounted after COMMAND ends. The host's CA bundle is
# bound in too, so that apt, pip and npm trust what the host trusts. Needs root (debootstrap,
# mount, chroot); the root takes about 30 s to make and 3 GiB once
# install-deps.sh has run in it.
set -euo pipefail

if [ $# -eq 0 ]; then
  echo "usage: deploy/debian13-root.sh COMMAND [ARG...]" >&2
  exit 2
fi

version_id=$(. /etc/os-release && echo "${VERSION_ID:-0}")
if [ "${version_id%%.*}" -ge 13 ] 2>/dev/null || [ -n "${NUMASERVE_IN_DEBIAN13_ROOT:-}" ]; then
  exec "$@"
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "debian13-root: this host runs Debian ${version_id}; numaserve targets Debian 13." \
    "Making a Debian 13 root needs root (debootstrap, mount, chroot): run this as root," \
    "or build on a Debian 13 machine." >&2
  exit 1
fi

root=${NUMASERVE_DEBIAN13_ROOT:-/var/cache/numaserve/debian13-root}
mirror=${NUMASERVE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
src=$(cd "$(dirname "$0")/.." && pwd)
share=$(dirname "$src")
# The folder above the tree (its neighbours, such as a shared/ beside it),
# unless that is / itself: then the tree alone.
[ "$share" = / ] && share=$src

if [ ! -x "$root/usr/bin/apt-get" ] || [ ! -f "$root/.numaserve-root-ready" ]; then
  if ! command -v debootstrap >/dev/null; then
    echo "debian13-root: installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  fi
  echo "debian13-root: making a Debian 13 root in $root"
  rm -rf "$root"
  mkdir -p "$(dirname "$root")"
  debootstrap --variant=minbase --include=ca-certificates trixie "$root" "$mirror" \
    >"$(dirname "$root")/debootstrap.log" 2>&1 ||
    { tail -20 "$(dirname "$root")/debootstrap.log" >&2; exit 1; }
  touch "$root/.numaserve-root-ready"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mkdir -p "$root$share"

# The command line, quoted once for the shell inside.
quoted=$(printf '%q ' "$@")
inner="mount -t proc proc '$root/proc' &&
  mount --rbind /sys '$root/sys' && mount --rbind /dev '$root/dev' &&
  mount --bind '$share' '$root$share' &&
  { [ ! -f /etc/ssl/certs/ca-certificates.crt ] || [ ! -f '$root/etc/ssl/certs/ca-certificates.crt' ] ||
    mount --bind -o ro /etc/ssl/certs/ca-certificates.crt '$root/etc/ssl/certs/ca-certificates.crt'; } &&
  exec chroot '$root' /usr/bin/env NUMASERVE_IN_DEBIAN13_ROOT=1 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    /bin/bash -c 'cd \"\$1\" && shift && exec \"\$@\"' debian13-root '$PWD' $quoted"
exec unshare --mount --propagation private /bin/bash -c "$inner"
