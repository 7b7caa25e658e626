"""vllm_install with `vllm_version`, run by ansible-playbook on localhost: lookup, background install, facts,
assert and activate of a release from a `--find-links` index, then the drift look naming the same release,
all without git (the collection's own task files, as a deploy runs them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.tests.helpers.fake_wheel import make_release_wheel
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import ROOT


@pytest.mark.slow_build
def test_the_role_installs_verifies_and_activates_a_release_and_the_look_names_it(tmp_path):
    index = tmp_path / "index"
    make_release_wheel(index, "0.32.0", "g3cfc8f8b7")
    root = tmp_path / "opt-vllm"
    variables = {
        "vllm_root": str(root),
        "vllm_python": sys.executable,
        "vllm_installer": "pip",
        "vllm_version": "0.32.0",
        "vllm_pip_args": ["--no-index", "--find-links", str(index)],
        "vllm_repo": "/nonexistent/never-cloned.git",  # not used by a release: a clone would fail
        "vllm_required_extensions": [],
        "vllm_probes": [],
        "vllm_capabilities_timeout": 60,
        "vllm_build_poll": 1,
    }
    record = tmp_path / "results.json"
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {"ansible.builtin.include_role": {"name": "vllm_ops.dflash.vllm_install"}},
            {"ansible.builtin.include_role": {"name": "vllm_ops.dflash.vllm_install", "tasks_from": "drift"}},
            {
                "ansible.builtin.copy": {
                    "content": "{{ {'install': vllm_install_result, 'drift': vllm_install_drift} | to_json }}",
                    "dest": str(record),
                    "mode": "0644",
                }
            },
        ],
    }
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "ac"),
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-remote"),
    )
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local"]
    argv += [str(tmp_path / "play.yml"), "-e", json.dumps(variables)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    results = json.loads(record.read_text())
    install, drift = results["install"], results["drift"]
    name = install["release_name"]
    assert name.startswith("vllm-0.32.0-") and install["source"] == "release" and install["activated"]
    assert install["commit"] == "3cfc8f8b7" and install["version"] == "0.32.0"
    assert os.readlink(root / "current") == f"releases/{name}"
    assert (drift["release_name"], drift["release_exists"], drift["current"]) == (name, True, name)
    assert not (root / "src").exists()
