"""Every fault fails loudly and leaves the previous release serving: real playbook runs, real host."""

from __future__ import annotations

import json
import re

import pytest
from deploy_helper import deploy, release_state, run_playbook, service_pid

API_KEY = "fixture-secret-key-do-not-print"
SPEC = {
    "method": "dflash",
    "model": "/srv/models/tiny-dflash",
    "num_speculative_tokens": 7,
    "rejection_sample_method": "synthetic",
    "synthetic_acceptance_length": 4.0,
}


@pytest.fixture
def serving(host):
    """What serves before a fault, checked unchanged after it."""
    before = {"current": release_state(host)["current"], "pid": service_pid(host)}
    yield before
    after = release_state(host)
    assert after["current"] == before["current"], "current moved"
    assert host.check_output("readlink /opt/vllm/current") == f"releases/{before['current']}"
    assert host.run("curl -sf http://127.0.0.1:8000/health").rc == 0, "previous release not serving"


def _assert_failed(proc, *needles):
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    for needle in needles:
        assert needle in out, f"{needle!r} not in the playbook output"
    assert API_KEY not in out, "the API key was printed"


def test_build_timeout_kills_the_build_and_keeps_the_log(host, serving):
    proc = deploy({"vllm_ref": "fault/slow-build", "vllm_build_timeout": 25})
    _assert_failed(proc, "timed out", "/opt/vllm/logs/build-")
    assert service_pid(host) == serving["pid"], "the service was restarted"
    # the whole process group is gone: no build process is left behind
    # (the [x] keeps grep from matching its own command line)
    left = host.run("ps -eo pid,args | grep -E '[p]ip wheel|[s]etup.py|[_]in_process|[b]uild_ext'")
    assert left.stdout == "", f"build processes left running: {left.stdout}"
    # the log the message names is there and says why the build ended
    named = re.search(r"/opt/vllm/logs/build-[^\s'\"]+\.log", proc.stdout + proc.stderr)
    assert named, "the failure names no build log"
    assert host.file(named.group(0)).is_file, f"{named.group(0)} is not kept"
    assert host.file(named.group(0)).size > 0, f"{named.group(0)} is empty"


def test_missing_extension_is_refused(host, serving):
    proc = deploy({"vllm_ref": "fault/missing-so"})
    _assert_failed(proc, "vllm._moe_C", "NOT activated")
    assert service_pid(host) == serving["pid"]
    failed = [r for r in release_state(host)["releases"].values() if r["status"] == "failed"]
    assert failed, "the refused release is not recorded as failed"


def test_extension_that_fails_to_compile_is_refused(host, serving):
    proc = deploy({"vllm_ref": "fault/broken-ext"})
    _assert_failed(proc, "/opt/vllm/logs/build-")
    assert service_pid(host) == serving["pid"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"vllm_ref": "no-such-branch"}, "no-such-branch"),
        ({"vllm_expected_commit": "0" * 40}, "0" * 40),
        ({"vllm_repo": "/srv/no-such-repo.git"}, "/srv/no-such-repo.git"),
    ],
    ids=["unknown-ref", "expected-commit-mismatch", "unreachable-repo"],
)
def test_bad_input_fails_before_any_build(host, serving, extra, needle):
    logs_before = host.check_output("ls /opt/vllm/logs | wc -l")
    proc = deploy(extra)
    _assert_failed(proc, needle)
    assert host.check_output("ls /opt/vllm/logs | wc -l") == logs_before, "a build was started"


def test_preflight_refuses_a_sliding_window_drafter_on_a_vllm_without_support(host, serving):
    # The drafter has sliding-window layers; the fault/no-probe checkout lacks both DFlash fixes.
    host.run(
        "python3 -c \"import json; c=json.load(open('/srv/models/tiny-dflash/config.json'));"
        " c['layer_types']=['sliding_attention']; c['sliding_window']=2048;"
        " json.dump(c, open('/srv/models/sliding.json','w'))\""
    )
    proc = deploy(
        {
            "vllm_ref": "fault/no-probe",
            "vllm_required_probes": [],
            "dflash_config_drafter_config": "/srv/models/sliding.json",
        }
    )
    _assert_failed(proc, "sliding")
    assert service_pid(host) == serving["pid"], "restarted before the preflight verdict"


def test_low_acceptance_rolls_back(host, serving):
    proc = deploy({"vllm_ref": "dflash-fix", "vllm_speculative_config": {**SPEC, "synthetic_acceptance_length": 1.2}})
    _assert_failed(proc, "1.2", "2.0", "rolled back to " + serving["current"])
    state = release_state(host)
    failed = {name for name, r in state["releases"].items() if r["status"] == "failed"}
    assert any(name != serving["current"] for name in failed)
    assert host.file("/etc/vllm/default.yaml").contains("synthetic_acceptance_length: 4.0")


def test_a_rollback_after_a_port_and_unit_change_serves_with_the_old_unit_and_port(host, serving):
    # The failed deploy moved the server to 8002 and changed its unit; the release rolled back to must serve
    # with its own unit, and the rescue's ready check must ask it on its own port (8000: `serving` checks).
    unit = "/etc/systemd/system/vllm-default.service"
    unit_before = host.file(unit).content_string
    stop_before = host.check_output("systemctl show -p TimeoutStopUSec --value vllm-default.service")
    bad = {"vllm_port": 8002, "vllm_shutdown_timeout": 40, "vllm_ref": "dflash-fix"}
    proc = deploy({**bad, "vllm_speculative_config": {**SPEC, "synthetic_acceptance_length": 1.2}})
    _assert_failed(proc, "1.2", "rolled back to " + serving["current"])
    assert "not ready on port 8002" not in proc.stdout + proc.stderr
    assert host.file(unit).content_string == unit_before, "the failed deploy's unit was left in place"
    assert host.check_output("systemctl show -p TimeoutStopUSec --value vllm-default.service") == stop_before
    assert host.file("/etc/vllm/default.yaml").contains("port: 8000")


