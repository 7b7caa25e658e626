#!/usr/bin/env bash
# Issue 26 item 3, GPU-host side: trace one vLLM start from the rendered unit (sandbox_trace.py run) per case.
#   bash sandbox_trace.sh setup              # strace from the carried .deb files, vLLM tree, models, release
#   bash sandbox_trace.sh eager|compiled ... # one traced start per case (after setup)
#   bash sandbox_trace.sh eager-user         # the eager case as User=vllm (render-srv/: paths outside /root)
# Env: SBX (the carried folder: sandbox_trace.py, unit_exec.py, mkmodel.py, make_release.py, debs/,
# render/<case>/), OUT (what comes back), CHUNKS (/root/w: site.part.*), SITE (/tmp/site),
# PY (/opt/torch/.venv/bin/python3), WAIT_<case> (seconds to wait for /health).
set -u
SBX=${SBX:-$(cd "$(dirname "$0")" && pwd)}
OUT=${OUT:-/tmp/sbx-out}
CHUNKS=${CHUNKS:-/root/w}
SITE=${SITE:-/tmp/site}
PY=${PY:-/opt/torch/.venv/bin/python3}
WORK=/root/sbx
PREFIX=$WORK/strace-root   # Debian's strace and libunwind, unpacked here and nowhere else
mkdir -p "$OUT" "$WORK"
ms() { echo $(( $(date +%s%N) / 1000000 )); }
step() { local step_name=$1; shift; local t; t=$(ms); "$@"; local rc=$?
  echo "{\"step\": \"$step_name\", \"rc\": $rc, \"ms\": $(( $(ms) - t ))}" >> "$OUT/steps.jsonl"; return $rc; }
# strace runs through the loader with --library-path: LD_LIBRARY_PATH would reach the traced server too.
STRACE="/lib64/ld-linux-x86-64.so.2 --library-path $PREFIX/usr/lib/x86_64-linux-gnu $PREFIX/usr/bin/strace"

