"""vllm_install provisions a pinned uv into <root>/tools on a host without one, and vllm_build's auto uses it.

The role's own task file (tasks/uv.yml) runs through ansible-playbook against localhost; uv's wheel comes
from a local wheelhouse (downloaded once from PyPI), as on an air-gapped host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_host import find_installer
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import ROOT

DEFAULTS = yaml.safe_load((ROOT / "roles" / "vllm" / "defaults" / "main.yml").read_text())
UV_WHEELHOUSE = ROOT / ".cache" / "wheelhouse-uv"


@pytest.fixture(scope="module")
def uv_wheelhouse() -> Path:
    version = DEFAULTS["vllm_uv_version"]
    if not list(UV_WHEELHOUSE.glob(f"uv-{version}-*.whl")):
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "--no-deps"]
        cmd += ["-d", str(UV_WHEELHOUSE), f"uv=={version}"]
        if subprocess.run(cmd, capture_output=True, check=False).returncode != 0:
            pytest.skip(f"could not download uv=={version} from PyPI")
    return UV_WHEELHOUSE


def _play(tmp_path: Path, root: Path, check: bool, **extra) -> dict:
    """Run tasks/uv.yml of the role on localhost; return the play's stats for localhost."""
    playbook = tmp_path / "uv.yml"
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {
                "ansible.builtin.include_role": {"name": "vllm_ops.dflash.vllm_install", "tasks_from": "uv"},
            }
        ],
    }
    playbook.write_text(yaml.safe_dump([play]))
    variables = {"vllm_root": str(root), "vllm_python": sys.executable, **extra}
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook)]
    argv += ["-e", json.dumps(variables)] + (["--check"] if check else [])
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "ac"),
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        PATH=os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "uv").exists()),
    )
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)["stats"]["localhost"]


@pytest.mark.slow_build
def test_a_host_without_uv_gets_the_pinned_one_and_check_mode_writes_nothing(tmp_path, uv_wheelhouse):
    root = tmp_path / "root"
    pip_args = {"vllm_pip_args": ["--no-index", "--find-links", str(uv_wheelhouse)]}
    assert find_installer("auto", str(root), path=str(tmp_path / "empty")).name == "pip"

    stats = _play(tmp_path, root, check=True, **pip_args)
    assert stats["changed"] == 1 and not root.exists()  # would change, wrote nothing

    assert _play(tmp_path, root, check=False, **pip_args)["changed"] == 1
    uv = root / "tools" / "bin" / "uv"
    version = subprocess.run([str(uv), "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
    assert version == DEFAULTS["vllm_uv_version"]
    found = find_installer("auto", str(root), path=str(tmp_path / "empty"))  # vllm_build's auto takes it
    assert (found.name, found.executable) == ("uv", str(uv))

    assert _play(tmp_path, root, check=False, **pip_args)["changed"] == 0  # idempotent
    assert _play(tmp_path, root, check=True, **pip_args)["changed"] == 0


@pytest.mark.slow
def test_no_provisioning_with_pip_or_when_disabled(tmp_path):
    root = tmp_path / "root"
    assert _play(tmp_path, root, check=False, vllm_installer="pip")["changed"] == 0
    assert _play(tmp_path, root, check=False, vllm_uv_provision=False)["changed"] == 0
    assert not root.exists()
