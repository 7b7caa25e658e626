#!/usr/bin/env bash
# Build the systemd test-host image out of Debian packages (no registry): mmdebstrap -> podman import.
# Cached: does nothing when the image already exists with the same package list (label on the image).
set -euo pipefail
IMAGE=${TESTHOST_IMAGE:-localhost/vllm-ops-testhost:bookworm}
SUITE=${TESTHOST_SUITE:-bookworm}
# What the roles need on a GPU host: systemd as PID 1, python3 for Ansible, git + a C toolchain +
# venv for building vLLM (here the fixture engine) from source.
PKGS=systemd,systemd-sysv,dbus,python3,python3-venv,python3-dev,python3-apt,git,gcc,libc6-dev,ca-certificates,procps,iproute2,curl,sudo
tag=$(printf '%s %s' "$SUITE" "$PKGS" | sha256sum | cut -c1-16)
if podman image exists "$IMAGE" && [ "$(podman image inspect -f '{{ index .Labels "testhost.pkgs" }}' "$IMAGE" 2>/dev/null)" = "$tag" ]; then
  echo "test host image $IMAGE is up to date"; exit 0
fi
tmp=$(mktemp -d /dev/shm/testhost.XXXXXX)   # dpkg on tmpfs is ~3.5x faster than on this disk
trap 'rm -rf "$tmp"' EXIT
# The hooks are run by mmdebstrap with the rootfs as $1: single quotes on purpose.
# shellcheck disable=SC2016
TMPDIR=$tmp mmdebstrap --quiet --variant=apt --include="$PKGS" \
  --customize-hook='rm -f "$1"/etc/machine-id; touch "$1"/etc/machine-id' \
  --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
  "$SUITE" "$tmp/rootfs.tar"
podman import --change 'CMD ["/lib/systemd/systemd"]' --change 'STOPSIGNAL SIGRTMIN+3' \
  --change "LABEL testhost.pkgs=$tag" "$tmp/rootfs.tar" "$IMAGE" >/dev/null
echo "built test host image $IMAGE"
