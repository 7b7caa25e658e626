"""Test equipment for vllm_build: a real git repo of a tiny setuptools-scm package, and a wheelhouse.

The package (`tinypkg`) is versioned by setuptools-scm like vLLM, so an installed build says which
commit it came from (`<tag>` or `...devN+g<sha>`). Its history:

    c1 (tag v1.0.0, annotated) -- c2 -- c3          main, bump
                                   \\-- p1          refs/pull/1/head only (no branch)
    c1 -- slow                                      slow: setup.py writes its pid and temp dir, then sleeps
    c1 -- c2 -- c3 -- broken                        broken: setup.py raises (a compile error stand-in)

Builds in tests use build isolation with `pip_args: [--no-index, --find-links, <wheelhouse>]`, exactly
like an air-gapped GPU host.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / ".cache" / "wheelhouse"
UV_DIR = ROOT / ".cache" / "uv"
UV_VERSION = "0.13.9"
# Build requirements of tinypkg and of the fixture engine, plus the engine's one dependency.
BUILD_REQUIREMENTS = ["setuptools>=64", "setuptools-scm>=8", "PyYAML"]

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64", "setuptools-scm>=8"]
build-backend = "setuptools.build_meta"

[project]
name = "tinypkg"
dynamic = ["version"]
requires-python = ">=3.8"

[tool.setuptools]
packages = ["tinypkg"]

[tool.setuptools_scm]
"""

SLOW_SETUP = """\
import os, tempfile, time
from setuptools import setup
with open(os.environ["TINY_SLOW_MARKER"] + ".tmp", "w") as marker:
    marker.write(str(os.getpid()) + "\\n" + tempfile.gettempdir() + "\\n")
os.replace(os.environ["TINY_SLOW_MARKER"] + ".tmp", os.environ["TINY_SLOW_MARKER"])
time.sleep(600)
setup(name="tinypkg", version="0.0.0", packages=["tinypkg"])
"""

BROKEN_SETUP = """\
raise SystemExit("error: tinypkg/_C.c:1: fake compiler error for the test")
"""

_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
}


def git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, **_ENV)
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def commit_files(repo: Path, message: str, files: Dict[str, str]) -> str:
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def make_tiny_repo(path: Path) -> Dict[str, str]:
    """Create the repo described above at `path`; return {label: full sha}."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    shas = {}
    shas["c1"] = commit_files(
        path,
        "c1",
        {
            "pyproject.toml": PYPROJECT,
            ".gitignore": "build/\ndist/\n*.egg-info/\n__pycache__/\n",
            "tinypkg/__init__.py": "STEP = 1\n",
        },
    )
    git(path, "tag", "-a", "v1.0.0", "-m", "release 1.0.0")
    shas["c2"] = commit_files(path, "c2", {"tinypkg/__init__.py": "STEP = 2\n"})
    shas["c3"] = commit_files(path, "c3", {"tinypkg/__init__.py": "STEP = 3\n"})
    git(path, "branch", "bump")
    git(path, "checkout", "-q", "-b", "pr", shas["c2"])
    shas["p1"] = commit_files(path, "p1", {"tinypkg/__init__.py": "STEP = 'pr'\n"})
    git(path, "update-ref", "refs/pull/1/head", shas["p1"])
    git(path, "checkout", "-q", "-b", "slow", shas["c1"])
    os.unlink(path / "pyproject.toml")
    shas["slow"] = commit_files(path, "slow", {"setup.py": SLOW_SETUP})
    git(path, "checkout", "-q", "-b", "broken", shas["c3"])
    shas["broken"] = commit_files(path, "broken", {"setup.py": BROKEN_SETUP})
    git(path, "checkout", "-q", "main")
    git(path, "branch", "-q", "-D", "pr")
    return shas


def add_commit(repo: Path, branch: str, label: str) -> str:
    """One more commit on `branch` (a "branch bump"); returns its sha."""
    git(repo, "checkout", "-q", branch)
    try:
        return commit_files(repo, label, {"tinypkg/__init__.py": f"STEP = {label!r}\n"})
    finally:
        git(repo, "checkout", "-q", "main")


def wheelhouse() -> Optional[Path]:
    """A local wheelhouse with BUILD_REQUIREMENTS (downloaded once from PyPI, then cached)."""
    stamp = WHEELHOUSE / (".complete-" + "-".join(BUILD_REQUIREMENTS).replace(">=", "").replace("/", ""))
    if stamp.exists():
        return WHEELHOUSE
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(WHEELHOUSE)]
    if subprocess.run(cmd + BUILD_REQUIREMENTS, capture_output=True, check=False).returncode != 0:
        return None
    stamp.touch()
    return WHEELHOUSE


def uv_bin_dir() -> Optional[Path]:
    """A directory holding a `uv` binary (pip-installed once from PyPI into .cache/uv), or None."""
    bin_dir = UV_DIR / "bin"
    if (bin_dir / "uv").exists():
        return bin_dir
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--target", str(UV_DIR), f"uv=={UV_VERSION}"]
    if subprocess.run(cmd, capture_output=True, check=False).returncode != 0 or not (bin_dir / "uv").exists():
        return None
    return bin_dir


def process_alive(pid: int, settle: float = 3.0) -> bool:
    """Whether `pid` still runs. A zombie counts as dead: killed orphans wait for PID 1 to reap them,
    which in a container may take a moment, and `os.kill(pid, 0)` succeeds on a zombie."""
    end = time.monotonic() + settle
    while True:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as handle:
                running = handle.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (ProcessLookupError, FileNotFoundError):
            return False
        if not running or time.monotonic() >= end:
            return running
        time.sleep(0.1)


def installed_version(venv: str, dist: str = "tinypkg") -> str:
    """The version of `dist` as the release venv's own Python reports it."""
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    return subprocess.run(
        [os.path.join(venv, "bin", "python"), "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()
