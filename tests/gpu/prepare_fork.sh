#!/usr/bin/env bash
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Issue #16, the build host's half: make the fork repo, build its two refs with the deploy's build play
# (tests/gpu/build_fork.yml), and pack what the H200 needs into chunk folders REPO/.f1 .. .fN, each small
# enough to travel with the working tree in one device call (64 MiB). tests/gpu/README.md has the calls.
#   bash tests/gpu/prepare_fork.sh [fork] [build] [pack]      (all three when none is named)
# fork:  FORK_WORK/vllm, a clone of the real-vLLM lane's repo (`make real-vllm`: vLLM 0.26.0 from its PyPI
#        sdist, tagged v0.26.0) with two fork branches of fixed dates (the same SHAs on every run):
#        gpu/dflash-fix   a Python-only change in the DFlash drafter (it logs that it comes from the fork)
#        gpu/csrc-forced  on top of it, a new op in csrc/ that the drafter calls (needs a full build)
# build: gpu/dflash-fix with precompiled auto (the decision must say precompiled), then gpu/csrc-forced
#        forced onto the precompiled path (precompiled always: the wrong base wheel of item 3)
# pack:  both wheels in parts (fix.part.*, forced.part.*), the fork as a git bundle, the uv that the role provisioned, the runtime dependencies of `vllm serve`
#        that the H200's torch venv lacks (cp312 wheels installed --target, xz), ansible-core's wheels.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${FORK_WORK:-/work/gpu-fork}
LANE_REPO=${FORK_LANE_REPO:-$REPO/.cache/real-vllm/vllm}
BASE_WHEEL=${FORK_BASE_WHEEL:-$REPO/.cache/real-vllm/wheels/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl}
LIMIT=${FORK_LIMIT:-67108864}
PY=${PY:-$REPO/.venv/bin/python}
# Runtime needs of `vllm serve` for a plain model that the H200's torch venv lacks: the list of
# shared/gpu/prepare_wheels.sh (the versions that ran there on 2026-11-29), without vllm itself.
DEPS="annotated-types==0.8.0 apache-tvm-ffi==0.1.15.post2 blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0
 dnspython==2.9.2 email-validator==2.4.0 fastapi==0.136.3 httpcore2==2.16.2 httpx2==2.16.2 jiter==0.19.0
 jmespath==1.1.0 llguidance==1.7.6 model-hosting-container-standards==0.1.16 msgspec==0.23.0
 openai==3.57.0 openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7 pybase64==1.5.1
 pydantic==2.14.4 pydantic_core==2.50.5 pydantic-extra-types==2.11.1 python-multipart==0.0.34
 pyzmq==27.3.0 sniffio==1.3.1 starlette==1.10.0 supervisor==4.3.0 truststore==0.10.5
 typing-inspection==0.4.5 uvicorn==0.54.0 watchfiles==1.3.0 xgrammar==0.2.9
 prometheus-fastapi-instrumentator==8.1.0 setproctitle==1.3.8 typing_extensions==4.16.0"
ANSIBLE_WHEELS="ansible-core==2.19.14 resolvelib==1.2.1 packaging==26.3"
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_27_x86_64
 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any"
PYT="--python-version 3.12 --implementation cp --only-binary=:all:"

fork() {
  rm -rf "$WORK/vllm"
  git clone -q "$LANE_REPO" "$WORK/vllm"
  cd "$WORK/vllm"
  export GIT_AUTHOR_NAME="gpu fork" GIT_AUTHOR_EMAIL="gpu-fork@vllm-ops.invalid" GIT_COMMITTER_NAME="gpu fork" \
    GIT_COMMITTER_EMAIL="gpu-fork@vllm-ops.invalid" GIT_AUTHOR_DATE="2026-12-01T00:00:00Z" \
    GIT_COMMITTER_DATE="2026-12-01T00:00:00Z"
  git checkout -q -b gpu/dflash-fix v0.26.0
  "$PY" "$HERE/fork_edits.py" dflash-fix .
  git commit -qam "gpu/dflash-fix: the DFlash drafter logs that it comes from the fork"
  git checkout -q -b gpu/csrc-forced
  "$PY" "$HERE/fork_edits.py" csrc-forced .
  git commit -qam "gpu/csrc-forced: a csrc op that the DFlash drafter calls"
  git checkout -q --detach v0.26.0
  git rev-parse gpu/dflash-fix gpu/csrc-forced
}

build() {
  ln -sfn "$BASE_WHEEL" "$WORK/$(basename "$BASE_WHEEL")"
  cd "$REPO"
  local play=(.venv/bin/ansible-playbook -i "localhost," tests/gpu/build_fork.yml -e "fork_work=$WORK")
  PATH=$REPO/.venv/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$REPO/.cache/ac "${play[@]}" -e fork_ref=gpu/dflash-fix
  PATH=$REPO/.venv/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$REPO/.cache/ac "${play[@]}" -e fork_ref=gpu/csrc-forced \
    -e fork_precompiled=always
}

