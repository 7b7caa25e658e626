"""The unit's site overrides and the NVIDIA device ACL (issue 27 item 5).

vllm_service's unit template is rendered by ansible-playbook on localhost with the role's defaults, beside its
expected_files entry point (the deploy's look), and its tasks_from: unit_overrides check runs on bad input.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.slow  # every test runs ansible-playbook
ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "vllm_service"


def _play(tmp_path: Path, tasks: list, **variables: Any) -> subprocess.CompletedProcess:
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": [
            str(ROOT / "roles" / "vllm" / "defaults" / "main.yml"),  # the shared vllm_* (a dependency of ROLE)
            str(ROLE / "defaults" / "main.yml"),
            str(ROLE / "vars" / "main.yml"),
        ],
        "tasks": tasks,
    }
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([play]))
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook)]
    argv += ["-e", json.dumps({"ansible_python_interpreter": sys.executable, **variables})]
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "ac"),
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_NOCOLOR="1",
    )
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)


def _render(tmp_path: Path, **variables: Any) -> tuple[list[str], str]:
    """The unit's lines as main.yml would install it, and the sha256 the deploy's look expects of it."""
    unit, expected = tmp_path / "unit.service", tmp_path / "expected.json"
    tasks = [
        {"ansible.builtin.template": {"src": str(ROLE / "templates" / "vllm.service.j2"), "dest": str(unit)}},
        {"ansible.builtin.include_role": {"name": "vllm_ops.dflash.vllm_service", "tasks_from": "expected_files"}},
        {"ansible.builtin.copy": {"content": "{{ vllm_service_expected | to_json }}", "dest": str(expected)}},
    ]
    proc = _play(tmp_path, tasks, **variables)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return unit.read_text().splitlines(), json.loads(expected.read_text())["files"][0]["sha256"]


def _service(lines: list[str]) -> list[str]:
    """The [Service] section's lines, comments and blank lines left out."""
    section = lines[lines.index("[Service]") + 1 : lines.index("[Install]")]
    return [line for line in section if line and not line.startswith("#")]


def test_the_device_acl_allows_the_nvidia_caps_mig_needs(tmp_path):
    lines, _sha = _render(tmp_path)
    assert "DeviceAllow=char-nvidia-caps rw" in lines
    # /dev/nvidia0 is major 195, "nvidia" in /proc/devices on driver 580 (the H200), "nvidia-frontend" before.
    assert {"DeviceAllow=char-nvidia rw", "DeviceAllow=char-nvidia-frontend rw"} <= set(lines)
    assert "DevicePolicy=closed" in lines


def test_overrides_replace_the_roles_own_lines_in_place_and_the_look_sees_them(tmp_path):
    plain, plain_sha = _render(tmp_path)
    overrides = {
        "ProtectHome": "read-only",
        "SystemCallFilter": ["@system-service", "~@obsolete"],  # the role sets it twice: both replaced
        "RemoveIPC": None,
        "MemoryDenyWriteExecute": False,
        "CPUQuota": "800%",
    }
    lines, sha = _render(tmp_path, vllm_service_unit_overrides=overrides)
    service, before = _service(lines), _service(plain)
    assert [line for line in service if line.startswith("ProtectHome=")] == ["ProtectHome=read-only"]
    assert service.index("ProtectHome=read-only") == before.index("ProtectHome=yes")  # in place
    assert [line for line in service if line.startswith("SystemCallFilter=")] == [
        "SystemCallFilter=@system-service",
        "SystemCallFilter=~@obsolete",
    ]
    assert not [line for line in service if line.startswith("RemoveIPC=")]
    assert service[-2:] == ["MemoryDenyWriteExecute=no", "CPUQuota=800%"]  # added inside [Service]
    # Nothing else moved, and the [Unit] section is the role's.
    untouched = {"ProtectHome", "SystemCallFilter", "RemoveIPC"}
    assert [line for line in service[:-2] if line.split("=", 1)[0] not in untouched] == [
        line for line in before if line.split("=", 1)[0] not in untouched
    ]
    assert lines[: lines.index("[Service]")] == plain[: plain.index("[Service]")]
    # The look hashes the unit with its overrides: a changed override is a change to deploy.
    assert sha == hashlib.sha256((tmp_path / "unit.service").read_bytes()).hexdigest()
    assert sha != plain_sha


def test_no_overrides_leave_the_unit_as_the_role_writes_it(tmp_path):
    lines, _sha = _render(tmp_path, vllm_service_unit_overrides={})
    assert not [line for line in lines if "vllm_service_unit_overrides" in line]
    assert _service(lines).count("ProtectHome=yes") == 1


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"protect home": "yes"}, "protect home"),
        ({"ProtectHome": "yes\nExecStartPre=/bin/evil"}, "ProtectHome"),
        ({"SystemCallFilter": ["@system-service", "~@obsolete\nUser=root"]}, "SystemCallFilter"),
        ({"Environment": {"A": "1"}}, "Environment"),
    ],
    ids=["not-a-directive", "newline", "newline-in-a-list", "dict"],
)
def test_a_bad_override_is_refused_naming_it(tmp_path, overrides, named):
    tasks = [{"ansible.builtin.include_role": {"name": "vllm_ops.dflash.vllm_service", "tasks_from": "unit_overrides"}}]
    proc = _play(tmp_path, tasks, vllm_service_unit_overrides=overrides)
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "must map [Service] directive names (such as ProtectHome) to a value" in out
    assert f"fix {named}" in out, out[-2000:]


def test_a_good_override_passes_the_check(tmp_path):
    tasks = [{"ansible.builtin.include_role": {"name": "vllm_ops.dflash.vllm_service", "tasks_from": "unit_overrides"}}]
    proc = _play(tmp_path, tasks, vllm_service_unit_overrides={"ProtectHome": "read-only", "RemoveIPC": None})
    assert proc.returncode == 0, proc.stdout[-3000:]
