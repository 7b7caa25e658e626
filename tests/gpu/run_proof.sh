#!/usr/bin/env bash
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Host side of the proof on real hardware (issue #6); tests/gpu/README.md says how to run it.
#   bash tests/gpu/run_proof.sh [prep|fork] [proof]       (prep and proof when none is named)
# prep:  unpack the carried vLLM tree (PROOF_CHUNKS/site.part.*) into PROOF_SITE unless it is there;
#        build the tiny models (mkmodel.py) into PROOF_MODELS unless they are there.
# fork:  instead of prep, for the fork proof (issue #16, tests/gpu/fork.yml): put together what
#        prepare_fork.sh carried to PROOF_FORK_DIR (the wheels, the fork's repo, uv, vLLM's runtime
#        needs), let the host's python see those and torch in its system site, and build the models.
# proof: install ansible-core from PROOF_WHEELS unless PROOF_PYTHON imports it; run proof.yml under
#        the time budget; stop any server it left.
# Every step is timed; the results always land in RESULTS (at most 4 files: summary.json, ansible.log,
# facts-vllm.json, proof.tgz with everything else), also when the budget runs out or a step fails.
# Exit status: 0 when every step ran and every case of the play passed.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
T_BEGIN=$(date +%s)
BUDGET=${PROOF_BUDGET:-540} # seconds this script may take, packing included
RESULTS=${OUT:-${PROOF_RESULTS:-$REPO/tests/output/gpu-proof}}
BASE=${PROOF_BASE:-/root/proof-run}       # prep timings, logs; kept across calls on one machine
WORK=$BASE/out                            # what the play writes (cleared by each proof)
SITE=${PROOF_SITE:-/tmp/site}
CHUNKS=${PROOF_CHUNKS:-/root/w}
MODELS=${PROOF_MODELS:-/root/models}
PY=${PROOF_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
ANSIBLE_DIR=${PROOF_ANSIBLE_DIR:-/tmp/ans}
FORK=${PROOF_FORK_DIR:-/root/w/fork}
FORK_REPO=${PROOF_FORK_REPO:-/root/fork.git}
DEPS=${PROOF_DEPS:-/tmp/deps}
ROOT=${PROOF_ROOT:-/opt/vllm}
WHEELS=${PROOF_WHEELS:-$REPO/.whl}
[ -d "$WHEELS" ] || [ ! -d "$FORK/ansible-wheels" ] || WHEELS=$FORK/ansible-wheels
STEPS=$BASE/steps.jsonl
PLAY_RC=""
mkdir -p "$BASE" "$RESULTS"

left() { echo $((BUDGET - ($(date +%s) - T_BEGIN))); }
# step NAME SECONDS_MAX CMD...: run CMD under a timeout, log to $BASE/NAME.log, record rc and seconds.
step() {
  local name=$1 limit=$2 t0 rc ms
  shift 2
  if [ "$(left)" -lt $((limit < 30 ? limit : 30)) ]; then
    echo "{\"step\": \"$name\", \"rc\": null, \"skipped\": \"only $(left) s left\"}" >>"$STEPS"
    return 99
  fi
  [ "$limit" -gt "$(($(left) - 20))" ] && limit=$(($(left) - 20))
  t0=$(date +%s%N)
  timeout -k 10 "$limit" "$@" >"$BASE/$name.log" 2>&1
  rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  printf '{"step": "%s", "rc": %d, "seconds": %d.%03d, "limit_s": %d, "at": %d}\n' \
    "$name" "$rc" $((ms / 1000)) $((ms % 1000)) "$limit" "$(date +%s)" >>"$STEPS"
  echo "== $name rc=$rc ($(tail -c 300 "$BASE/$name.log" | tr '\n' ' '))"
  return $rc
}

# shellcheck disable=SC2317  # run through step()
unpack() {
  mkdir -p "$SITE"
  if command -v xz >/dev/null; then
    cat "$CHUNKS"/site.part.* | xz -dc -T0 | tar -x -C "$SITE"
  else
    cat "$CHUNKS"/site.part.* | "$PY" -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('$SITE')"
  fi
  [ -d "$SITE/vllm" ] && touch "$SITE/.done"
}

host_facts() {
  echo "date: $(date -u +%FT%TZ)"; uname -a
  echo "pid1: $(cat /proc/1/comm 2>&1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
  "$PY" -c "import sys; print('python', sys.version.split()[0], sys.executable)"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1 | tail -1
  command -v ldconfig >/dev/null && ldconfig -p | grep -E "libcuda\.so" | head -3
  echo "-- environment that matters to CUDA, Python and vLLM (nothing with TOKEN/KEY/SECRET/PASSWORD in its name)"
  env | sort | grep -E "^(PATH|LD_LIBRARY_PATH|CUDA_[A-Z_]*|NVIDIA_[A-Z_]*|PYTHON[A-Z_]*|HF_[A-Z_]*|VLLM_[A-Z_]*|TRITON_[A-Z_]*|TORCH_[A-Z_]*|LANG|LC_[A-Z]*)=" |
    grep -vE "^[^=]*(TOKEN|KEY|SECRET|PASSWORD)[^=]*=" | cut -c1-400
}

prep() {
  [ -f "$BASE/host.txt" ] || host_facts >"$BASE/host.txt" 2>&1
  if [ -d "$SITE/vllm" ]; then
    echo "{\"step\": \"unpack\", \"skipped\": \"$SITE/vllm is there\"}" >>"$STEPS"
  elif ls "$CHUNKS"/site.part.* >/dev/null 2>&1; then
    # timeout(1) runs programs, not shell functions: hand it a bash that knows the function.
    export -f unpack; export SITE CHUNKS PY
    step unpack 120 bash -c unpack || return 1
  else
    echo "no vLLM in $SITE and no $CHUNKS/site.part.*: set PROOF_SITE to the dir that holds vllm" >&2
    return 1
  fi
  if [ -f "$MODELS/model_info.json" ]; then
    echo "{\"step\": \"mkmodel\", \"skipped\": \"$MODELS/model_info.json is there\"}" >>"$STEPS"
  else
    step mkmodel 180 "$PY" "$HERE/mkmodel.py" "$MODELS" || return 1
  fi
}

# shellcheck disable=SC2317  # run through step()
fork_assemble() {
  set -e
  local key name sha
  mkdir -p "$FORK/wheels"
  for key in fix forced; do
    name=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]['wheel'])" "$FORK/fork.json" "$key")
    sha=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]['sha256'])" "$FORK/fork.json" "$key")
    [ -f "$FORK/wheels/$name" ] && continue
    # The forced build is needed by the forced case alone: a run without it may leave its parts behind.
    ls "$FORK/$key".part.* >/dev/null 2>&1 || { echo "no $key.part.* in $FORK: $name not assembled"; continue; }
    cat "$FORK/$key".part.* >"$FORK/wheels/$name.part"
    echo "$sha  $FORK/wheels/$name.part" | sha256sum -c - && mv "$FORK/wheels/$name.part" "$FORK/wheels/$name"
  done
  rm -rf "$FORK_REPO" && git clone -q --bare "$FORK/fork.bundle" "$FORK_REPO"
  git --git-dir "$FORK_REPO" show-ref
  mkdir -p "$ROOT/tools/bin" && xz -dc "$FORK/uv.xz" >"$ROOT/tools/bin/uv" && chmod 0755 "$ROOT/tools/bin/uv"
  mkdir -p "$DEPS" && xz -dc "$FORK/deps.tar.xz" | tar -x -C "$DEPS"
  # The host's python with torch (and vLLM's runtime needs) in its system site, as on a GPU host whose
  # python has them: the release venv (system_site_packages) then holds vLLM alone.
  local base site torch_site
  base=$("$PY" -c "import sys; print(getattr(sys, '_base_executable', sys.executable))")
  site=$("$base" -I -c "import site; print(site.getsitepackages()[0])")
  torch_site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  mkdir -p "$site"
  printf 'import site; site.addsitedir("%s"); site.addsitedir("%s")\n' "$DEPS" "$torch_site" >"$site/zz_vllm_ops_gpu_rig.pth"
  echo "base python $base, system site $site: + $DEPS + $torch_site"
  rm -rf /tmp/site-check && "$ROOT/tools/bin/uv" venv -q --python "$PY" --system-site-packages /tmp/site-check
  /tmp/site-check/bin/python -c "import torch, fastapi, xgrammar, transformers; print('system site ok: torch', torch.__version__)"
  rm -rf /tmp/site-check
}

