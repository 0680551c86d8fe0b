#!/usr/bin/env bash
# Build the sandbox *base* image without a container registry: debootstrap a minimal Debian
# root filesystem from the apt mirror this machine already uses, then `docker import` it.
#
# rlcycle calls this automatically when `FROM python:3.12-slim` cannot be pulled
# (rlcycle.sandbox.images.ensure_image); you can also run it by hand:
#
#   bash sandbox_images/build_base_offline.sh rlcycle-sandbox-base:bookworm
#
# Needs root (debootstrap) and a reachable Debian mirror (a package mirror, not a registry).
# The root filesystem tarball is cached in ${XDG_CACHE_HOME:-~/.cache}/rlcycle/ keyed by the
# suite and package list, so a rebuild after `docker rmi` takes seconds, not minutes.
#
# Environment:
#   RLCYCLE_DEBIAN_MIRROR  mirror URL (default: read from /etc/apt/sources.list{,.d/*})
#   RLCYCLE_DEBIAN_SUITE   suite (default: bookworm)
#   RLCYCLE_CACHE_DIR      where the tarball is cached (default: ~/.cache/rlcycle)
set -euo pipefail

TAG="${1:-rlcycle-sandbox-base:bookworm}"
SUITE="${RLCYCLE_DEBIAN_SUITE:-bookworm}"
# What the agent's tools need. pytest comes from Debian (python3-pytest): no PyPI in the build.
PACKAGES="python3,python3-pytest,git,ripgrep,coreutils,grep,sed,findutils,diffutils,patch,procps,ca-certificates"
CACHE="${RLCYCLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlcycle}"

log() { echo "build_base_offline: $*" >&2; }

find_mirror() {
  if [ -n "${RLCYCLE_DEBIAN_MIRROR:-}" ]; then echo "$RLCYCLE_DEBIAN_MIRROR"; return; fi
  local f url
  # deb822 sources (Debian 12 default): "URIs: http://deb.debian.org/debian"
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    url=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i !~ /security/) {print $i; exit}}' "$f")
    [ -n "$url" ] && { echo "$url"; return; }
  done
  # one-line sources: "deb [opts] http://deb.debian.org/debian bookworm main"
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    url=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/ && $i !~ /security/) {print $i; exit}}' "$f")
    [ -n "$url" ] && { echo "$url"; return; }
  done
  echo "http://deb.debian.org/debian"
}

if [ "$(id -u)" != "0" ]; then
  log "debootstrap needs root; rerun as root, or give Docker a registry so FROM python:3.12-slim works"
  exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  log "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2 \
    || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2; }
fi

mkdir -p "$CACHE"
KEY=$(printf '%s\n%s\n' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-16)
TARBALL="$CACHE/rootfs-$SUITE-$KEY.tar"

if [ ! -s "$TARBALL" ]; then
  MIRROR=$(find_mirror)
  ROOT=$(mktemp -d /tmp/rlcycle-rootfs.XXXXXX)
  trap 'rm -rf "$ROOT"' EXIT
  log "debootstrap $SUITE from $MIRROR into $ROOT (about 1-2 minutes)"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" >&2
  # Smaller image: no package lists or downloaded .debs are needed at run time.
  rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/log/*
  tar -C "$ROOT" --numeric-owner -cf "$TARBALL.tmp" .
  mv "$TARBALL.tmp" "$TARBALL"
  log "cached root filesystem in $TARBALL"
else
  log "using cached root filesystem $TARBALL"
fi

log "docker import $TAG"
docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' "$TARBALL" "$TAG" >&2
echo "$TAG"
