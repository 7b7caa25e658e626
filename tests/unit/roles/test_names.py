"""Names that would reach a shell, the unit or a path unchecked (issue 28 case 17).

A vllm_instance with shell metacharacters ran as root through the serving probe and landed in the unit's
ExecStart. Runs dflash_gate's names entry point (what the deploy's look and playbooks/rollback.yml run first)
in a one-task play on localhost.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.role_play import run_entry_point as _play
from helpers.role_play import run_playbook

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"vllm_instance": "x;touch /tmp/pwned"}, "vllm_instance"),
        ({"vllm_instance": "x$(id)"}, "vllm_instance"),
        ({"vllm_instance": "x\n"}, "vllm_instance"),  # `$` would match before the final newline
        ({"vllm_instance": "../etc"}, "vllm_instance"),
        ({"vllm_user": "vllm\nExecStartPre=/bin/sh"}, "vllm_user"),
        ({"vllm_root": '/opt/vllm" ; rm -rf "/'}, "vllm_root"),
        ({"vllm_config_dir": "etc/vllm"}, "vllm_config_dir"),
    ],
    ids=["semicolon", "substitution", "trailing-newline", "dot-dot", "user-newline", "root-quote", "relative"],
)
def test_a_name_with_shell_or_unit_syntax_is_refused(tmp_path, extra, named):
    proc = _play(tmp_path, "dflash_gate", "names", extra)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert f"{named} is not" in out, out[-3000:]


@pytest.mark.slow
def test_plain_names_pass(tmp_path):
    extra = {"vllm_instance": "qwen3-8b_dflash.1", "vllm_user": "vllm", "vllm_root": "/srv/vllm-2/opt"}
    proc = _play(tmp_path, "dflash_gate", "names", extra)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_the_rollback_checks_the_names_first():
    plays = {p["name"]: p for p in yaml.safe_load((ROOT / "playbooks" / "rollback.yml").read_text())}
    tasks = plays["Roll back vLLM"]["tasks"]
    # only the playbook's own variable check (controller side, reads no name into a path) may come before
    roles = [i for i, task in enumerate(tasks) if "ansible.builtin.import_role" in task]
    assert all("tasks/check_variables.yml" in str(task) for task in tasks[: roles[0]])
    first = tasks[roles[0]]["ansible.builtin.import_role"]
    assert (first["name"], first["tasks_from"]) == ("vllm_ops.dflash.dflash_gate", "names")


def deploy_look(tmp_path: Path, extra: dict) -> str:
    """The deploy playbook against a host whose SSH port refuses: what a run prints before and at the first contact."""
    inventory = {
        "gpu_hosts": {
            "hosts": {"gpu1": {"ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_connection": "ssh"}},
            "vars": {"vllm_repo": "https://example.invalid/vllm.git", "vllm_ref": "main"},
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    proc = run_playbook(tmp_path, "hosts.yml", str(ROOT / "playbooks" / "deploy_dflash.yml"), extra)
    return proc.stdout + proc.stderr


SECRET = "hf_secret_value_do_not_print"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"vllm_instance": "x;touch /tmp/pwned"}, "vllm_instance is not a plain name"),
        ({"vllm_api_key": f"{SECRET}\nLD_PRELOAD=/tmp/evil.so"}, "vllm_api_key: a value with a line break"),
        ({"vllm_service_unit_overrides": {"ProtectHome": "no\nExecStartPre=/bin/sh"}}, "fix ProtectHome"),
        ({}, None),  # the control: the same run with plain values reaches the host (and finds it unreachable)
    ],
    ids=["name", "env-value", "unit-override", "plain"],
)
def test_the_deploy_s_look_refuses_before_it_reaches_a_host(tmp_path, extra, message):
    # The look has no check task of its own: vllm_drift's action makes the roles' checks on the controller first.
    out = deploy_look(tmp_path, extra)
    if message is None:
        assert "UNREACHABLE!" in out, out[-3000:]
        return
    assert message in out, out[-3000:]
    assert "UNREACHABLE!" not in out and "unreachable=0" in out, out[-3000:]
    assert SECRET not in out, "a value reached the output"
