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


def mounts_of(host, pid: int) -> dict:
    """Mount point -> (root within its filesystem, options) as process `pid` sees them: what systemd's
    ProtectSystem/PrivateTmp really did to it, not what the unit file says."""
    mounts = {}
    for line in host.check_output(f"cat /proc/{pid}/mountinfo").splitlines():
        fields = line.split()
        mounts[fields[4]] = (fields[3], fields[5].split(","))
    return mounts


def assert_sandboxed(host, pid: int) -> None:
    """The unit's filesystem sandbox is in force for `pid`: `/` read-only (ProtectSystem=strict), the state,
    cache and log directories writable, and a /tmp of its own (PrivateTmp). A container without CAP_SYS_ADMIN
    lets systemd skip all of it silently ("assuming containerized execution"), with the unit's properties
    still reading yes: the properties prove nothing about the running engine."""
    mounts = mounts_of(host, pid)
    assert "ro" in mounts["/"][1], f"/ is writable for the engine: ProtectSystem=strict is not in force: {mounts['/']}"
    for path in ("/var/lib/vllm", "/var/cache/vllm", "/var/log/vllm"):
        assert "rw" in mounts[path][1], f"{path} is not writable for the engine: {mounts.get(path)}"
    assert mounts["/tmp"][0].startswith("/systemd-private-"), f"the engine shares the host's /tmp: {mounts['/tmp']}"