fork() {
  [ -f "$BASE/host.txt" ] || host_facts >"$BASE/host.txt" 2>&1
  export -f fork_assemble; export FORK FORK_REPO DEPS ROOT PY HERE
  step fork-assemble 240 bash -c fork_assemble || return 1
  if [ -f "$MODELS/model_info.json" ]; then
    echo "{\"step\": \"mkmodel\", \"skipped\": \"$MODELS/model_info.json is there\"}" >>"$STEPS"
  else
    step mkmodel 180 "$PY" "$HERE/mkmodel.py" "$MODELS" || return 1
  fi
}

install_ansible() {
  if PYTHONPATH=$ANSIBLE_DIR "$PY" -c "import ansible.cli.playbook" 2>/dev/null; then
    echo "{\"step\": \"ansible-install\", \"skipped\": \"$PY imports ansible\"}" >>"$STEPS"
    return 0
  fi
  step ansible-install 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$ANSIBLE_DIR" \
    "$WHEELS"/*.whl
}

run_vars() {
  # Extra vars from the environment; only what is set, so proof.yml's defaults (the H200 rig's) stay.
  PROOF_DEADLINE=$((T_BEGIN + BUDGET - 25)) "$PY" - "$WORK" "$MODELS" <<'EOF'
import json, os, sys
out = {"proof_out": sys.argv[1], "proof_models": sys.argv[2], "proof_deadline": int(os.environ["PROOF_DEADLINE"])}
for env, var in (("PROOF_ROOT", "vllm_root"), ("PROOF_CONFIG_DIR", "vllm_config_dir"), ("PROOF_PORT", "vllm_port"),
                 ("PROOF_BASE_PYTHON", "proof_base_python"), ("PROOF_STATE_ROOT", "proof_state_root"),
                 ("PROOF_EXPECT_VERSION", "proof_expect_version"),
                 ("PROOF_MISSING_EXTENSION", "proof_missing_extension")):
    if os.environ.get(env):
        out[var] = int(os.environ[env]) if var == "vllm_port" else os.environ[env]
if os.environ.get("PROOF_SITE_DIRS"):
    out["proof_site_dirs"] = os.environ["PROOF_SITE_DIRS"].split(":")
host_env = {name: os.environ[name] for name in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_VISIBLE_DEVICES",
                                                "TRITON_LIBCUDA_PATH") if os.environ.get(name)}
