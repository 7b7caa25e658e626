"""The plays that work on the hosts run as root (issue 27 item 3); nothing asks sudo of the controller."""

from __future__ import annotations

import pytest
from helpers.playbook import plays


def _plays(name: str) -> list:
    return list(plays(name).values())  # included task files opened up


def _tasks(tasks: list):
    for task in tasks:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key, []))


ROLE_KEYS = ("ansible.builtin.import_role", "ansible.builtin.include_role")


@pytest.mark.parametrize("name", ["deploy_dflash.yml", "rollback.yml"])
def test_every_play_that_runs_a_role_on_the_hosts_becomes_root(name):
    # A play that only checks variables on the controller (assert, validate_argument_spec) needs no root.
    plays = [play for play in _plays(name) if play["hosts"] != "localhost"]
    with_roles = [play for play in plays if any(k in task for task in _tasks(play.get("tasks", [])) for k in ROLE_KEYS)]
    assert with_roles, name
    for play in with_roles:
        assert play.get("become") is True, f"{name}: {play['name']} needs become: true"


def test_what_runs_on_the_controller_does_not_become():
    # A module run on the controller under become would ask the controller for sudo.
    for play in _plays("deploy_dflash.yml"):
        for task in _tasks(play.get("tasks", [])):
            apply = (task.get("ansible.builtin.include_role") or {}).get("apply", {})
            if apply.get("delegate_to") == "localhost":
                assert apply.get("become") is False, task["name"]


def test_the_prerequisites_come_first_in_the_build_play_and_stop_every_host():
    build = next(play for play in _plays("deploy_dflash.yml") if play["name"] == "Build vLLM once for the fleet")
    first = build["tasks"][0]
    assert first["any_errors_fatal"] is True
    (check,) = first["block"]
    assert check["ansible.builtin.import_role"]["name"] == "vllm_ops.dflash.vllm_prerequisites"
    assert check["vars"]["vllm_prerequisites_build_host"] == "{{ inventory_hostname == dflash_build_host }}"
