"""Two hosts, one build: the canary builds and serves first, the other installs the copied wheel."""

from __future__ import annotations

import json

import testinfra
from deploy_helper import deploy

HOSTS = {name: testinfra.get_host(f"podman://{name}") for name in ("gpu1", "gpu2")}


def _manifest(host) -> dict:
    return json.loads(host.file("/opt/vllm/current/manifest.json").content_string)


def _state(host) -> dict:
    return json.loads(host.file("/opt/vllm/state.json").content_string)


def test_one_build_for_the_fleet():
    sources = {name: _manifest(h)["source"] for name, h in HOSTS.items()}
    assert sorted(sources.values()) == ["build", "wheel"], sources


def test_same_commit_and_release_everywhere():
    manifests = [_manifest(h) for h in HOSTS.values()]
    assert manifests[0]["commit"] == manifests[1]["commit"]
    assert manifests[0]["name"] == manifests[1]["name"]
    assert manifests[0]["wheel"]["sha256"] == manifests[1]["wheel"]["sha256"]


def _first(host, action: str) -> str:
    return next(e["at"] for e in _state(host)["history"] if e["action"] == action)


def test_canary_first():
    # the canary (batch 1) passed its gate before the second batch activated anything
    assert _first(HOSTS["gpu1"], "mark_good") <= _first(HOSTS["gpu2"], "activate")


def test_both_serve_and_passed_the_gate():
    for host in HOSTS.values():
        assert host.run("curl -sf http://127.0.0.1:8000/health").rc == 0
        report = json.loads(host.file("/var/lib/vllm-gate/default.json").content_string)
        assert report["passed"] is True


def _pid(host) -> int:
    return int(host.check_output("systemctl show -p MainPID --value vllm-default.service"))


def _task_output(stdout: str, task: str) -> str:
    """What the run printed under one task (up to the next task's header)."""
    start = stdout.index(f"TASK [{task}]")
    end = stdout.find("TASK [", start + 1)
    return stdout[start : end if end != -1 else None]


def _no_wheel_server_left(host) -> bool:
    return host.run("pgrep -f vllm-ops-wheel-serv[e]").rc == 1


def test_a_host_that_lost_its_release_gets_the_wheel_of_a_host_that_holds_it():
    gpu1, gpu2 = HOSTS["gpu1"], HOSTS["gpu2"]
    release, pid = _manifest(gpu1)["name"], _pid(gpu1)
    logs = gpu1.check_output("ls /opt/vllm/logs")
    # gpu2 as a freshly added host: nothing under /opt/vllm, no service
    gpu2.run("systemctl disable --now vllm-default.service && rm -rf /opt/vllm")
    proc = deploy()
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _manifest(gpu2)["name"] == release and _manifest(gpu2)["source"] == "wheel"
    # pulled from gpu1 (dflash_wheel_distribution: peer, the default), not copied through the controller
    assert "changed: [gpu2]" in _task_output(proc.stdout, "Download the fleet's wheel from the build host")
    assert "skipping: [gpu2]" in _task_output(proc.stdout, "Copy the fleet's wheel to this host")
    assert _no_wheel_server_left(gpu1)
    assert gpu2.run("curl -sf http://127.0.0.1:8000/health").rc == 0
    # the build play looked the release up on gpu1, which holds it: nothing built, gpu1 left alone
    assert gpu1.check_output("ls /opt/vllm/logs") == logs, "a build ran on gpu1"
    assert _pid(gpu1) == pid, "gpu1 was restarted"
    again = deploy()
    assert again.stdout.count("nothing would change") == 2, again.stdout[-3000:]


def test_a_host_that_cannot_reach_the_build_host_takes_the_controller_path():
    gpu1, gpu2 = HOSTS["gpu1"], HOSTS["gpu2"]
    release = _manifest(gpu1)["name"]
    gpu2.run("systemctl disable --now vllm-default.service && rm -rf /opt/vllm")
    # gpu1 serves on its loopback: gpu2's pull is refused, as from behind a firewall
    proc = deploy({"dflash_wheel_peer_address": "127.0.0.1"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "copying through the controller" in _task_output(proc.stdout, "Say why this host takes the controller path")
    assert "changed: [gpu2]" in _task_output(proc.stdout, "Copy the fleet's wheel to this host")
    assert _manifest(gpu2)["name"] == release and _manifest(gpu2)["source"] == "wheel"
    assert gpu2.run("curl -sf http://127.0.0.1:8000/health").rc == 0
    assert _no_wheel_server_left(gpu1)
