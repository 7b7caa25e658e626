"""The installer command table: each build step's command line for pip and for uv."""

from __future__ import annotations

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._installer import COMMANDS, Installer

VALUES = {"python": "/usr/bin/python3", "venv": "/r/venv", "venv_python": "/r/venv/bin/python", "dist": "/b/dist"}


def test_pip_commands():
    pip = Installer("pip")
    assert pip.argv("venv", system_site_packages=True, **VALUES) == [
        "/usr/bin/python3",
        "-m",
        "venv",
        "--system-site-packages",
        "/r/venv",
    ]
    assert pip.argv("wheel", ["--no-index", "/b/src"], no_isolation=False, **VALUES) == [
        *["/r/venv/bin/python", "-m", "pip", "wheel", "-v", "--no-deps", "--wheel-dir", "/b/dist"],
        *["--no-index", "/b/src"],
    ]
    assert pip.argv("install", ["x.whl"], **VALUES) == ["/r/venv/bin/python", "-m", "pip", "install", "x.whl"]
    assert pip.argv("reinstall", ["x.whl"], **VALUES)[3:] == ["install", "--force-reinstall", "--no-deps", "x.whl"]


def test_uv_commands_run_the_uv_that_was_found():
    uv = Installer("uv", "/opt/vllm/tools/bin/uv")
    assert uv.argv("venv", system_site_packages=False, **VALUES) == [
        *["/opt/vllm/tools/bin/uv", "venv", "--python", "/usr/bin/python3", "/r/venv"]
    ]
    assert uv.argv("wheel", ["/b/src"], no_isolation=True, **VALUES) == [
        *["/opt/vllm/tools/bin/uv", "build", "--wheel", "--python", "/r/venv/bin/python", "--out-dir", "/b/dist"],
        *["--no-build-isolation", "/b/src"],
    ]
    assert uv.argv("install", ["-r", "req.txt"], **VALUES)[:5] == [
        *["/opt/vllm/tools/bin/uv", "pip", "install", "--python", "/r/venv/bin/python"]
    ]
    assert uv.argv("reinstall", ["x.whl"], **VALUES)[5:] == ["--reinstall", "--no-deps", "x.whl"]
    # The python-only bump's dependency plan (uv only): a dry run, exact pins, removals.
    assert uv.argv("dry_run", ["x.whl"], **VALUES)[5:] == ["--dry-run", "x.whl"]
    assert uv.argv("pinned", ["a==1"], **VALUES)[5:] == ["--no-deps", "a==1"]
    assert uv.argv("uninstall", ["a"], **VALUES)[1:] == ["pip", "uninstall", "--python", "/r/venv/bin/python", "a"]


def test_the_installers_have_these_steps_and_nothing_else():
    assert {name: set(steps) for name, steps in COMMANDS.items()} == {
        "pip": {"venv", "wheel", "install", "reinstall"},
        "uv": {"venv", "wheel", "install", "reinstall", "dry_run", "pinned", "uninstall"},
    }
    with pytest.raises(ValueError, match="installer 'conda' is not one of pip, uv"):
        Installer("conda")
