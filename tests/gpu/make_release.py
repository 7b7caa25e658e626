# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Turn a vLLM that is already installed in a directory tree into a release of the collection's layout.

    python3 make_release.py --root /opt/vllm --python /opt/torch/.venv/bin/python3 \
        --site /tmp/site --site /opt/torch/.venv/lib/python3.12/site-packages

For hosts where vllm_build cannot run (no git checkout of vLLM, no network) but a vLLM wheel was
installed with `pip install --target` or into another venv. It writes what vllm_build writes:

    <root>/releases/<name>/venv/            python -m venv --without-pip, from --python
    <root>/releases/<name>/venv/lib/pythonX.Y/site-packages/_vllm_release_site.pth
                                            site.addsitedir() of every --site, in order (their own .pth
                                            files apply too, as for installed packages); a venv made from
                                            a venv does not see its parent's site-packages otherwise
    <root>/releases/<name>/venv/bin/vllm    the console script pip writes for vLLM's entry point
    <root>/releases/<name>/manifest.json    schema 1, written last (docs/ARCHITECTURE.md)

The name is `<hex 0-12>-<hex 12-20>` of the wheel's sha256 (the shape vllm_release knows), read from the tree's PEP 610
direct_url.json, so the same wheel always gives the same directory. A wheel records no full commit
(vllm/_version.py has only setuptools-scm's short `__commit_id__`): the manifest's `commit` is null,
`source` is `wheel`, and the short commit is kept as `scm_commit_prefix`. An existing release with the
same inputs is left alone (changed: false); one with other inputs or without a manifest is rebuilt.
It does not activate the release: vllm_release does. Prints one JSON object.

Test equipment of the collection (tests/gpu); standard library only.
"""

from __future__ import annotations

import argparse
import configparser
import datetime
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

MANIFEST_SCHEMA = 1
PTH_NAME = "_vllm_release_site.pth"
# What pip writes for a console script (pip._internal.operations.install.wheel / distlib).
CONSOLE_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from {module} import {function}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({function}())
"""


class ReleaseMakerError(Exception):
    """The tree cannot become a release; the message names the fix."""


def find_distribution(sites: Sequence[str]) -> Tuple[str, str]:
    """(site dir, dist-info dir) of the first vllm distribution in the site dirs, in sys.path order."""
    for site in sites:
        found = sorted(glob.glob(os.path.join(site, "vllm-*.dist-info")))
        if found and os.path.isdir(os.path.join(site, "vllm")):
            return site, found[0]
    raise ReleaseMakerError(
        f"no vllm package with its vllm-*.dist-info in {', '.join(sites)}; install the vLLM wheel there "
        "(pip install --target DIR vllm-*.whl) or pass the site dir that holds it with --site"
    )


def read_distribution(dist_info: str) -> Dict[str, Any]:
    """version, wheel url and sha256, and the vllm console-script entry point of an installed wheel."""
    with open(os.path.join(dist_info, "METADATA"), encoding="utf-8") as handle:
        version = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("Version:")), None)
    if not version:
        raise ReleaseMakerError(f"{dist_info}/METADATA has no Version; reinstall the wheel")
    try:
        with open(os.path.join(dist_info, "direct_url.json"), encoding="utf-8") as handle:
            direct_url = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ReleaseMakerError(
            f"cannot read {dist_info}/direct_url.json ({exc}): install vLLM from a wheel file with pip, which "
            "records the wheel's sha256 there"
        ) from exc
    hashes = (direct_url.get("archive_info") or {}).get("hashes") or {}
    sha256 = hashes.get("sha256")
    if not sha256:
        legacy = str((direct_url.get("archive_info") or {}).get("hash") or "")
        sha256 = legacy[len("sha256=") :] if legacy.startswith("sha256=") else None
    if not sha256 or not re.match(r"^[0-9a-f]{64}$", sha256):
        raise ReleaseMakerError(
            f"{dist_info}/direct_url.json records no wheel sha256 (an editable or git install?); "
            "build the release with vllm_build instead"
        )
    entry_points = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    entry_points.optionxform = str  # type: ignore[assignment,method-assign]
    entry_points.read(os.path.join(dist_info, "entry_points.txt"), encoding="utf-8")
    target = entry_points.get("console_scripts", "vllm", fallback=None)
    if not target or ":" not in target:
        raise ReleaseMakerError(f"{dist_info}/entry_points.txt has no console script 'vllm'; reinstall the wheel")
    module, function = (part.strip() for part in target.split(":", 1))
    return {
        "version": version,
        "wheel_url": direct_url.get("url"),
        "sha256": sha256,
        "entry_point": {"module": module, "function": function.split()[0]},
    }