pack() {
  local stage=$WORK/carry fix forced tree n i=0 size
  rm -rf "$stage" && mkdir -p "$stage/small"
  # What travels besides a chunk: the working tree (tracked and untracked, not ignored), and 1 MiB to spare.
  tree=$(cd "$REPO" && git ls-files -co --exclude-standard -z | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
  fix=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['wheel'])" "$WORK/build-gpu-dflash-fix.json")
  forced=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['wheel'])" "$WORK/build-gpu-csrc-forced.json")
  split -b $(((LIMIT - tree) / 1048576 - 1))M -d "$fix" "$stage/fix.part."
  split -b $(((LIMIT - tree) / 1048576 - 1))M -d "$forced" "$stage/forced.part."
  cp "$WORK"/build-gpu-*.json "$stage/small/"
  git -C "$WORK/vllm" bundle create "$stage/small/fork.bundle" gpu/dflash-fix gpu/csrc-forced v0.26.0
  xz -T0 -c "$WORK/root/tools/bin/uv" >"$stage/small/uv.xz"
  rm -rf "$WORK/deps-whl" "$WORK/deps" && mkdir -p "$WORK/deps-whl" "$stage/small/ansible-wheels"
  # shellcheck disable=SC2086  # the lists are meant to split
  python3 -m pip download -q --no-deps $PYT $PLAT -d "$WORK/deps-whl" $DEPS
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps $PYT $PLAT -d "$stage/small/ansible-wheels" $ANSIBLE_WHEELS
  # shellcheck disable=SC2086
  python3 -m pip install -q --no-deps --no-compile --no-index --target "$WORK/deps" $PYT $PLAT "$WORK"/deps-whl/*.whl
  tar -C "$WORK/deps" -cf - . | xz -T0 -6 >"$stage/small/deps.tar.xz"
  "$PY" - "$WORK" "$stage/small/fork.json" <<'PYEOF'
import hashlib, json, os, sys
work, dest = sys.argv[1:]
out = {}
for key, ref in (("fix", "gpu/dflash-fix"), ("forced", "gpu/csrc-forced")):
    built = json.load(open(os.path.join(work, f"build-{ref.replace('/', '-')}.json")))
    digest = hashlib.sha256()
    with open(built["wheel"], "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    name = os.path.basename(built["wheel"])
    out[key] = {"ref": ref, "commit": built["commit"], "wheel": name, "sha256": digest.hexdigest(),
                "version": name.split("-")[1], "build_release": built["release_name"],
                "precompiled": built["precompiled"], "precompiled_reason": built["precompiled_reason"]}
json.dump(out, open(dest, "w"), indent=1)
PYEOF
  # Chunk folders: each wheel part in its own, then each small file (largest first) in the first one with room.
  for d in "$REPO"/.f[0-9]*; do [ -d "$d" ] && rm -rf "$d"; done
  for part in "$stage"/fix.part.* "$stage"/forced.part.*; do
    i=$((i + 1)); mkdir -p "$REPO/.f$i"; mv "$part" "$REPO/.f$i/"
  done
  local item placed d
  while read -r size item; do
    placed=""
    for d in "$REPO"/.f[0-9]*; do
      n=$(du -sb "$d" | cut -f1)
      if [ $((n + size + tree)) -lt "$LIMIT" ]; then mv "$item" "$d/"; placed=1; break; fi
    done
    [ -n "$placed" ] || { i=$((i + 1)); mkdir -p "$REPO/.f$i"; mv "$item" "$REPO/.f$i/"; }
  done < <(du -sb "$stage"/small/* | sort -rn)
  grep -qxF "/.f*/" "$REPO/.git/info/exclude" 2>/dev/null || echo "/.f*/" >>"$REPO/.git/info/exclude"
  for d in "$REPO"/.f[0-9]*; do
    n=$(du -sb "$d" | cut -f1)
    echo "$(basename "$d"): $n bytes + working tree $tree = $((n + tree)) (limit $LIMIT)"
    [ $((n + tree)) -lt "$LIMIT" ] || { echo "TOO BIG: $d" >&2; exit 1; }
  done
  sha256sum "$fix" "$forced"
}

phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(fork build pack)
mkdir -p "$WORK"
for phase in "${phases[@]}"; do
  case $phase in
    fork | build | pack) (set -e; "$phase") ;;
    *) echo "unknown phase $phase (use fork, build, pack)" >&2; exit 2 ;;
  esac
done
