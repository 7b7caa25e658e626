"""Role contracts (issue 18 item 3): a role's output is one documented variable, never its other registers.

The playbooks read what a role sets with set_fact and names in its meta/argument_specs.yml, or, for an entry
point that is one task (vllm_install's drift: a set_fact would be a second task per host in every no-op run),
that task's register under the documented name; any other register inside a role is the role's own business,
and a register nobody reads is dead code.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
BLOCK_KEYS = ("block", "rescue", "always")
SET_FACT = ("ansible.builtin.set_fact", "set_fact")


def tasks_of(path: Path) -> list[dict]:
    """Every task of a task file or playbook, blocks opened up (a play's tasks too)."""
    found: list[dict] = []

    def walk(items: object) -> None:
        for item in items or []:
            if not isinstance(item, dict):
                continue
            found.append(item)
            for key in (*BLOCK_KEYS, "tasks", "pre_tasks", "post_tasks", "handlers"):
                walk(item.get(key))

    walk(yaml.safe_load(path.read_text()))
    return found


def strings_of(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in [str(key), *strings_of(value)]]
    if isinstance(node, list):
        return [s for item in node for s in strings_of(item)]
    return []


def role_task_files(root: Path = ROOT) -> list[Path]:
    return sorted((root / "roles").glob("*/tasks/*.yml")) + sorted((root / "roles").glob("*/handlers/*.yml"))


def playbooks(root: Path = ROOT) -> list[Path]:
    # playbooks/tasks/: the task files the playbooks' plays include (the deploy's build and rollout).
    return (
        sorted((root / "playbooks").glob("*.yml"))
        + sorted((root / "playbooks" / "tasks").glob("*.yml"))
        + sorted((root / "extensions" / "molecule").glob("*/*.yml"))
    )


def registers(files: list[Path]) -> dict[str, Path]:
    return {task["register"]: path for path in files for task in tasks_of(path) if "register" in task}


def playbook_reads_of_role_registers(root: Path = ROOT) -> list[str]:
    role_registers = {name: path for name, path in registers(role_task_files(root)).items() if name not in OUTPUT_NAMES}
    found = []
    for playbook in playbooks(root):
        text = "\n".join(s for task in tasks_of(playbook) for s in strings_of(task))
        for name, where in role_registers.items():
            if re.search(rf"\b{name}\b", text):
                found.append(f"{playbook.relative_to(root)} reads {name}, a register of {where.relative_to(root)}")
    return found


def test_no_playbook_reads_a_register_from_inside_a_role():
    assert playbook_reads_of_role_registers() == []


def test_the_check_finds_a_playbook_reading_a_role_register(tmp_path):
    (tmp_path / "roles" / "r" / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "tasks" / "main.yml").write_text(
        "- name: Do\n  ansible.builtin.command: 'true'\n  register: r_inner\n"
    )
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "p.yml").write_text(
        "- hosts: all\n  tasks:\n    - block:\n        - ansible.builtin.debug:\n            msg: '{{ r_inner.rc }}'\n"
    )
    assert playbook_reads_of_role_registers(tmp_path) == [
        "playbooks/p.yml reads r_inner, a register of roles/r/tasks/main.yml"
    ]


def all_text_but(path: Path, files: list[Path]) -> str:
    """What every other file says, and this one without its register lines."""
    other = [f.read_text() for f in files if f != path]
    own = "\n".join(line for line in path.read_text().splitlines() if not line.strip().startswith("register:"))
    return "\n".join([*other, own])


# Parsed once: yaml.safe_load of every task file is most of what a parametrized case would cost.
REGISTERS = registers(role_task_files() + playbooks())


@pytest.mark.parametrize("name", sorted(REGISTERS), ids=lambda n: n)
def test_every_register_is_read(name):
    files = role_task_files() + playbooks() + sorted(ROOT.glob("roles/*/vars/*.yml"))
    files += sorted(ROOT.glob("roles/*/templates/*.j2"))
    where = REGISTERS[name]
    assert re.search(rf"\b{name}\b", all_text_but(where, files)), f"{name} ({where}) is registered and never read"


OUTPUTS = {
    "vllm_install": {"main": "vllm_install_result", "drift": "vllm_install_drift"},
    "dflash_config": {"main": "dflash_config_result", "expected_files": "dflash_config_expected"},
    "vllm_service": {"main": "vllm_service_result", "expected_files": "vllm_service_expected"},
    "dflash_gate": {"main": "dflash_gate_result"},
    "vllm_prerequisites": {"main": "vllm_prerequisites_result"},
}
OUTPUT_NAMES = {fact for entries in OUTPUTS.values() for fact in entries.values()}


@pytest.mark.parametrize(("role", "entry", "fact"), [(r, e, f) for r, d in OUTPUTS.items() for e, f in d.items()])
def test_each_entry_point_documents_and_sets_its_one_output_fact(role, entry, fact):
    spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert f"C({fact})" in " ".join(spec[entry]["description"]), f"{role} {entry}: {fact} is not documented"
    tasks = tasks_of(ROOT / "roles" / role / "tasks" / f"{entry}.yml")
    set_facts = {name for task in tasks for key in SET_FACT if key in task for name in task[key]}
    if len(tasks) == 1 and tasks[0].get("register") == fact:  # the entry point's one task registers it
        assert fact not in set_facts
    else:
        assert fact in set_facts, f"{role} {entry} does not set_fact {fact}"
    others = {name: path for name, path in registers(role_task_files()).items() if path.name != f"{entry}.yml"}
    assert fact not in others, f"{fact} is registered elsewhere in {others.get(fact)}"
