"""Tags on every role task (issue 18 item 4), and the module_defaults group the roles take root from."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.plugins.doc_fragments.build import ModuleDocFragment

ROOT = Path(__file__).resolve().parents[3]
# The tag of each role is its name (a rollback's is dflash_rollback, and always: the rescue must run it); the
# bare tag it had before 0.2.0 stays on the same tasks until 1.0.0, so `--tags install` keeps working.
OLD_TAGS = {"vllm_install": "install", "dflash_config": "config", "vllm_service": "service", "dflash_gate": "gate"}
OLD_TAGS |= {"dflash_monitoring": "monitoring", "vllm_prerequisites": "prerequisites", "dflash_rollback": "rollback"}
TAGS = {role: role for role in OLD_TAGS}
FILE_TAGS = {("dflash_gate", "rollback.yml"): "dflash_rollback"}
TASK_FILES = sorted((ROOT / "roles").glob("*/tasks/*.yml"))


def untagged(path: Path, tag: str) -> list[str]:
    """Top-level tasks without `tag` (a block's tasks inherit its tags, an included file's are checked here)."""
    return [str(task.get("name")) for task in yaml.safe_load(path.read_text()) if tag not in task.get("tags", [])]


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: f"{p.parts[-3]}/{p.name}")
def test_every_role_task_carries_its_tag(path):
    role = path.parts[-3]
    tag = FILE_TAGS.get((role, path.name), TAGS[role])
    assert untagged(path, tag) == [], f"{role}/tasks/{path.name}: add tags: [{tag}] to these tasks"
    old = OLD_TAGS[tag]
    assert untagged(path, old) == [], f"{role}/tasks/{path.name}: keep the old tag {old} until 1.0.0 on these tasks"


def test_the_check_finds_an_untagged_task(tmp_path):
    tasks = tmp_path / "main.yml"
    tasks.write_text("- name: Tagged\n  tags: [install]\n  block: []\n- name: Bare\n  ansible.builtin.debug: {}\n")
    assert untagged(tasks, "install") == ["Bare"]


def module_options(name: str) -> dict:
    source = (ROOT / "plugins" / "modules" / f"{name}.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DOCUMENTATION":
            doc = yaml.safe_load(ast.literal_eval(node.value))
            options = dict(doc.get("options") or {})
            if "vllm_ops.dflash.build" in doc.get("extends_documentation_fragment", []):
                options.update(yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"])
            return options
    raise AssertionError(f"{name} has no DOCUMENTATION")


def test_the_root_group_is_every_module_with_a_root_option():
    # A module with root outside the group would run on /opt/vllm under the roles' module_defaults.
    group = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())["action_groups"]["vllm_root"]
    modules = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py"))
    assert sorted(group) == [m for m in modules if "root" in module_options(m)]
