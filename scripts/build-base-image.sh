#!/usr/bin/env bash
# Builds the Docker test cloud's base image offline: a minimal Debian rootfs with
# openssh-server made by debootstrap from the apt mirror this machine already uses, then
# `docker import`ed. No container registry is needed (none is reachable here).
#
# Usage: scripts/build-base-image.sh [IMAGE_TAG]   (default: gpuprov/debian-sshd-base:bookworm)
# Idempotent: does nothing when the image already exists.
set -euo pipefail
tag=${1:-gpuprov/debian-sshd-base:bookworm}
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base image $tag already present"
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
# The mirror apt already uses on this machine (deb822 or one-line sources).
mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -oE '^URIs: *\S+/debian/?$' | head -n1 | awk '{print $2}' || true)
[ -n "$mirror" ] || mirror=$(grep -hoE '^deb +\S+/debian/? ' /etc/apt/sources.list 2>/dev/null | head -n1 | awk '{print $2}' || true)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian
root=$(mktemp -d /tmp/gpuprov-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap bookworm from $mirror into $root"
debootstrap --variant=minbase --include=openssh-server,ca-certificates,iproute2,procps \
  bookworm "$root" "$mirror" >/tmp/gpuprov-debootstrap.log 2>&1 || {
  tail -n 30 /tmp/gpuprov-debootstrap.log; exit 1; }
# Host keys are generated per container at start, never baked into the image.
rm -f "$root"/etc/ssh/ssh_host_*
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import \
  --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "imported $tag"
