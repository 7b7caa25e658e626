"""vllm_drift's action plugin: the deploy's look renders on the controller and sends only hashes.

Driven as ansible-core's own action tests drive an ActionBase (a task and a connection that are mocks), with
the real DataLoader, Templar and template lookup; the module call is recorded instead of sent.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
import yaml
from ansible.errors import AnsibleActionFail
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.vllm_ops.dflash.plugins.action.vllm_drift import ROLES_DIR, ActionModule

ROOT = Path(__file__).resolve().parents[4]
PLAYBOOK = ROOT / "playbooks" / "deploy_dflash.yml"
HF_TOKEN = "hf_thisIsTheSecretTokenOfTheTest"
API_KEY = "sk-the-api-key-of-the-test"
# What an inventory sets (secrets among them), over every role's defaults and vars.
INVENTORY = {
    "vllm_hf_token": HF_TOKEN,
    "vllm_api_key": API_KEY,
    "vllm_instance": "chat",
    "vllm_extra_env": {"NCCL_DEBUG": "WARN"},
    "vllm_service_unit_overrides": {"ProtectHome": "read-only"},
    "dflash_config_drafter_config": {"architectures": ["DFlashDraftModel"]},
    "vllm_drafter_model": {"repo_id": "org/drafter", "revision": "a" * 40},
    "vllm_speculative_config": {"method": "dflash", "num_speculative_tokens": 8},
}


def role_variables(**inventory: object) -> Any:
    """Every role's defaults, the inventory over them, the roles' vars over that (Ansible's precedence)."""
    loader = DataLoader()
    roles = sorted(Path(ROLES_DIR).iterdir())
    variables: dict = {}
    for role in roles:
        variables.update(loader.load_from_file(str(role / "defaults" / "main.yml")) or {})
    variables.update(inventory)
    for role in roles:
        if (role / "vars" / "main.yml").exists():
            variables.update(loader.load_from_file(str(role / "vars" / "main.yml")) or {})
    return _trusted(variables)  # a role's files are templates, templated when read


def look_task() -> dict:
    """The deploy playbook's look task (the vllm_install drift import) and its vars."""
    look = yaml.safe_load(PLAYBOOK.read_text())[0]
    return next(task for task in look["tasks"] if task["name"] == "Would a deploy change this host")


def action(args: dict, variables: dict) -> tuple[ActionModule, list]:
    """The action plugin over a mock task and connection; the list receives each module call's arguments."""
    task = MagicMock(args=args, async_val=0, check_mode=True, environment=None)
    plugin = ActionModule(
        task,
        MagicMock(),
        MagicMock(),
        loader=DataLoader(),
        templar=Templar(loader=DataLoader(), variables=variables),
        shared_loader_obj=None,
    )
    calls: list = []

    def execute_module(module_name: str, module_args: dict, task_vars: dict) -> dict:
        calls.append((module_name, module_args))
        return {"changed": False, "unchanged": True, "files": []}

    plugin._execute_module = execute_module  # type: ignore[method-assign]
    return plugin, calls


def templated(node: object, variables: dict) -> object:
    """A task's arguments as TaskExecutor gives them to the action (every string templated)."""
    return Templar(loader=DataLoader(), variables=variables).template(_trusted(node))


def _trusted(node: object) -> object:
    if isinstance(node, str):
        return trust_as_template(node)
    if isinstance(node, dict):
        return {key: _trusted(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_trusted(item) for item in node]
    return node


def role_expectation(role: str, fact: str, variables: dict) -> dict:
    """What the role's own expected_files entry point sets (its set_fact expression, in the role's search path)."""
    tasks = yaml.safe_load((Path(ROLES_DIR) / role / "tasks" / "expected_files.yml").read_text())
    expression = next(task["ansible.builtin.set_fact"][fact] for task in tasks if "ansible.builtin.set_fact" in task)
    scoped = {**variables, "ansible_search_path": [str(Path(ROLES_DIR) / role)]}
    return Templar(loader=DataLoader(), variables=scoped).template(trust_as_template(expression))


@pytest.fixture(name="look")
def fixture_look() -> tuple[dict, list, dict]:
    """The look task run through the action: (its vars templated, the module calls, the variables)."""
    variables = role_variables(**INVENTORY)
    task_vars = templated(look_task()["vars"], variables)
    args = {"refusals": task_vars["vllm_drift_refusals"], "templates": task_vars["vllm_drift_templates"], "files": []}
    plugin, calls = action(args, variables)
    assert plugin.run(task_vars=variables)["unchanged"] is True
    return task_vars, calls, variables


def test_the_look_sends_what_the_roles_expected_files_send(look):
    task_vars, calls, variables = look
    config = role_expectation("dflash_config", "dflash_config_expected", variables)
    service = role_expectation("vllm_service", "vllm_service_expected", variables)
    [(module, args)] = calls
    assert module == "vllm_ops.dflash.vllm_drift"
    # the same files (same bytes: the same sha256 and input_sha256), modes, owners and records
    paths = ["/etc/vllm/chat.yaml", "/etc/vllm/chat.env", "/etc/systemd/system/vllm-chat.service"]
    assert [item["path"] for item in args["files"]] == paths
    assert args["files"] == config["files"] + service["files"]
    assert task_vars["vllm_drift_recorded_inputs"] == config["input_records"]
    assert task_vars["vllm_drift_unit"] == service["unit"]
    assert task_vars["vllm_drift_unit_enabled"] == service["unit_enabled"]
    assert task_vars["vllm_drift_health_url"] == service["health_url"]


def test_the_hash_is_of_the_bytes_the_role_writes(look):
    calls, variables = look[1], look[2]
    env = Templar(loader=DataLoader(), variables={**variables, "ansible_search_path": [f"{ROLES_DIR}/dflash_config"]})
    content = env.template(trust_as_template("{{ lookup('ansible.builtin.template', 'serve.env.j2') }}"))
    assert f"HF_TOKEN={HF_TOKEN}" in content  # the render has the secret: the test means something
    sent = {item["path"]: item for item in calls[0][1]["files"]}
    assert sent["/etc/vllm/chat.env"]["sha256"] == hashlib.sha256(content.encode()).hexdigest()


def test_no_content_reaches_the_host(look):
    calls = look[1]
    [(_module, args)] = calls
    sent = json.dumps(args)
    assert HF_TOKEN not in sent and API_KEY not in sent
    assert "templates" not in args and "refusals" not in args
    for item in args["files"]:
        assert set(item) <= {"path", "sha256", "mode", "owner", "group", "input_sha256", "input_record"}


def test_given_files_are_kept_and_without_templates_it_is_the_module():
    given = [{"path": "/etc/x", "sha256": "0" * 64}]
    plugin, calls = action({"files": given, "unit": "vllm-default.service"}, {})
    plugin.run(task_vars={})
    assert calls == [("vllm_ops.dflash.vllm_drift", {"files": given, "unit": "vllm-default.service"})]


def test_a_template_the_role_does_not_have_fails_before_the_host_is_asked():
    plugin, calls = action({"templates": [{"role": "dflash_config", "src": "nope.j2", "path": "/etc/x"}]}, {})
    with pytest.raises(AnsibleActionFail, match=r"nope\.j2"):
        plugin.run(task_vars={})
    plugin, calls = action({"templates": [{"role": "no_such_role", "src": "a.j2", "path": "/etc/x"}]}, {})
    with pytest.raises(AnsibleActionFail, match="no_such_role"):
        plugin.run(task_vars={})
    plugin, calls = action({"templates": [{"src": "a.j2"}]}, {})
    with pytest.raises(AnsibleActionFail, match="path"):
        plugin.run(task_vars={})
    assert calls == []


def test_the_renders_leave_the_task_variables_as_they_were():
    # The lookup's deep copy of the task's variables is a copy of their top level here (_LookupVariables).
    variables = role_variables(**INVENTORY)
    before = {key: repr(value) for key, value in variables.items()}
    task_vars = templated(look_task()["vars"], variables)
    plugin, calls = action({"templates": task_vars["vllm_drift_templates"], "files": []}, variables)
    plugin.run(task_vars=variables)
    assert {key: repr(value) for key, value in variables.items()} == before
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("inventory", "message"),
    [
        ({"vllm_instance": "x;touch /tmp/pwned"}, "vllm_instance is not a plain name"),
        (
            {"vllm_extra_env": {"FOO": f"{HF_TOKEN}\nLD_PRELOAD=/tmp/evil.so"}},
            "vllm_extra_env.FOO: a value with a line",
        ),
        ({"vllm_service_unit_overrides": {"protecthome": "yes"}}, "fix protecthome"),
    ],
    ids=["name", "env-value", "unit-override"],
)
def test_the_roles_refusals_fail_the_look_before_a_render_or_the_host(inventory, message):
    # The look's refusals are the roles' own messages (their vars/main.yml, as their check tasks read them).
    variables = role_variables(**{**INVENTORY, **inventory})
    task_vars = templated(look_task()["vars"], variables)
    refused = [text for text in task_vars["vllm_drift_refusals"] if text]
    assert len(refused) == 1 and message in refused[0] and HF_TOKEN not in refused[0]
    # a template that does not exist would fail its render: the refusal comes first, and nothing is sent
    templates = [*task_vars["vllm_drift_templates"], {"role": "dflash_config", "src": "nope.j2", "path": "/etc/x"}]
    plugin, calls = action({"refusals": task_vars["vllm_drift_refusals"], "templates": templates}, variables)
    with pytest.raises(AnsibleActionFail, match=message):
        plugin.run(task_vars=variables)
    assert calls == []


def test_plain_values_refuse_nothing(look):
    task_vars = look[0]
    assert task_vars["vllm_drift_refusals"] == ["", "", ""]
