"""The gate gates and marks the release the server's process runs, not what `current` names (issue 28 case 3).

Two deploys of different refs on one host: X's gate measured the server started on B while `current` already
named C, and recorded C good. dflash_gate's checks around the measurement are taken out of tasks/main.yml as
they are and run on localhost: a stand-in `systemctl` names a real process as the unit's MainPID, whose command
line is the unit's (`/bin/sh <root>/releases/<name>/venv/bin/vllm serve ...`, a script through its shebang).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
GATE = ROOT / "roles" / "dflash_gate"
BIN = Path(sys.executable).parent
B, C = "bbbbbbbbbbbb-11111111", "cccccccccccc-22222222"
CHECKS = [
    "Read which release the server's process was started from",
    "Refuse to gate a server that runs another release than current",
    "Read the server's process again after the gate",
    "Refuse to record a gate whose server changed during it",
]


def _tasks(names: list) -> list:
    found = {}

    def walk(tasks: list) -> None:
        for task in tasks:
            if task.get("name") in names:
                found[task["name"]] = task
            for key in ("block", "rescue", "always"):
                walk(task.get(key) or [])

    walk(yaml.safe_load((GATE / "tasks" / "main.yml").read_text()))
    assert sorted(found) == sorted(names), "tasks/main.yml lost a check"
    return [found[name] for name in names]


def _server(root: Path, release: str) -> subprocess.Popen:
    launcher = root / "releases" / release / "venv" / "bin" / "vllm"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text("#!/bin/sh\nsleep 300\n")
    launcher.chmod(0o755)
    return subprocess.Popen([str(launcher), "serve", "--config", "/etc/vllm/t.yaml"])


def _run(tmp_path: Path, current: str, pid: int) -> subprocess.CompletedProcess:
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir(exist_ok=True)
    (stand_ins / "systemctl").write_text(f'#!/bin/sh\n[ "$1" = show ] && echo {pid}\n')
    (stand_ins / "systemctl").chmod(0o755)
    variables = yaml.safe_load((GATE / "vars" / "main.yml").read_text())
    play = {
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars": {
            "dflash_gate_process_probe": variables["dflash_gate_process_probe"],
            "vllm_root": str(tmp_path / "vllm"),
            "vllm_instance": "t",
            "dflash_gate_serving": {"current": current},
            "dflash_gate_result": {"changed": False, "mean_acceptance_length": 3.0},
        },
        "tasks": _tasks(CHECKS),
    }
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    env = dict(
        os.environ,
        PATH=f"{stand_ins}:{os.environ['PATH']}",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_NOCOLOR="1",
    )
    argv = [str(BIN / "ansible-playbook"), "-i", "localhost,", "play.yml"]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False, cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("runs", "current", "passes"), [(C, C, True), (B, C, False)], ids=["same", "other"])
def test_the_gate_refuses_a_server_that_runs_another_release_than_current(tmp_path, runs, current, passes):
    server = _server(tmp_path / "vllm", runs)
    try:
        proc = _run(tmp_path, current, server.pid)
    finally:
        server.kill()
        server.wait()
    if passes:
        assert proc.returncode == 0, proc.stdout[-3000:]
        return
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert f"runs {B}, but" in proc.stdout and f"current names {C}" in proc.stdout, json.dumps(proc.stdout[-3000:])


@pytest.mark.slow
def test_no_process_is_no_verdict_of_its_own(tmp_path):
    # MainPID 0 (not running): the gate's own requests fail on it; this check says nothing.
    proc = _run(tmp_path, C, 0)
    assert proc.returncode == 0, proc.stdout[-3000:]
