"""The rollback brings back what the last good release served with (issue 15 review).

A failed deploy that moved the port and changed the unit: the rollback restores the kept config and unit,
and its ready check asks the port of the restored config, not the new vllm_port (given here with -e, which
beats any variable a task passes on). The gate's keep task and the rollback's tasks are taken out of the
role files as they are and run on localhost against a stand-in server (test equipment: three endpoints).
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[3]
GATE = ROOT / "roles" / "dflash_gate"
ROLLBACK = ROOT / "roles" / "dflash_rollback"
SHARED = ROOT / "roles" / "vllm"  # vllm_kept_files: the gate keeps them, the rollback restores them
COLLECTIONS = ROOT / ".cache" / "ac"
BIN = Path(sys.executable).parent


def _tasks(path: Path, *names: str) -> list:
    """The named tasks of a task file, block members included, in file order."""
    found = []

    def walk(tasks: list) -> None:
        for task in tasks:
            if task.get("name") in names:
                found.append(task)
            for key in ("block", "rescue", "always"):
                walk(task.get(key) or [])

    walk(yaml.safe_load(path.read_text()))
    assert [task["name"] for task in found] == list(names), f"{path.name} lost a task"
    return found


def _trusted(value):
    """A role's vars as Ansible loads them: every string a template."""
    if isinstance(value, dict):
        return {key: _trusted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_trusted(item) for item in value]
    return trust_as_template(value) if isinstance(value, str) else value


def test_the_kept_files_are_the_config_the_secrets_and_the_unit():
    variables = _trusted(yaml.safe_load((SHARED / "vars" / "main.yml").read_text()))
    templar = Templar(
        loader=DataLoader(), variables={"vllm_config_dir": "/etc/vllm", "vllm_instance": "t", **variables}
    )
    kept = json.loads(templar.template(trust_as_template("{{ vllm_kept_files | to_json }}")))
    assert [(f["path"], f["last_good"]) for f in kept] == [
        ("/etc/vllm/t.yaml", "/etc/vllm/t.yaml.last-good"),
        ("/etc/vllm/t.env", "/etc/vllm/t.env.last-good"),
        ("/etc/systemd/system/vllm-t.service", "/etc/vllm/vllm-t.service.last-good"),
    ]
    assert [f["secret"] for f in kept] == [False, True, False]


class _Server(http.server.BaseHTTPRequestHandler):
    def _answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer({"data": [{"id": "old-name"}]} if self.path == "/v1/models" else {})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer({"choices": [{"text": " Paris"}]})

    def log_message(self, *args: object) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def old_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.mark.slow
def test_the_rollback_restores_config_and_unit_and_asks_the_restored_port(tmp_path, old_server):
    etc, unit = tmp_path / "etc", tmp_path / "system" / "vllm-t.service"
    etc.mkdir()
    unit.parent.mkdir()
    kept = [
        {"path": str(etc / "t.yaml"), "last_good": str(etc / "t.yaml.last-good"), "mode": "0644"},
        {"path": str(etc / "t.env"), "last_good": str(etc / "t.env.last-good"), "mode": "0600", "secret": True},
        {"path": str(unit), "last_good": str(etc / "vllm-t.service.last-good"), "mode": "0644", "optional": True},
    ]
    for item in kept:
        item.setdefault("secret", False)
        item.setdefault("optional", False)
    good = {
        "t.yaml": yaml.safe_dump({"host": "127.0.0.1", "port": old_server, "served-model-name": "old-name"}),
        "t.env": "VLLM_API_KEY=k\n",
        "unit": "[Service]\nTimeoutStopSec=60\n",
    }
    (etc / "t.yaml").write_text(good["t.yaml"])
    (etc / "t.env").write_text(good["t.env"])
    unit.write_text(good["unit"])

    keep = _tasks(
        GATE / "tasks" / "main.yml",
        "Record the release as good and keep its config, env and unit as the last good ones",
    )
    back = _tasks(
        ROLLBACK / "tasks" / "main.yml",
        "Find the last good copies to restore",
        "Restore the last good config and unit",
        "Fail when a last good copy was not restored",
        "Read the restored serve config",
        "Take the address and model name of the release rolled back to",
        "Wait until the previous release is ready again",
    )
    for task in keep + back:  # owner root: the files are the test's own (the test may run as anyone)
        if "ansible.builtin.copy" in task:
            task["ansible.builtin.copy"] = {
                k: v for k, v in task["ansible.builtin.copy"].items() if k not in ("owner", "group")
            }
    common = {
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        # The rescue's rollback (dflash_rollback_reason set, as the deploy's rescue sets it).
        "vars": {
            "vllm_kept_files": kept,
            "vllm_instance": "t",
            "vllm_ready_timeout": 4,
            "dflash_rollback_rescue": True,
            # What the rescue decided before these tasks: a rollback to the last good release.
            "dflash_rollback_required": True,
            "dflash_rollback_target": "aaaaaaaaaaaa-00000000",
        },
    }
    # The gate passed on release R: the one call marks it good and keeps what it served with.
    release, root = "aaaaaaaaaaaa-00000000", tmp_path / "vllm"
    (root / "releases" / release).mkdir(parents=True)
    (root / "releases" / release / "manifest.json").write_text(json.dumps({"schema": 1, "commit": "a" * 40}))
    (root / "current").symlink_to(f"releases/{release}")
    passed = {
        "dflash_gate_result": {"changed": False, "mean_acceptance_length": 3.2, "drafts": 40},
        "dflash_gate_serving": {"current": release},
        "dflash_gate_min_mean_acceptance_length": 2.0,
    }
    defaults = {"group/vllm_ops.dflash.vllm_root": {"root": str(root)}}
    keep_play = {**common, "vars": {**common["vars"], **passed}, "module_defaults": defaults, "tasks": keep}
    (tmp_path / "keep.yml").write_text(yaml.safe_dump([keep_play]))
    (tmp_path / "back.yml").write_text(yaml.safe_dump([{**common, "tasks": back}]))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-remote"),
    )

    def play(name: str, *extra: str) -> None:
        argv = [str(BIN / "ansible-playbook"), "-i", "localhost,", str(tmp_path / name), *extra]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

    play("keep.yml")
    gate = json.loads((root / "state.json").read_text())["releases"][release]
    assert (gate["status"], gate["gate"]["mean_acceptance_length"], gate["gate"]["drafts"]) == ("good", 3.2, 40)
    assert [oct(os.stat(item["last_good"]).st_mode & 0o777) for item in kept] == ["0o644", "0o600", "0o644"]
    # The failed deploy: a new port (given with -e), a new served name, a changed unit.
    wrong_port = _free_port()
    (etc / "t.yaml").write_text(yaml.safe_dump({"host": "127.0.0.1", "port": wrong_port, "served-model-name": "new"}))
    (etc / "t.env").write_text("VLLM_API_KEY=new\n")
    unit.write_text("[Service]\nTimeoutStopSec=99\n")
    extra = {"vllm_port": wrong_port, "vllm_served_model_name": "new", "vllm_model": "new", "vllm_host": "127.0.0.1"}
    play("back.yml", "-e", json.dumps(extra))

    assert (etc / "t.yaml").read_text() == good["t.yaml"]
    assert (etc / "t.env").read_text() == good["t.env"]
    assert unit.read_text() == good["unit"], "the unit of the failed deploy was left in place"
