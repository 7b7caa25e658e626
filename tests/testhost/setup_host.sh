#!/usr/bin/env bash
# Prepare this machine to run the real systemd test hosts: podman (rootful, runc) and mmdebstrap;
# prometheus for promtool (the lint stage checks and tests dflash_monitoring's rules).
# Idempotent; needs root. Safe to re-run: it only installs what is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
for pkg in podman runc mmdebstrap ca-certificates uidmap shellcheck openssh-client prometheus; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if ((${#need[@]})); then
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi
# crun 1.8 refuses this host's hybrid cgroup layout, and root here lacks CAP_SYS_RESOURCE, so podman's
# default rlimits cannot be applied: use runc and lower limits.
mkdir -p /etc/containers
conf=/etc/containers/containers.conf
want=$'[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n[engine]\nruntime = "runc"'
if [ ! -f "$conf" ] || ! grep -q 'runtime = "runc"' "$conf"; then
  printf '%s\n' "$want" > "$conf"
fi
