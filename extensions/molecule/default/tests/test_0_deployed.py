"""The deployed host after converge, idempotence, a branch bump and a second idempotence run."""

from __future__ import annotations

import json
import re

from deploy_helper import assert_sandboxed, deploy, release_state, service_pid

API_KEY = "fixture-secret-key-do-not-print"


def test_service_runs_as_vllm_from_current(host):
    pid = service_pid(host)
    assert pid > 0
    uid = host.check_output(f"awk '/^Uid:/ {{print $2}}' /proc/{pid}/status")
    assert host.user("vllm").uid == int(uid)
    assert host.user("vllm").shell == "/usr/sbin/nologin"
    exe = host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    # `current` resolved once at the start (the unit's ExecStart): the release it named then
    current = release_state(host)["current"]
    assert f"/opt/vllm/releases/{current}/venv/bin/vllm serve --config /etc/vllm/default.yaml" in exe


def test_current_is_a_relative_link_to_the_active_release(host):
    link = host.file("/opt/vllm/current")
    assert link.is_symlink
    target = host.check_output("readlink /opt/vllm/current")
    assert target.startswith("releases/") and not target.startswith("/")
    state = release_state(host)
    assert target == f"releases/{state['current']}"
    assert state["releases"][state["current"]]["status"] == "good"
    assert host.file(f"/opt/vllm/{target}/manifest.json").exists


def test_serves_the_configured_model_on_loopback_only(host):
    assert host.socket("tcp://127.0.0.1:8000").is_listening
    assert not host.socket("tcp://0.0.0.0:8000").is_listening
    out = host.check_output(f"curl -sf -H 'Authorization: Bearer {API_KEY}' http://127.0.0.1:8000/v1/models")
    assert [m["id"] for m in json.loads(out)["data"]] == ["tiny"]
    # /v1 needs the key; /health stays open, as in vLLM
    assert host.run("curl -sf http://127.0.0.1:8000/v1/models").rc != 0
    assert host.run("curl -sf http://127.0.0.1:8000/health").rc == 0


def test_serve_config_carries_the_dflash_speculative_config(host):
    import yaml

    config = yaml.safe_load(host.file("/etc/vllm/default.yaml").content_string)
    assert config["served-model-name"] == "tiny"
    assert config["host"] == "127.0.0.1"
    spec = config["speculative-config"]
    assert spec["method"] == "dflash" and spec["num_speculative_tokens"] == 7
    assert API_KEY not in host.file("/etc/vllm/default.yaml").content_string


def test_env_file_holds_the_secret_with_mode_0600(host):
    env = host.file("/etc/vllm/default.env")
    assert env.mode == 0o600 and env.user == "root"
    assert f"VLLM_API_KEY={API_KEY}" in env.content_string


def test_unit_is_hardened(host):
    props = host.check_output(
        "systemctl show vllm-default.service -p NoNewPrivileges -p ProtectSystem -p ProtectHome "
        "-p PrivateTmp -p DevicePolicy -p KillMode -p Restart -p TimeoutStopUSec -p User"
    )
    for expected in (
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "DevicePolicy=closed",
        "KillMode=mixed",
        "Restart=always",
        "User=vllm",
    ):
        assert expected in props
    assert_sandboxed(host, service_pid(host))
    out = host.run("systemd-analyze security --no-pager vllm-default.service").stdout
    score = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out).group(1))
    print(f"systemd-analyze security exposure: {score}")
    assert score <= 4.0


def test_gate_report_says_passed(host):
    report = json.loads(host.file("/var/lib/vllm-gate/default.json").content_string)
    assert report["passed"] is True
    assert abs(report["mean_acceptance_length"] - 4.0) < 0.1
    assert host.file("/var/lib/vllm-gate/default.md").exists
    assert API_KEY not in host.file("/var/lib/vllm-gate/default.json").content_string


def test_a_re_run_is_one_look_and_nothing_else(host):
    pid = service_pid(host)
    gated = host.file("/var/lib/vllm-gate/default.json").mtime
    proc = deploy()
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "nothing would change" in proc.stdout
    # the build play and the rollout play have no host to run on
    assert proc.stdout.count("skipping: no hosts matched") == 2, proc.stdout[-3000:]
    assert re.search(r"gpu1\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", proc.stdout)
    assert service_pid(host) == pid
    assert host.file("/var/lib/vllm-gate/default.json").mtime == gated, "gate traffic on a no-op"


def test_a_file_edited_by_hand_is_seen_and_put_back(host):
    pid = service_pid(host)
    host.run("echo '# edited by hand' >> /etc/vllm/default.yaml")
    proc = deploy()
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "/etc/vllm/default.yaml has other content" in " ".join(proc.stdout.split())
    assert "edited by hand" not in host.file("/etc/vllm/default.yaml").content_string
    assert service_pid(host) != pid, "the restored config was not loaded"
    assert "nothing would change" in deploy().stdout


def test_a_drafter_config_changed_in_place_is_judged_and_loaded(host):
    drafter = "/srv/models/tiny-dflash/config.json"
    record = json.loads(host.file("/etc/vllm/default.drafter.json").content_string)
    assert list(record["files"]) == [drafter]
    pid = service_pid(host)
    # same meaning, other bytes: what a re-downloaded drafter looks like to the deploy
    host.run(f"python3 -c \"import json; p='{drafter}'; c=json.load(open(p)); json.dump(c, open(p, 'w'), indent=3)\"")
    proc = deploy()
    assert proc.returncode == 0, proc.stdout[-3000:]
    # the YAML callback folds long messages: compare with the white space folded too
    assert f"{drafter} changed since it was recorded" in " ".join(proc.stdout.split())
    assert service_pid(host) != pid, "the new drafter was not loaded"
    assert "nothing would change" in deploy().stdout
