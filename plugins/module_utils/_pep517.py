# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A wheel built by calling the PEP 517 backend's two hooks in one process.

Build frontends (pip, `uv build`) run `get_requires_for_build_wheel` and `build_wheel` each in a new
process. vLLM's setup.py runs in both and imports torch at its top: measured on real vLLM 0.26.0 (2
cores), 10-20 s per run, the largest share of a precompiled build. `HOOKS` calls both in one process of
the build environment's python, so setup.py's imports are paid once. What the first hook asks for is
checked against the environment; anything missing is reported and installed by the caller, and the
hooks run again (a frontend would have installed it between the two).

The hooks are pyproject_hooks' (the hook caller of pip and build): its `_in_process.py`, vendored
(_vendor/pyproject_hooks), is the standard-library script frontends run in the build environment, and
its hook functions load the backend as PEP 517 says (`module:object`, `backend-path` through a meta path
finder that refuses a backend found elsewhere). Its own entry point, `main()`, runs one hook per process
(pyproject_hooks' BuildBackendHookCaller starts it once per hook): so HOOKS does not run it, it loads the
file beside itself and calls `get_requires_for_build_wheel` then `build_wheel` in its own process - the
second call finds the backend, and what setup.py imported, in sys.modules. What is ours: that driver
(which requirements the environment lacks, the result line). test_pep517.py holds both hooks to one
process id and the backend to backend-path.

The build environment (isolated: a venv with `[build-system] requires`, as a frontend makes it; without
isolation: the release venv) and the installs are the caller's (_build). Standard library only.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
from typing import Any, Dict, List, Optional

from ansible_collections.vllm_ops.dflash.plugins.module_utils._vendor.pyproject_hooks import _in_process

__all__ = ["DEFAULT_BACKEND", "DEFAULT_REQUIRES", "HOOKS", "MARK", "BuildSystem", "build_system", "pyproject_table"]

# PEP 517/518: what a source tree without [build-system] (or without build-backend) is built with.
DEFAULT_BACKEND = "setuptools.build_meta:__legacy__"
DEFAULT_REQUIRES = ["setuptools>=40.8.0"]
MARK = "vllm_build-pep517-result "

# pyproject_hooks' hook functions: HOOKS loads this file, written beside it as IN_PROCESS.
IN_PROCESS = "pep517_in_process.py"
# Run as `python <file of HOOKS> <backend> <backend-path JSON> <wheel dir> <strict 0|1>` in the source tree.
HOOKS = r"""
import importlib.util, json, os, re, sys
spec, paths, out_dir, strict = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
here = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]  # as _in_process.main does
os.environ["_PYPROJECT_HOOKS_BUILD_BACKEND"] = spec
os.environ["_PYPROJECT_HOOKS_BACKEND_PATH_JSON"] = json.dumps([os.path.abspath(p) for p in paths])
found = importlib.util.spec_from_file_location("pep517_in_process", os.path.join(here, IN_PROCESS))
hooks = importlib.util.module_from_spec(found)
found.loader.exec_module(hooks)


def unmet(text):
    import importlib.metadata as metadata
    try:
        from packaging.requirements import Requirement
    except ImportError:
        Requirement = None
    if Requirement is None:
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", text)
        try:
            return name is None or not metadata.version(name.group(1))
        except metadata.PackageNotFoundError:
            return True
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate():
        return False
    try:
        version = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        return True
    return not req.specifier.contains(version, prereleases=True)


needs = list(hooks.get_requires_for_build_wheel(None))
missing = [text for text in needs if unmet(text)] if strict else []
print("vllm_build: PEP 517 get_requires_for_build_wheel of %s in process %d: %s" % (spec, os.getpid(), needs))
if missing:
    print("%s%s" % (MARK, json.dumps({"missing": missing})))
    sys.exit(0)
print("vllm_build: PEP 517 build_wheel of %s in the same process %d" % (spec, os.getpid()), flush=True)
name = hooks.build_wheel(out_dir, None)
print("%s%s" % (MARK, json.dumps({"wheel": name, "requires": needs})))
""".replace("MARK", repr(MARK)).replace("IN_PROCESS", repr(IN_PROCESS))


class BuildSystem:
    """`[build-system]` of a source tree, with PEP 517/518's defaults for what it leaves out."""

    def __init__(self, requires: List[str], backend: str, backend_path: List[str]) -> None:
        self.requires = requires
        self.backend = backend
        self.backend_path = backend_path

    def __repr__(self) -> str:
        return f"BuildSystem({self.backend}, {self.requires})"

    def hooks_argv(self, python: str, script: str, wheel_dir: str, strict: bool) -> List[str]:
        """The command that runs both hooks in `python` (strict: report requirements it lacks); writes
        HOOKS to `script` (a file, so that the build log shows a command line, not the script)."""
        for path, text in ((script, HOOKS), (os.path.join(os.path.dirname(script), IN_PROCESS), _in_process_text())):
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
        return [python, script, self.backend, json.dumps(self.backend_path), wheel_dir, "1" if strict else "0"]


def _in_process_text() -> str:
    """The vendored _in_process.py as written (inspect reads it from a file or from AnsiballZ's zip)."""
    return inspect.getsource(_in_process)


def _table(text: str) -> Optional[Dict[str, Any]]:
    try:
        import tomllib  # type: ignore[import-not-found,unused-ignore]

        table = tomllib.loads(text).get("build-system")
        return table if isinstance(table, dict) else None
    except ImportError:  # Python < 3.11: strings and arrays of strings are Python literals
        section = re.search(r"(?ms)^\[build-system\]\s*$(.*?)(?=^\[|\Z)", text)
        if section is None:
            return None
        table = {}
        for key in ("requires", "build-backend", "backend-path"):
            value = re.search(rf"(?ms)^{re.escape(key)}\s*=\s*(\[.*?\]|\"[^\"\n]*\"|'[^'\n]*')", section.group(1))
            if value is not None:
                cleaned = "\n".join(re.sub(r"#[^\"'\n]*$", "", line) for line in value.group(1).splitlines())
                table[key] = ast.literal_eval(cleaned)
        return table


def pyproject_table(src: str) -> Optional[Dict[str, Any]]:
    """`[build-system]` of `src`/pyproject.toml as written; None without the file or the table."""
    try:
        with open(os.path.join(src, "pyproject.toml"), "rb") as handle:
            return _table(handle.read().decode("utf-8"))
    except OSError:
        return None


def build_system(src: str) -> BuildSystem:
    """The build system of the source tree `src` (pyproject.toml, else the PEP 517/518 defaults).

    Raises ValueError when pyproject.toml declares it in a shape PEP 517/518 does not allow.
    """
    table = pyproject_table(src)
    path = os.path.join(src, "pyproject.toml")
    if table is None:
        return BuildSystem(list(DEFAULT_REQUIRES), DEFAULT_BACKEND, [])
    requires = table.get("requires", [])
    backend = table.get("build-backend") or DEFAULT_BACKEND
    backend_path = table.get("backend-path", [])
    for key, value in (("requires", requires), ("backend-path", backend_path)):
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ValueError(f"{path}: [build-system] {key} is not an array of strings")
    if not isinstance(backend, str):
        raise ValueError(f"{path}: [build-system] build-backend is not a string")
    return BuildSystem(list(requires), backend, list(backend_path))
