"""The PEP 517 hooks in one process: what vllm_build builds with when uv builds, or without isolation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build import BuildOptions, build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._pep517 import (
    DEFAULT_BACKEND,
    DEFAULT_REQUIRES,
    MARK,
    build_system,
)
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import (
    commit_files,
    git,
    installed_version,
)

# An in-tree backend (backend-path) that logs each hook with its process id and asks for NEEDS.
BACKEND = """\
import json, os, zipfile
from setuptools import build_meta as _setuptools

def _log(hook):
    with open(os.environ.get("HOOK_LOG", "hooks.log"), "a") as handle:
        handle.write(hook + " " + str(os.getpid()) + "\\n")

def get_requires_for_build_wheel(config_settings=None):
    _log("get_requires_for_build_wheel")
    return json.loads(os.environ.get("NEEDS", "[]"))

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _log("build_wheel")
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
"""
PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "backend"
backend-path = ["."]

[project]
name = "hookpkg"
version = "1.0"

[tool.setuptools]
packages = ["hookpkg"]
"""


def _project(path: Path) -> Path:
    (path / "hookpkg").mkdir(parents=True)
    (path / "hookpkg" / "__init__.py").write_text("")
    (path / "backend.py").write_text(BACKEND)
    (path / "pyproject.toml").write_text(PYPROJECT)
    return path


def _run_hooks(project: Path, tmp_path: Path, strict: bool, needs: list) -> tuple:
    system = build_system(str(project))
    dist = tmp_path / "dist"
    dist.mkdir(exist_ok=True)
    argv = system.hooks_argv(sys.executable, str(tmp_path / "hooks.py"), str(dist), strict)
    log = tmp_path / "hooks.log"
    env = dict(os.environ, NEEDS=json.dumps(needs), HOOK_LOG=str(log))
    out = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, check=True).stdout
    result = [json.loads(line[len(MARK) :]) for line in out.splitlines() if line.startswith(MARK)]
    hooks = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return result[-1], hooks, sorted(os.listdir(dist))


def test_both_hooks_run_in_one_process(tmp_path: Path) -> None:
    project = _project(tmp_path / "src")
    satisfied = ["setuptools>=1", "surely-absent-dist-xyz; python_version < '3'"]  # the marker leaves it out
    result, hooks, wheels = _run_hooks(project, tmp_path, strict=True, needs=satisfied)
    assert [hook for hook, _pid in hooks] == ["get_requires_for_build_wheel", "build_wheel"]
    assert len({pid for _hook, pid in hooks}) == 1
    assert result == {"wheel": "hookpkg-1.0-py3-none-any.whl", "requires": satisfied}
    assert wheels == ["hookpkg-1.0-py3-none-any.whl"]


def test_what_the_backend_asks_for_and_the_env_lacks_is_reported_not_built(tmp_path: Path) -> None:
    project = _project(tmp_path / "src")
    needs = ["surely-absent-dist-xyz>=1", "setuptools<1", "setuptools>=1"]
    result, hooks, wheels = _run_hooks(project, tmp_path, strict=True, needs=needs)
    assert result == {"missing": ["surely-absent-dist-xyz>=1", "setuptools<1"]}
    assert [hook for hook, _pid in hooks] == ["get_requires_for_build_wheel"] and wheels == []
    # Without isolation nothing is installed for the backend (as pip and uv do): it builds regardless.
    result, _hooks, wheels = _run_hooks(project, tmp_path, strict=False, needs=needs)
    assert result["wheel"] == "hookpkg-1.0-py3-none-any.whl" and wheels == [result["wheel"]]


def test_a_backend_not_in_backend_path_is_refused_not_imported_from_elsewhere(tmp_path: Path) -> None:
    """PEP 517: a backend-path backend MUST be loaded from there (pyproject_hooks' finder), even when the
    environment has a module of that name: setuptools is installed here, but not under backend-path."""
    project = _project(tmp_path / "src")
    pyproject = project / "pyproject.toml"
    pyproject.write_text(PYPROJECT.replace('build-backend = "backend"', 'build-backend = "setuptools.build_meta"'))
    argv = build_system(str(project)).hooks_argv(sys.executable, str(tmp_path / "hooks.py"), str(tmp_path), True)
    proc = subprocess.run(argv, cwd=project, capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "Cannot find module 'setuptools.build_meta' in" in proc.stderr
    assert not any(line.startswith(MARK) for line in proc.stdout.splitlines())


@pytest.mark.parametrize("tomllib", [True, False], ids=["tomllib", "python<3.11"])
def test_build_system_reads_pyproject_or_takes_the_defaults(tmp_path: Path, monkeypatch, tomllib: bool) -> None:
    if not tomllib:
        monkeypatch.setitem(sys.modules, "tomllib", None)  # `import tomllib` raises ImportError
    system = build_system(str(_project(tmp_path / "src")))
    assert (system.requires, system.backend, system.backend_path) == (["setuptools>=64"], "backend", ["."])
    bare = tmp_path / "bare"
    bare.mkdir()
    system = build_system(str(bare))  # no pyproject.toml: PEP 517/518's defaults
    assert (system.requires, system.backend, system.backend_path) == (DEFAULT_REQUIRES, DEFAULT_BACKEND, [])
    (bare / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n')
    assert build_system(str(bare)).backend == DEFAULT_BACKEND
    (bare / "pyproject.toml").write_text('[build-system]\nrequires = "setuptools"\n')
    with pytest.raises(ValueError, match=r"\[build-system\] requires is not an array of strings"):
        build_system(str(bare))


@pytest.mark.slow_build
def test_uv_build_installs_what_the_backend_asks_for_then_builds_in_one_process(
    tmp_path, pip_args, uv_on_path, monkeypatch
):
    repo = _project(tmp_path / "repo")
    git(repo, "init", "-q", "-b", "main")
    commit_files(repo, "hookpkg", {".gitignore": "build/\n*.egg-info/\n"})
    hook_log = tmp_path / "hooks.log"
    build_env = {"NEEDS": json.dumps(["PyYAML"]), "HOOK_LOG": str(hook_log)}  # in the wheelhouse, not in requires
    opts = BuildOptions(
        str(repo), "main", root=str(tmp_path / "root"), python=sys.executable, pip_args=pip_args, installer="uv",
        build_env=build_env,
    )  # fmt: skip
    result = build(opts)
    log = Path(result["log_path"]).read_text()
    assert "building with backend's PEP 517 hooks in one process of " in log
    assert "get_requires_for_build_wheel asks for PyYAML: installing into the build env" in log
    hooks = [line.split() for line in hook_log.read_text().splitlines()]
    # first run: asks, is refused; second: asks again and builds in the same process
    assert [hook for hook, _pid in hooks] == ["get_requires_for_build_wheel"] * 2 + ["build_wheel"]
    assert hooks[1][1] == hooks[2][1] != hooks[0][1]
    assert installed_version(os.path.join(result["release"], "venv"), "hookpkg") == "1.0"
    venv_python = os.path.join(result["release"], "venv", "bin", "python")
    probe = subprocess.run([venv_python, "-c", "import yaml"], capture_output=True, check=False)
    assert probe.returncode != 0  # what the backend asked for went into the build env, not the release
