"""Real vLLM (the CPU build, 0.32.0) after converge and idempotence: facts, the unit as the role renders it,
serving with the key, the gate passed at AL 5.00, and a re-run that changes nothing. No engine restart here."""

from __future__ import annotations

import json
import re
from pathlib import Path

from deploy_helper import assert_sandboxed, deploy, release_state, run_playbook, service_pid
from real_helper import API_KEY, TARGET, UNIT, complete, engine_core_pid

HERE = Path(__file__).resolve().parent


def test_facts_are_real_vllms_version_extensions_and_capabilities(host, tmp_path):
    out = tmp_path / "facts.json"
    proc = run_playbook(str(HERE.parent / "facts.yml"), {"facts_out": str(out)})
    assert proc.returncode == 0, proc.stdout[-3000:]
    facts = json.loads(out.read_text())
    assert facts["version"] == "0.32.0"
    extensions = facts["extensions"]
    # the CPU wheel's own compiled members, loaded by the release's python (vllm._C needs libnuma.so.1) ...
    assert {name: e["ok"] for name, e in extensions.items()} == {
        "vllm._C": True,
        "vllm.fs_io_C": True,
        "vllm.spinloop": True,
    }
    # ... vllm._C from the per-ISA copy vLLM loads on this CPU, the other copies variants, not broken
    loaded = facts["cpu_variant"]["module"]
    assert sorted([loaded, *facts["variant_extensions"]]) == ["vllm._C", "vllm._C_AVX2", "vllm._C_AVX512"]
    assert extensions["vllm._C"]["path"] == facts["cpu_variant"]["path"]
    assert extensions["vllm._C"]["path"].endswith(loaded.replace("vllm.", "/") + ".abi3.so")
    assert facts["missing_extensions"] == [] and facts["broken_extensions"] == []
    caps = facts["capabilities"]
    assert facts["capabilities_error"] is None and caps["vllm_version"] == "0.32.0"
    assert {"draft_model", "dflash"} <= set(caps["speculative_methods"])
    assert "--enforce-eager" in caps["serve_flags"] and "Qwen3ForCausalLM" in caps["registered_architectures"]
    print("extensions:", {name: e["ok"] for name, e in extensions.items()})
    print("speculative methods:", caps["speculative_methods"], "runner:", caps["default_model_runner"])


def test_the_release_is_the_pinned_version_installed_without_git(host):
    state = release_state(host)
    manifest = json.loads(host.file(f"/opt/vllm/releases/{state['current']}/manifest.json").content_string)
    print("manifest:", {k: v for k, v in manifest.items() if not isinstance(v, (dict, list))})
    assert (manifest["source"], manifest["package"], manifest["version"]) == ("release", "vllm", "0.32.0")
    assert manifest["repo"] is None and manifest["index"] and "/srv/wheelhouse-real" in manifest["index"]
    assert not host.file("/opt/vllm/mirror").exists, "a release install cloned git"


def test_the_unit_is_the_roles_own_hardened_unit_running_real_vllm_as_vllm(host):
    pid = service_pid(host)
    uid = host.check_output(f"awk '/^Uid:/ {{print $2}}' /proc/{pid}/status")
    assert host.user("vllm").uid == int(uid)
    cmdline = host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    assert f"/opt/vllm/releases/{release_state(host)['current']}/venv/bin/vllm serve --config" in cmdline
    # the engine core is real vLLM's, a child of the API server in the unit's cgroup
    assert host.run(f"pgrep -P {pid} -x VLLM::EngineCor").rc == 0
    props = host.check_output(
        f"systemctl show {UNIT} -p User -p NoNewPrivileges -p ProtectSystem -p PrivateTmp -p DevicePolicy "
        "-p KillMode -p Restart -p EnvironmentFiles -p SystemCallFilter -p RestrictAddressFamilies"
    )
    for expected in ("User=vllm", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes",
                     "DevicePolicy=closed", "KillMode=mixed", "Restart=always",
                     "EnvironmentFiles=/etc/vllm/default.env"):  # fmt: skip
        assert expected in props, props
    # ... and in force for real vLLM's API server and its engine core
    for engine_pid in (pid, engine_core_pid(host)):
        assert_sandboxed(host, engine_pid)
    env = host.file("/etc/vllm/default.env")
    assert env.mode == 0o600 and env.user == "root" and f"VLLM_API_KEY={API_KEY}" in env.content_string
    assert API_KEY not in host.file("/etc/vllm/default.yaml").content_string


def test_the_host_has_what_a_gpu_host_has_libnuma_and_a_real_dev_shm(host):
    assert host.package("libnuma1").is_installed
    size = int(host.check_output("df --output=size -B1M /dev/shm | tail -n 1"))
    assert size >= 1024, f"/dev/shm is {size} MiB: vLLM's queues need 160-240 MiB"


def test_serves_greedy_completions_with_the_key_only(host):
    assert host.run("curl -sf http://127.0.0.1:8000/v1/models").rc != 0  # no key, no /v1
    first = complete(host, "The capital of France is")
    again = complete(host, "The capital of France is")
    assert first["model"] == "tiny" and first["usage"]["completion_tokens"] == 16
    assert first["choices"][0]["text"] == again["choices"][0]["text"]  # greedy is deterministic


def test_the_gate_passed_on_real_spec_decode_counters_at_al_5(host):
    report = json.loads(host.file("/var/lib/vllm-gate/default.json").content_string)
    print("gate:", {k: report.get(k) for k in ("passed", "mean_acceptance_length", "drafts")})
    assert report["passed"] is True
    # draft_model with the target as drafter, K = 4: every draft token is accepted, AL = 5
    assert abs(report["mean_acceptance_length"] - 5.0) < 0.01
    metrics = host.check_output("curl -sf http://127.0.0.1:8000/metrics")
    drafts = re.search(r"^vllm:spec_decode_num_drafts_total\{[^}]*\} ([0-9.e+]+)$", metrics, re.M)
    assert drafts and float(drafts.group(1)) > 0, "no real spec-decode counter"
    config = host.file("/etc/vllm/default.yaml").content_string
    assert TARGET in config and "enforce-eager: true" in config


def test_a_re_run_changes_nothing(host):
    pid = service_pid(host)
    gated = host.file("/var/lib/vllm-gate/default.json").mtime
    proc = deploy()
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "nothing would change" in proc.stdout
    assert re.search(r"vllm-real1\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", proc.stdout)
    assert service_pid(host) == pid and host.file("/var/lib/vllm-gate/default.json").mtime == gated
