"""Run one entry point of one of the collection's roles in a one-task play on localhost (connection local)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

COLLECTIONS = Path(__file__).resolve().parents[2] / ".cache" / "ac"
BIN = Path(sys.executable).parent


def run_entry_point(tmp_path: Path, role: str, entry: str, extra: dict) -> subprocess.CompletedProcess:
    """ansible-playbook of `vllm_ops.dflash.<role>` `tasks_from: <entry>` with `extra` as extra vars."""
    play = {
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "tasks": [{"ansible.builtin.import_role": {"name": f"vllm_ops.dflash.{role}", "tasks_from": entry}}],
    }
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    return run_playbook(tmp_path, "localhost,", "play.yml", extra)


def run_playbook(tmp_path: Path, inventory: str, playbook: str, extra: dict) -> subprocess.CompletedProcess:
    """ansible-playbook `playbook` on `inventory` in `tmp_path`, with this collection and `extra` as extra vars."""
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_NOCOLOR="1",
    )
    argv = [str(BIN / "ansible-playbook"), "-i", inventory, playbook, "-e", json.dumps(extra)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False, cwd=tmp_path)