def test_a_first_deploy_that_fails_its_gate_leaves_its_service_stopped_and_disabled(host, serving):
    # A second instance with its own root: nothing served there before, so there is nothing to roll back to.
    first = {"vllm_root": "/opt/vllm-first", "vllm_instance": "first", "vllm_port": 8001}
    proc = deploy({**first, "vllm_speculative_config": {**SPEC, "synthetic_acceptance_length": 1.2}})
    _assert_failed(
        proc, "1.2", "no release on this host passed a gate", "the service is stopped and disabled, nothing serves"
    )
    assert host.run("systemctl is-active vllm-first.service").stdout.strip() != "active"
    assert host.run("systemctl is-enabled vllm-first.service").stdout.strip() == "disabled"
    state = json.loads(host.file("/opt/vllm-first/state.json").content_string)
    assert [r["status"] for r in state["releases"].values()] == ["failed"]
    assert service_pid(host) == serving["pid"], "the other instance was touched"


def test_server_that_exits_at_start_rolls_back(host, serving):
    proc = deploy({"vllm_ref": "fault/crash-on-start", "vllm_ready_timeout": 20})
    # the failure carries the journal tail, which names the server's own error
    _assert_failed(proc, "Last journal lines", "rolled back to " + serving["current"])


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"method": "dflashh"}, "speculative_config.method"),
        ({"num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens"),
        ({"tensor_parallel_size": 2}, "speculative_config.tensor_parallel_size"),
        ({"draft_tensor_parallel_size": 2}, "speculative_config.draft_tensor_parallel_size"),
    ],
    ids=["unknown-method", "k-zero", "tp-inside-spec", "draft-tp-mismatch"],
)
def test_preflight_refuses_a_bad_speculative_config_before_any_change(host, serving, spec, needle):
    config_before = host.file("/etc/vllm/default.yaml").content_string
    proc = deploy({"vllm_speculative_config": {**SPEC, **spec}})
    _assert_failed(proc, needle, "Fix:")
    assert service_pid(host) == serving["pid"]
    assert host.file("/etc/vllm/default.yaml").content_string == config_before


def test_preflight_refuses_a_vllm_without_the_layer_offset_fix(host, serving):
    proc = deploy({"vllm_ref": "fault/no-probe", "vllm_required_probes": []})
    _assert_failed(proc, "dflash_aux_layer_offset", "one layer too early")
    assert service_pid(host) == serving["pid"]


def test_preflight_refuses_a_drafter_that_is_not_dflash(host, serving):
    host.run(
        "python3 -c \"import json; c=json.load(open('/srv/models/tiny-dflash/config.json'));"
        " c['architectures']=['Qwen3ForCausalLM']; json.dump(c, open('/srv/models/not-dflash.json','w'))\""
    )
    # dflash_config_drafter_config is only what the preflight reads (the drafter the server loads is unchanged, and
    # so is its record): the look sees nothing to do, so force the full path, which runs the preflight.
    proc = deploy({"dflash_config_drafter_config": "/srv/models/not-dflash.json", "dflash_skip_unchanged": False})
    _assert_failed(proc, "architectures")
    assert service_pid(host) == serving["pid"]


def test_check_mode_changes_nothing(host, serving):
    # every file and link, with size and mtime. Not directories' mtimes (temp files come and go) nor the
    # host lock, which records the pid of its last holder: runtime coordination, not managed state.
    tree = "find /opt/vllm /etc/vllm -not -type d -not -name .lock -printf '%p %s %T@ %l\\n' | sort | md5sum"
    before = host.check_output(tree)
    proc = deploy({"vllm_ref": "dflash-fix"}, "--check")
    assert proc.returncode == 0, proc.stdout[-3000:]
    # check mode predicts the bump (a build, a restart) rather than saying nothing would change
    recap = re.search(r"^gpu1\s+:\s+ok=\d+\s+changed=(\d+)", proc.stdout, re.MULTILINE)
    assert recap, "no recap line for gpu1"
    assert int(recap.group(1)) > 0, "check mode predicted no change for a new ref"
    assert host.check_output(tree) == before
    assert service_pid(host) == serving["pid"]


def test_secret_change_restarts_once_and_is_never_printed(host):
    pid = service_pid(host)
    new_key = "rotated-secret-value-1234"
    proc = deploy({"vllm_api_key": new_key}, "--diff")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert new_key not in proc.stdout + proc.stderr
    assert service_pid(host) != pid, "not restarted on a changed env file"
    # back to the scenario's key (restarts again; idempotence itself is molecule's own check)
    assert deploy().returncode == 0


def test_rollback_playbook_goes_back_and_forward(host):
    current = release_state(host)["current"]
    proc = run_playbook("vllm_ops.dflash.rollback")
    assert proc.returncode == 0, proc.stdout[-3000:]
    state = release_state(host)
    back = state["current"]
    # back to an earlier release that served before and never failed (the faults above left failed ones)
    assert back != current
    assert state["releases"][back]["status"] != "failed"
    assert any(e["action"] == "activate" and e["release"] == back for e in state["history"][:-1])
    assert host.check_output("readlink /opt/vllm/current") == f"releases/{back}"
    assert host.run("curl -sf http://127.0.0.1:8000/health").rc == 0
    # and forward again to a named release
    proc = run_playbook("vllm_ops.dflash.rollback", {"vllm_rollback_release": current})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert release_state(host)["current"] == current
    assert host.run("curl -sf http://127.0.0.1:8000/health").rc == 0
