"""A controller that died mid-rollout is put right by the next run (issue 14, item 1).

The first run's death is reproduced by its effects: the new release B is built (a deploy refused by the
preflight builds it and activates nothing), then activated on the host as the dying run's activation did,
and the run ends there: no restart, no gate. The server still runs A; `current` names B, status `active`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from deploy_helper import BIN, deploy, inventory, release_state, service_pid

SPEC = {
    "method": "dflash",
    "model": "/srv/models/tiny-dflash",
    "num_speculative_tokens": 7,
    "rejection_sample_method": "synthetic",
    "synthetic_acceptance_length": 4.0,
}
NEW_REF = "dflash-fix"


def _module(name: str, args: dict) -> None:
    line = " ".join(f"{key}={value}" for key, value in args.items())
    cmd = [str(BIN / "ansible"), "gpu_hosts", "-i", inventory(), "-m", name, "-a", line]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def _version(host) -> str:
    return json.loads(host.check_output("curl -sf http://127.0.0.1:8000/version"))["version"]


@pytest.fixture
def died_after_activation(host):
    """(A, B, pid of the server running A, its /version): B activated by a run that died before its restart."""
    good = release_state(host)["current"]
    assert release_state(host)["releases"][good]["status"] == "good"
    refused = deploy({"vllm_ref": NEW_REF, "vllm_speculative_config": {**SPEC, "method": "dflashh"}})
    assert refused.returncode != 0 and release_state(host)["current"] == good
    commit = host.check_output(f"git --git-dir /srv/vllm-engine.git rev-parse {NEW_REF}")
    names = [n for n in host.check_output("ls /opt/vllm/releases").split() if n.startswith(commit[:12])]
    assert len(names) == 1, names
    pid, version = service_pid(host), _version(host)
    _module("vllm_ops.dflash.vllm_release", {"root": "/opt/vllm", "action": "activate", "release": names[0]})
    assert release_state(host)["current"] == names[0] and service_pid(host) == pid
    yield good, names[0], pid, version


@pytest.mark.parametrize("marked_failed", [False, True], ids=["B-active", "B-marked-failed"])
def test_a_failing_gate_after_a_death_rolls_back_to_the_last_good_release(host, died_after_activation, marked_failed):
    good, new, _, version = died_after_activation
    if marked_failed:
        _module("vllm_ops.dflash.vllm_release", {"root": "/opt/vllm", "action": "mark_failed", "release": new})
    low = {**SPEC, "synthetic_acceptance_length": 1.2}
    proc = deploy({"vllm_ref": NEW_REF, "vllm_speculative_config": low})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "rolled back to " + good in out and "nothing had changed on the host yet" not in out
    state = release_state(host)
    assert state["current"] == good and state["releases"][new]["status"] == "failed"
    assert host.check_output("readlink /opt/vllm/current") == f"releases/{good}"
    assert _version(host) == version, "the last good release is not what serves"
    assert host.file("/etc/vllm/default.yaml").contains("synthetic_acceptance_length: 4.0")
    # and the next run finds nothing unfinished: A serves, good
    again = deploy()
    assert again.returncode == 0, again.stdout[-3000:]
    assert release_state(host)["current"] == good


def test_a_passing_gate_after_a_death_gates_the_new_release_not_the_old_server(host, died_after_activation):
    good, new, pid, version = died_after_activation
    proc = deploy({"vllm_ref": NEW_REF})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert service_pid(host) != pid, "not restarted: the gate measured the server still running " + good
    assert _version(host) != version, "the server still runs the old release"
    state = release_state(host)
    assert state["current"] == new and state["releases"][new]["status"] == "good"
    record = json.loads(host.file("/opt/vllm/serving-default.json").content_string)
    assert record["release"] == new
    # a re-run is a no-op: nothing unfinished, no restart
    pid = service_pid(host)
    assert deploy({"vllm_ref": NEW_REF}).returncode == 0
    assert service_pid(host) == pid


def test_back_to_the_scenario_ref(host):
    proc = deploy()
    assert proc.returncode == 0, proc.stdout[-3000:]
    commit = host.check_output("git --git-dir /srv/vllm-engine.git rev-parse main")
    assert release_state(host)["current"].startswith(commit[:12])


def test_a_build_that_dies_is_noticed_at_once(host):
    """Issue 14 item 8: the role followed a killed build's frozen status for its whole timeout."""
    current = release_state(host)["current"]
    cmd = [str(BIN / "ansible-playbook"), "-i", inventory(), "vllm_ops.dflash.deploy_dflash"]
    cmd += ["-e", json.dumps({"vllm_ref": "fault/slow-build", "vllm_build_timeout": 300})]
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    deploy_run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        status = {}
        for _ in range(600):  # until the slow build is under way (its log has lines), at most 10 minutes
            text = host.run("cat /opt/vllm/build-status.json").stdout
            status = json.loads(text) if text.strip() else {}
            if status.get("ref") == "fault/slow-build" and status.get("stage") == "build" and status.get("last_line"):
                break
            time.sleep(1)
        assert status.get("stage") == "build", status
        host.run(f"kill -9 {status['pid']}")
        killed_at = time.monotonic()
        out, _ = deploy_run.communicate(timeout=900)
    finally:
        if deploy_run.poll() is None:
            deploy_run.kill()
    print(out[-20000:])
    assert deploy_run.returncode != 0
    assert f"process {status['pid']} is gone" in out and status["log_path"] in out and "Fix:" in out
    # noticed at the next polls, not after build_timeout (300 s) + the async margin
    assert time.monotonic() - killed_at < 300
    assert release_state(host)["current"] == current