if host_env:
    out["proof_host_env"] = host_env
if os.environ.get("PROOF_CASES"):
    out["proof_cases"] = os.environ["PROOF_CASES"].split()
print(json.dumps(out))
EOF
}

proof() {
  [ -f "$BASE/host.txt" ] || host_facts >"$BASE/host.txt" 2>&1
  install_ansible || return 1
  rm -rf "$WORK" && mkdir -p "$WORK" "$BASE/ac/ansible_collections/vllm_ops"
  ln -sfn "$REPO" "$BASE/ac/ansible_collections/vllm_ops/dflash"
  run_vars >"$BASE/run-vars.json" || return 1
  # PROOF_VARS first: what the environment sets (PROOF_CASES ...) wins over a vars file's defaults.
  local extra=()
  for f in ${PROOF_VARS:-}; do extra+=(-e "@$f"); done
  extra+=(-e "@$BASE/run-vars.json")
  export LANG=C.UTF-8 LC_ALL=C.UTF-8 ANSIBLE_REMOTE_TMP=$BASE/ansible-tmp PYTHONPATH=$ANSIBLE_DIR${PYTHONPATH:+:$PYTHONPATH} ANSIBLE_COLLECTIONS_PATH=$BASE/ac \
    ANSIBLE_HOME=$BASE/ansible-home ANSIBLE_LOCAL_TEMP=$BASE/ansible-tmp ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 \
    ANSIBLE_RETRY_FILES_ENABLED=0 PYTHONUNBUFFERED=1
  step playbook "$(left)" "$PY" -m ansible playbook -i localhost, "$HERE/proof.yml" "${extra[@]}"
  PLAY_RC=$?
  cp "$BASE/playbook.log" "$RESULTS/ansible.log" 2>/dev/null
  cp "$WORK/facts-vllm.json" "$RESULTS/" 2>/dev/null
  return $PLAY_RC
}

