#!/usr/bin/env bash
# `make test`'s two lanes side by side, after the shared set-up: molecule (podman hosts; its time goes mostly
# to waiting on them) beside the checks (unit, lint, sanity, ee, then molecule-real: real vLLM on its own
# test host, while molecule default and fleet still run). One after the other they take ~70 minutes
# on CI's 2 cores; side by side the suite takes about the longer lane. Both lanes' tests hold on a busy
# machine (they are run this way here). Each lane writes its own log, printed whole when it ends; a line a
# minute says where both are.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
logs=${TEST_LANES_DIR:-.cache/test-lanes}  # not build/: the checks lane empties it
make=${MAKE:-make}
mkdir -p "$logs"
started=$SECONDS

"$make" --no-print-directory molecule >"$logs/molecule.log" 2>&1 &
molecule=$!
"$make" --no-print-directory unit lint sanity ee molecule-real >"$logs/checks.log" 2>&1 &
checks=$!

last_line() { tail -n 1 "$1" 2>/dev/null | tr -d '\r' | cut -c1-110; }
declare -A rc
report() {  # $1 lane name, $2 pid: wait for it, print its log and its status
    wait "$2"
    rc[$1]=$?
    echo "===== lane $1: exit ${rc[$1]} after $(((SECONDS - started) / 60)) min; its log ($logs/$1.log):"
    cat "$logs/$1.log"
    echo "===== end of lane $1 (exit ${rc[$1]})"
}
while kill -0 "$molecule" 2>/dev/null || kill -0 "$checks" 2>/dev/null; do
    for lane in checks molecule; do
        pid=${!lane}
        if [[ -z ${rc[$lane]+set} ]] && ! kill -0 "$pid" 2>/dev/null; then report "$lane" "$pid"; fi
    done
    sleep 5
    if (((SECONDS - started) % 60 < 5)); then
        echo "[$(date -u +%H:%M:%S)] checks: $(last_line "$logs/checks.log") | molecule: $(last_line "$logs/molecule.log")"
    fi
done
for lane in checks molecule; do
    if [[ -z ${rc[$lane]+set} ]]; then pid=${!lane}; report "$lane" "$pid"; fi
done
echo "lanes: checks exit ${rc[checks]}, molecule exit ${rc[molecule]}; $(((SECONDS - started) / 60)) min"
[[ ${rc[checks]} -eq 0 && ${rc[molecule]} -eq 0 ]]