unpack_debs() {
  mkdir -p "$PREFIX"
  for deb in "$SBX"/debs/*.deb; do
    if command -v dpkg >/dev/null; then dpkg -x "$deb" "$PREFIX" || return 1
    else "$PY" - "$deb" "$PREFIX" <<'PYEOF' || return 1
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
pos = 8  # "!<arch>\n", then 60-byte member headers
while pos < len(data):
    name, size = data[pos:pos + 16].decode().strip().rstrip("/"), int(data[pos + 48:pos + 58])
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(data[pos + 60:pos + 60 + size])).extractall(sys.argv[2])
    pos += 60 + size + (size & 1)
PYEOF
    fi
  done
  $STRACE -V | head -1 && $STRACE -f -qq -o /dev/null /bin/true
}

unpack_site() {
  [ -f "$SITE/.done" ] && return 0
  mkdir -p "$SITE"
  if command -v xz >/dev/null; then cat "$CHUNKS"/site.part.* | xz -dc -T0 | tar -x -C "$SITE"
  else cat "$CHUNKS"/site.part.* | "$PY" -c "import sys,tarfile; tarfile.open(fileobj=sys.stdin.buffer,mode='r|xz').extractall('$SITE')"; fi
  [ -d "$SITE/vllm" ] && touch "$SITE/.done"
}

make_models() {
  [ -f /root/models/model_info.json ] && return 0
  HF_HUB_OFFLINE=1 "$PY" "$SBX/mkmodel.py" /root/models > "$OUT/mkmodel.log" 2>&1
}

make_release() {
  local made name
  made=$("$PY" "$SBX/make_release.py" --root /opt/vllm --python "$PY" --site "$SITE" \
         --site /opt/torch/.venv/lib/python3.12/site-packages) || { echo "$made"; return 1; }
  name=$(echo "$made" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['name'])") || return 1
  ln -sfn "/opt/vllm/releases/$name" /opt/vllm/current
  test -x /opt/vllm/current/venv/bin/vllm
}

host_facts() {
  { date -u +%FT%TZ; uname -a; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    "$PY" -c "import torch; print('torch', torch.__version__, torch.version.cuda)" 2>&1
    $STRACE -V | head -1
    echo "--- ls -la /dev/nvidia* /dev/nvidia-caps"; ls -la /dev/nvidia* 2>&1; ls -la /dev/nvidia-caps 2>&1
    echo "--- /proc/devices"; cat /proc/devices
    echo "--- /proc/driver/nvidia/capabilities"; find /proc/driver/nvidia/capabilities -type f 2>/dev/null | head -20 | while read -r f; do echo "$f: $(tr '\n' ' ' < "$f")"; done
    echo "--- env"; env | sort | grep -E "^(LD_LIBRARY_PATH|CUDA_[A-Z_]*|NVIDIA_[A-Z_]*|TRITON_[A-Z_]*)="
  } > "$OUT/host.txt" 2>&1
}

# trace_case CASE [LABEL RENDER_DIR USER STATE_ROOT]: one traced start of render/<CASE>/'s unit
trace_case() {
  local case=$1 label=${2:-$1} dir=${3:-$SBX/render/$1} user=${4:-} state=${5:-$WORK/state} wait_var="WAIT_$1"
  mkdir -p /etc/vllm
  cp "$dir/sbx-$case.yaml" "$dir/sbx-$case.env" /etc/vllm/ && chmod 0600 "/etc/vllm/sbx-$case.env"
  # what run_proof.sh passes on: the CUDA variables of the caller, as an operator's vllm_extra_env would
  local var
  for var in LD_LIBRARY_PATH CUDA_HOME CUDA_VISIBLE_DEVICES TRITON_LIBCUDA_PATH; do
    [ -n "${!var:-}" ] && echo "$var=${!var}" >> "/etc/vllm/sbx-$case.env"
  done
  rm -rf "${WORK:?}/$label"
  "$PY" "$SBX/sandbox_trace.py" run "$dir/vllm-sbx-$case.service" --sandbox "$dir/sandbox.json" \
    --strace "$STRACE" --work "$WORK/$label" --out "$OUT/summary-$label.json" --state-root "$state" \
    --timeout "${!wait_var:-420}" ${user:+--user "$user"}
  local rc=$?
  tail -c 400000 "$WORK/$label/server.log" > "$OUT/server-$label.log" 2>/dev/null
  return $rc
}

# The eager case as User=vllm (strace -u): everything it reads or writes lives outside /root (0700),
# rendered with sandbox_models=/srv/sbx/models and sandbox_hf_home=/srv/sbx/hf-home into render-srv/.
trace_as_user() {
  if ! id vllm >/dev/null 2>&1; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin vllm 2>/dev/null || {
      echo "vllm:x:990:990::/nonexistent:/usr/sbin/nologin" >> /etc/passwd; echo "vllm:x:990:" >> /etc/group; }
  fi
  mkdir -p /srv/sbx/hf-home && chmod 0755 /srv/sbx && chown vllm:vllm /srv/sbx/hf-home || return 1
  # mkmodel.py's safetensors are 0600 root: the copy dereferences and opens them to all, as a staged model is
  [ -d /srv/sbx/models ] || { cp -rL /root/models /srv/sbx/models && chmod -R a+rX /srv/sbx/models; } || return 1
  trace_case eager eager-user "$SBX/render-srv/eager" vllm /srv/sbx/state
}

for what in "$@"; do
  case $what in
    setup)
      if ! { step debs unpack_debs && step site unpack_site && step facts host_facts && step models make_models \
               && step release make_release; }; then
        echo "setup failed"; cat "$OUT/steps.jsonl"; exit 2
      fi ;;
    debs) if ! { step debs unpack_debs && step facts host_facts; }; then exit 2; fi ;;
    eager|compiled) step "trace-$what" trace_case "$what" ;;
    eager-user) step "trace-eager-user" trace_as_user ;;
    *) echo "unknown step $what"; exit 2 ;;
  esac
done
cat "$OUT/steps.jsonl"
