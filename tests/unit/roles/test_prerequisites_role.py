"""vllm_prerequisites in a one-task play on localhost: one failure with every missing piece, before anything.

The pieces made missing here do not depend on this machine: a python that does not exist, more free space than
any disk has; the driver check is off (vllm_prerequisites_cuda: "") since this host may or may not have a GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

pytestmark = pytest.mark.slow  # every test runs ansible-playbook
ROOT = Path(__file__).resolve().parents[3]


def _play(tmp_path: Path, path: str = "", **variables: Any) -> subprocess.CompletedProcess:
    """The role on localhost; `path`: the PATH its module sees (the connection keeps the real one)."""
    playbook = tmp_path / "play.yml"
    play: Dict[str, Any] = {
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {"ansible.builtin.import_role": {"name": "vllm_ops.dflash.vllm_prerequisites"}},
            {
                "ansible.builtin.copy": {
                    "content": "{{ vllm_prerequisites_result | to_json }}",
                    "dest": str(tmp_path / "result.json"),
                    "mode": "0644",
                }
            },
        ],
    }
    if path:
        play["tasks"][0]["environment"] = {"PATH": path}
    playbook.write_text(yaml.safe_dump([play]))
    given = {
        "ansible_python_interpreter": sys.executable,
        "vllm_python": sys.executable,
        "vllm_root": str(tmp_path / "opt-vllm"),
        "vllm_prerequisites_cuda": "",
        "vllm_prerequisites_git": shutil.which("git") is not None,
        "vllm_prerequisites_min_free_gb": 0,
        **variables,
    }
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook)]
    argv += ["-e", json.dumps(given)]
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "ac"),
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_NOCOLOR="1",
    )
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)


def test_a_host_that_has_what_it_needs_passes(tmp_path):
    proc = _play(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert not (tmp_path / "opt-vllm").exists()  # a check changes nothing
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["problems"] == [] and result["installed"] == []
    assert result["observed"]["python"] == sys.executable


@pytest.mark.parametrize("install", [False, True], ids=["check", "install-then-check"])
def test_every_missing_piece_fails_the_play_once_with_its_fix(tmp_path, install):
    # With the install allowed nothing here is a package (a python is a choice, disk space is not installed):
    # the check after the install gives the same verdict.
    proc = _play(
        tmp_path,
        vllm_python="python3.99-not-here",
        vllm_prerequisites_min_free_gb=10**9,
        vllm_prerequisites_install=install,
    )
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert out.count("fatal: [localhost]") == 1, out[-3000:]
    if install:  # nothing here is a package: the install is skipped and the second check gives the verdict
        assert re.search(r"Install the missing packages\] \**\s*skipping: \[localhost\]", proc.stdout)
        assert re.search(r"Check what the host needs after the install\] \**\s*\[ERROR\]", proc.stdout)
    assert "2 prerequisite(s) missing on this host, nothing was built or changed" in out
    assert "(1) python3.99-not-here (vllm_python) is not found on the host" in out
    assert f"(2) {tmp_path} has " in out and "needs 1e+09 GiB (vllm_prerequisites_min_free_gb)" in out
    assert "set vllm_root to a larger file system" in out


def test_git_is_not_asked_of_a_host_that_does_not_build(tmp_path):
    # A PATH without git for the module: the build host needs git, the other hosts (the fleet's wheel) do not.
    builds = _play(tmp_path, path="/nonexistent", vllm_prerequisites_git=True)
    installs = _play(tmp_path, path="/nonexistent", vllm_prerequisites_git=True, vllm_prerequisites_build_host=False)
    assert builds.returncode != 0
    assert "git is missing (a vllm_ref install clones vLLM on the build host)" in " ".join(builds.stdout.split())
    assert installs.returncode == 0, installs.stdout[-3000:]
    # A release (vllm_version) is installed from its wheel: no clone, no compiler, on the build host too.
    release = _play(
        tmp_path,
        path="/nonexistent",
        vllm_prerequisites_git=True,
        vllm_prerequisites_full_build=True,
        vllm_version="0.33.0",
    )
    assert release.returncode == 0, release.stdout[-3000:]
