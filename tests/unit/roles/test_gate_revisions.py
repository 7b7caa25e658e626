"""The gate's identity takes the model revisions from the staged models: one pin (issue 27 item 5).

dflash_gate's tasks_from: revisions runs in a one-task play on localhost, after a dflash_config_result fact
such as dflash_config's staging publishes; the identity variables the gate sends are read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # every test runs ansible-playbook
ROOT = Path(__file__).resolve().parents[3]
OLD, NEW, DRAFTER = "a" * 40, "b" * 40, "c" * 40


def _play(tmp_path: Path, staged: dict | None, **gate_vars: str) -> subprocess.CompletedProcess:
    out = tmp_path / "identity.json"
    tasks: list = []
    if staged is not None:
        tasks.append({"ansible.builtin.set_fact": {"dflash_config_result": staged}})
    tasks.append(
        {
            "ansible.builtin.include_role": {
                "name": "vllm_ops.dflash.dflash_gate",
                "tasks_from": "revisions",
                "public": True,
            }
        }
    )
    content = (
        '{{ {"target": dflash_gate_identity_target_revision,'
        ' "drafter": dflash_gate_identity_drafter_revision} | to_json }}'
    )
    tasks.append({"ansible.builtin.copy": {"content": content, "dest": str(out), "mode": "0644"}})
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook)]
    argv += ["-e", json.dumps({"ansible_python_interpreter": sys.executable, **gate_vars})]
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "ac"),
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_NOCOLOR="1",
    )
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)


def _identity(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "identity.json").read_text())


def test_the_identity_takes_the_staged_commits(tmp_path):
    proc = _play(tmp_path, {"changed": False, "target_revision": NEW, "drafter_revision": DRAFTER})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert _identity(tmp_path) == {"target": NEW, "drafter": DRAFTER}


def test_a_stale_second_pin_is_refused_naming_both_commits_and_the_fix(tmp_path):
    # The target was bumped to NEW in vllm_target_model; the gate still names OLD.
    proc = _play(tmp_path, {"target_revision": NEW, "drafter_revision": DRAFTER}, dflash_gate_target_revision=OLD)
    assert proc.returncode != 0
    assert not (tmp_path / "identity.json").exists()
    assert f"dflash_gate_target_revision={OLD}, staged {NEW}" in proc.stdout
    assert "unset dflash_gate_target_revision" in proc.stdout


def test_the_same_commit_given_twice_passes(tmp_path):
    proc = _play(tmp_path, {"target_revision": NEW, "drafter_revision": ""}, dflash_gate_target_revision=NEW)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert _identity(tmp_path) == {"target": NEW, "drafter": ""}


def test_without_staged_models_the_gate_revisions_are_used(tmp_path):
    proc = _play(tmp_path, None, dflash_gate_target_revision=OLD, dflash_gate_drafter_revision=DRAFTER)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert _identity(tmp_path) == {"target": OLD, "drafter": DRAFTER}
