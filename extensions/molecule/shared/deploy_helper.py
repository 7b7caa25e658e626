"""Run deploy_dflash.yml against the molecule inventory from a testinfra test, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def inventory() -> str:
    if os.environ.get("MOLECULE_INVENTORY_FILE"):
        return os.environ["MOLECULE_INVENTORY_FILE"]
    return str(Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "inventory")


def run_playbook(playbook: str, extra_vars: dict | None = None, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "ansible-playbook"), "-i", inventory(), playbook, *args]
    if extra_vars:
        cmd += ["-e", json.dumps(extra_vars)]
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    # Keep the whole output in the pytest report when an assertion fails.
    print(proc.stdout[-20000:], proc.stderr[-5000:], sep="\n")
    return proc


def deploy(extra_vars: dict | None = None, *args: str) -> subprocess.CompletedProcess:
    return run_playbook("vllm_ops.dflash.deploy_dflash", extra_vars, *args)


def release_state(host) -> dict:
    return json.loads(host.file("/opt/vllm/state.json").content_string)


def service_pid(host, instance: str = "default") -> int:
    return int(host.check_output(f"systemctl show -p MainPID --value vllm-{instance}.service"))
