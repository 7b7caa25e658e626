"""vllm_deploy_lock through ansible-playbook (issue 28 case 3): a second deploy's take fails with a clear msg."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.playbook import plays

ROOT = Path(__file__).resolve().parents[4]
BIN = Path(sys.executable).parent
PLAYBOOK = ROOT / "playbooks" / "deploy_dflash.yml"


@pytest.mark.slow
def test_a_second_deploy_cannot_take_the_lock_and_the_first_releases_it(tmp_path):
    rollout = plays(PLAYBOOK.name)["Roll out vLLM with DFlash"]
    tasks = {task["name"]: task for task in rollout["tasks"]}
    name_it, take = tasks["Name this deploy for its lock"], tasks["Take this host's deploy lock"]
    (release,) = tasks["Install, configure, serve and gate"]["always"]
    task = {"ignore_errors": True}
    play = {
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars": {"vllm_root": str(tmp_path / "vllm"), "vllm_instance": "t"},
        "tasks": [
            name_it,
            take,
            {"name": "X's id", "ansible.builtin.set_fact": {"x": "{{ dflash_deploy_lock_holder }}"}},
            name_it,  # a second deploy: another id
            {**take, **task, "register": "second"},
            {"ansible.builtin.set_fact": {"dflash_deploy_lock_holder": "{{ x }}"}},
            {**release, "register": "released"},
            {"ansible.builtin.copy": {"content": "{{ {'second': second, 'released': released} | to_json }}",
                                      "dest": str(tmp_path / "out.json")}},
        ],
    }  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "ac"),
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_NOCOLOR="1",
    )
    argv = [str(BIN / "ansible-playbook"), "-i", "localhost,", "play.yml"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["second"]["failed"] is True
    assert "another deploy (localhost-" in out["second"]["msg"] and "deploy-t.lock" in out["second"]["msg"]
    assert "Fix: wait" in out["second"]["msg"]
    assert out["released"]["released"] is True
    assert not (tmp_path / "vllm" / "deploy-t.lock").exists()
