#!/usr/bin/env bash
# Build the systemd test-host image out of Debian packages (no registry): mmdebstrap -> podman import.
# Cached: does nothing when the image already exists with the same package list (label on the image).
set -euo pipefail
IMAGE=${TESTHOST_IMAGE:-localhost/vllm-ops-testhost:bookworm}
SUITE=${TESTHOST_SUITE:-bookworm}
# What the roles need on a GPU host: systemd as PID 1, python3 for Ansible, git + a C toolchain +
# venv for building vLLM (here the fixture engine) from source.
# openssh-server: Ansible reaches the hosts over SSH with pipelining, as it reaches real GPU hosts
# (5x faster per task than `podman exec`); testinfra still inspects them through podman.
# libnuma1: real GPU hosts have it, and real vLLM (the CPU build in the `real` scenario) links vllm._C to it.
PKGS=systemd,systemd-sysv,dbus,python3,python3-venv,python3-dev,python3-apt,git,gcc,libc6-dev,ca-certificates,procps,iproute2,curl,sudo,openssh-server,libnuma1
KEY_DIR=${TESTHOST_KEY_DIR:-/var/tmp/vllm-ops-testhost}
mkdir -p "$KEY_DIR"
[ -f "$KEY_DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C vllm-ops-testhost -f "$KEY_DIR/id_ed25519"
tag=$(cat - "$KEY_DIR/id_ed25519.pub" <<<"$SUITE $PKGS" | sha256sum | cut -c1-16)
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
  --customize-hook="install -d -m 0700 \"\$1\"/root/.ssh && install -m 0600 $KEY_DIR/id_ed25519.pub \"\$1\"/root/.ssh/authorized_keys" \
  --customize-hook='chroot "$1" systemctl enable ssh' \
  "$SUITE" "$tmp/rootfs.tar"
podman import --change 'CMD ["/lib/systemd/systemd"]' --change 'STOPSIGNAL SIGRTMIN+3' \
  --change "LABEL testhost.pkgs=$tag" "$tmp/rootfs.tar" "$IMAGE" >/dev/null
echo "built test host image $IMAGE"
podman image prune -f >/dev/null 2>&1 || true
