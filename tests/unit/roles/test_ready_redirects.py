# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The readiness check never follows a redirect with the API key (issue 28, the principle of case 6).

`ansible.builtin.uri` follows GET redirects by default (`follow_redirects: safe`) and copies every header,
`Authorization` included, to the new location. The server here answers /health and completions itself
and redirects /v1/models to another host, which records what it is sent.

That run is `slow` (ansible-playbook, ~9 CPU-seconds; `make unit` runs it); the fast lane keeps the static
half: every `ansible.builtin.uri` task of the roles says `follow_redirects: none`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
COLLECTIONS = ROOT / ".cache" / "ac"
BIN = Path(sys.executable).parent
KEY = "api-key-do-not-leak"

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: vllm_ops.dflash.vllm_service
        tasks_from: ready
"""


def serve(handler_class):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    return server


def uri_tasks(node):
    """Every ansible.builtin.uri task's arguments in a parsed task file, blocks and rescues included."""
    if isinstance(node, dict):
        if "ansible.builtin.uri" in node:
            yield node["ansible.builtin.uri"]
        for value in node.values():
            yield from uri_tasks(value)
    elif isinstance(node, list):
        for item in node:
            yield from uri_tasks(item)


def test_every_uri_task_of_the_roles_follows_no_redirect():
    found = {}
    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        for args in uri_tasks(yaml.safe_load(path.read_text())):
            found.setdefault(str(path.relative_to(ROOT)), []).append(args.get("follow_redirects"))
    assert "roles/vllm_service/tasks/ready.yml" in found, found
    assert all(value == "none" for values in found.values() for value in values), found


@pytest.mark.slow
def test_readiness_does_not_follow_a_redirect_with_the_api_key(tmp_path):
    seen = []

    class Elsewhere(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append({"path": self.path, "authorization": self.headers.get("Authorization")})
            body = json.dumps({"data": [{"id": "tiny"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    elsewhere = serve(Elsewhere)
    target = f"http://127.0.0.1:{elsewhere.server_address[1]}"

    class Front(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _json(self, data):
            body = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                return self._json({})
            self.send_response(302)
            self.send_header("Location", target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._json({"choices": [{"text": " Paris"}]})

    front = serve(Front)
    try:
        playbook = tmp_path / "ready.yml"
        playbook.write_text(PLAYBOOK)
        extra = {
            "vllm_host": "127.0.0.1",
            "vllm_port": front.server_address[1],
            "vllm_api_key": KEY,
            "vllm_model": "tiny",
            "vllm_instance": "t",
            "vllm_ready_timeout": 4,
        }
        env = dict(
            os.environ,
            ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
            ANSIBLE_PYTHON_INTERPRETER=sys.executable,
            ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
            ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-remote"),
        )
        proc = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook), "-e", json.dumps(extra)],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
            cwd=tmp_path,
        )
    finally:
        front.shutdown()
        elsewhere.shutdown()
    assert all(request["authorization"] is None for request in seen), seen
    assert proc.returncode != 0, "a redirected /v1/models passed the readiness check"
    assert "Check that the served model is listed" in proc.stdout and KEY not in proc.stdout + proc.stderr