def scm_commit_prefix(package_dir: str) -> Optional[str]:
    """The short commit setuptools-scm / vcs-versioning wrote into vllm/_version.py, if any."""
    try:
        with open(os.path.join(package_dir, "_version.py"), encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    match = re.search(r"^__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['\"]g?([0-9a-fA-F]{7,40})['\"]", text, re.M)
    return match.group(1).lower() if match else None


def python_facts(python: str) -> Dict[str, str]:
    code = (
        "import json, platform, sys; "
        "print(json.dumps({'version': platform.python_version(), 'xy': '%d.%d' % sys.version_info[:2]}))"
    )
    try:
        out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ReleaseMakerError(f"cannot run {python} ({exc}); pass a working python with --python") from exc
    facts: Dict[str, str] = json.loads(out.stdout)
    return facts


def release_inputs(python: str, sites: Sequence[str], dist: Dict[str, Any], py: Dict[str, str]) -> Dict[str, Any]:
    return {
        "python": python,
        "python_version": py["version"],
        "installer": "pip --target (installed tree)",
        "site_dirs": list(sites),
        "wheel_sha256": dist["sha256"],
        "build_env": {},
        "build_isolation": None,
        "system_site_packages": False,
        "pip_args": [],
    }


def _venv_site_packages(venv: str, xy: str) -> str:
    return os.path.join(venv, "lib", f"python{xy}", "site-packages")


def make_release(root: str, python: str, sites: Sequence[str], name: Optional[str] = None) -> Dict[str, Any]:
    started = time.monotonic()
    sites = [os.path.realpath(site) for site in sites]
    for site in sites:
        if not os.path.isdir(site):
            raise ReleaseMakerError(f"--site {site} is not a directory")
    site, dist_info = find_distribution(sites)
    dist = read_distribution(dist_info)
    py = python_facts(python)
    inputs = release_inputs(python, sites, dist, py)
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    # vllm_release knows only names shaped as the collection makes them (<12 hex>-<8 hex>); a wheel records
    # no full commit, so both parts come from the wheel's sha256.
    name = name or f"{dist['sha256'][:12]}-{dist['sha256'][12:20]}"
    release = os.path.join(root, "releases", name)
    manifest_path = os.path.join(release, "manifest.json")
    try:
        with open(manifest_path, encoding="utf-8") as handle:
            existing = json.load(handle)
    except (OSError, ValueError):
        existing = None
    if isinstance(existing, dict) and existing.get("inputs_hash") == digest:
        return {"changed": False, "name": name, "release": release, "manifest": existing}
    if os.path.lexists(release):
        shutil.rmtree(release)  # no manifest (an interrupted run) or other inputs: rebuild
    venv = os.path.join(release, "venv")
    subprocess.run([python, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    lines = [f"import site; site.addsitedir({path!r})" for path in sites]
    with open(os.path.join(_venv_site_packages(venv, py["xy"]), PTH_NAME), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    script = os.path.join(venv, "bin", "vllm")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(CONSOLE_SCRIPT.format(python=os.path.join(venv, "bin", "python"), **dist["entry_point"]))
    os.chmod(script, 0o755)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "name": name,
        "commit": None,  # a wheel does not record its full commit
        "scm_commit_prefix": scm_commit_prefix(os.path.join(site, "vllm")),
        "requested_ref": None,
        "resolved_ref": None,
        "repo": None,
        "inputs": inputs,
        "inputs_hash": digest,
        "wheel": {"path": dist["wheel_url"], "sha256": dist["sha256"]},
        "version": dist["version"],
        "built_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "build_seconds": round(time.monotonic() - started, 3),
        "log_path": None,
        "source": "wheel",
    }
    tmp = manifest_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, manifest_path)  # last: from now on the release exists
    return {"changed": True, "name": name, "release": release, "manifest": manifest}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--root", required=True, help="the vLLM root (vllm_root), e.g. /opt/vllm")
    parser.add_argument("--python", required=True, help="python the release venv is made from")
    parser.add_argument("--site", action="append", required=True, help="dir with vllm or its dependencies")
    parser.add_argument("--name", help="release name (default <12 hex>-<8 hex> of the wheel sha256)")
    args = parser.parse_args(argv)
    try:
        result = make_release(args.root, args.python, args.site, args.name)
    except (ReleaseMakerError, OSError, subprocess.SubprocessError) as exc:
        print(json.dumps({"failed": True, "msg": str(exc)}))
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
