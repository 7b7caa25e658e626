#!/usr/bin/env bash
# ansible-test bootstraps pip in each sanity venv with a script it downloads from a host that this
# network cannot reach. Seed its cache with a stand-in (ensurepip + pip install from the index).
set -euo pipefail
py=${1:-python3}
ver=$("$py" - <<'PY'
import re, pathlib, ansible_test
src = pathlib.Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py"
print(re.search(r"pip='([0-9.]+)'", src.read_text()).group(1))
PY
)
cache=~/.ansible/test/cache
mkdir -p "$cache"
install -m 0644 "$(dirname "$0")/ansible_test_pip_bootstrap.py" "$cache/get_pip_${ver//./_}.py"