# shellcheck disable=SC2317  # stop_leftover and pack run from the EXIT trap
# A play cut short by the budget can leave a server running in its own session: stop it as the play would.
stop_leftover() {
  if [ -f "$WORK/server.pid" ] && [ -f "$WORK/vllm-proof.service" ]; then
    "$PY" "$HERE/unit_exec.py" stop "$WORK/vllm-proof.service" --pidfile="$WORK/server.pid" >"$BASE/leftover-stop.json" 2>&1
  fi
}

# shellcheck disable=SC2317
pack() {
  stop_leftover
  "$PY" - "$STEPS" "$WORK/summary.json" "$RESULTS/summary.json" "$T_BEGIN" "$BUDGET" "${PLAY_RC:-null}" \
    "${phases[*]}" <<'EOF'
import json, os, platform, subprocess, sys, time
steps_path, play_summary, dest, t_begin, budget, play_rc, phases = sys.argv[1:]
steps = []
if os.path.exists(steps_path):
    steps = [json.loads(line) for line in open(steps_path) if line.strip()]
try:
    summary = json.load(open(play_summary))
except (OSError, ValueError):
    # The play was cut short: keep the record of every case it finished.
    ran = "proof" in phases.split()
    work = os.path.dirname(play_summary)
    cases = {}
    for name in ("release", "fork_release", "facts", "preflight", "nospec", "synthetic", "random", "forced", "staged"):
        try:
            cases[name] = json.load(open(os.path.join(work, name + ".json")))
        except (OSError, ValueError):
            pass
    note = "the play was cut short and wrote no summary (see ansible.log)" if ran else "no play in this call"
    summary = {"passed": False, "cases": cases, "note": note}
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20).stdout.strip()
except (OSError, subprocess.SubprocessError):
    gpu = None
summary["run"] = {"phases": phases, "steps": steps, "playbook_rc": None if play_rc == "null" else int(play_rc),
                  "total_s": round(time.time() - int(t_begin), 1), "budget_s": int(budget),
                  "host": platform.node(), "gpu": gpu, "python": sys.version.split()[0]}
summary["passed"] = bool(summary.get("passed")) and play_rc == "0"
json.dump(summary, open(dest, "w"), indent=1, sort_keys=True)
EOF
  tar -czf "$RESULTS/proof.tgz" -C "$BASE" --exclude=ac --exclude=ansible-home --exclude=ansible-tmp \
    --exclude=out/hf-home . 2>/dev/null
}
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(prep proof)
trap pack EXIT
echo "{\"call\": \"${phases[*]}\", \"at\": $T_BEGIN, \"budget_s\": $BUDGET}" >>"$STEPS"
rc=0
for phase in "${phases[@]}"; do
  case $phase in
    prep) prep || rc=1 ;;
    fork) fork || rc=1 ;;
    proof) proof || rc=1 ;;
    *) echo "unknown phase $phase (use prep, fork, proof)" >&2; rc=2 ;;
  esac
  [ $rc -eq 0 ] || break
done
echo "run_proof.sh: rc=$rc after $(($(date +%s) - T_BEGIN)) s; results in $RESULTS"
exit $rc
