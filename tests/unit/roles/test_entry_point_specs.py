"""Every entry point's meta/argument_specs.yml documents every option its tasks read (issue 27 item 4).

The secondary entry points (vllm_install drift, vllm_service expected_files and ready, dflash_config
expected_files, dflash_gate rollback, serving_check, serving_record) documented 0-5 options and read up to 21:
ansible-doc showed a user a fraction of what sets them, and validation skipped the rest. The check walks an
entry point's task file, the files it includes and the templates it renders, through the role's vars/ and
defaults/ expressions, and compares the vllm_*/dflash_* names read with the options documented.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

TOOL = Path(__file__).resolve().parents[2] / "tools" / "check_argument_specs.py"
SPEC = importlib.util.spec_from_file_location("check_argument_specs", TOOL)
assert SPEC and SPEC.loader
check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check)
entry_point_problems = check.entry_point_problems


def test_every_entry_point_documents_what_it_reads_and_nothing_else():
    assert entry_point_problems() == []


def make_role(tmp_path: Path, documented: dict) -> Path:
    role = tmp_path / "roles" / "r"
    for folder in ("tasks", "meta", "templates", "vars", "defaults"):
        (role / folder).mkdir(parents=True)
    (role / "tasks" / "main.yml").write_text("- ansible.builtin.debug: {msg: '{{ vllm_a }}'}\n")
    (role / "tasks" / "look.yml").write_text(
        yaml.safe_dump(
            [
                {"ansible.builtin.command": "true", "register": "r_probe", "when": "vllm_in_a_condition | bool"},
                {"ansible.builtin.debug": {"msg": "{{ r_probe.rc }} {{ r_derived }} {{ hostvars[h].vllm_as_attr }}"}},
                {"ansible.builtin.template": {"src": "unit.j2", "dest": "/x"}},
                {"ansible.builtin.include_tasks": "more.yml"},
                {"ansible.builtin.set_fact": {"r_out": "{{ vllm_in_set_fact }}"}},
            ]
        )
    )
    (role / "tasks" / "more.yml").write_text("- ansible.builtin.debug: {msg: '{{ vllm_in_included }}'}\n")
    (role / "templates" / "unit.j2").write_text("{% set vllm_local = 1 %}{{ vllm_in_template }} {{ vllm_local }}\n")
    (role / "vars" / "main.yml").write_text('r_derived: "{{ vllm_behind_a_role_var }}"\n')
    (role / "defaults" / "main.yml").write_text("vllm_a: 1\n")
    (role / "meta" / "argument_specs.yml").write_text(
        yaml.safe_dump(
            {
                "argument_specs": {
                    "main": {"options": {"vllm_a": {"type": "int", "default": 1}}},
                    "look": {"options": documented},
                }
            }
        )
    )
    return tmp_path / "roles"


READ_BY_LOOK = [
    "vllm_as_attr",
    "vllm_behind_a_role_var",
    "vllm_in_a_condition",
    "vllm_in_included",
    "vllm_in_set_fact",
    "vllm_in_template",
]


def test_the_check_finds_every_kind_of_read_an_entry_point_leaves_undocumented(tmp_path):
    roles = make_role(tmp_path, {"vllm_unread": {"type": "str"}})
    assert entry_point_problems(roles) == [
        *(f"r look: reads {name}, which its argument_specs do not document" for name in READ_BY_LOOK),
        "r look: documents vllm_unread, which none of its tasks reads",
    ]


def test_an_entry_point_documenting_exactly_what_it_reads_passes(tmp_path):
    roles = make_role(tmp_path, {name: {"type": "str"} for name in READ_BY_LOOK})
    assert entry_point_problems(roles) == []


ROOT = Path(__file__).resolve().parents[3]


def tasks_from_uses() -> set[tuple[str, str]]:
    """(role, tasks_from) of every import_role/include_role of the playbooks, the roles and the molecule plays."""
    files = [
        *ROOT.glob("playbooks/*.yml"),
        *ROOT.glob("playbooks/tasks/*.yml"),  # what the deploy's build and rollout plays include
        *ROOT.glob("roles/*/tasks/*.yml"),
        *ROOT.glob("extensions/molecule/*/*.yml"),
    ]
    found = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key in ("ansible.builtin.import_role", "ansible.builtin.include_role"):
                if isinstance(node.get(key), dict) and "tasks_from" in node[key]:
                    found.add((node[key]["name"].split(".")[-1], node[key]["tasks_from"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for path in files:
        walk(yaml.safe_load(path.read_text()))
    return found


def test_every_tasks_from_in_use_is_a_documented_entry_point():
    uses = tasks_from_uses()
    assert ("dflash_gate", "workload") in uses  # the walk finds them at all
    for role, entry in sorted(uses):
        specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        assert entry in specs, f"{role} tasks_from {entry} has no entry point in meta/argument_specs.yml"


def test_every_entry_point_the_readmes_offer_is_documented():
    """A task file a role's README says to use alone (tasks_from: stage_models) is an entry point too."""
    for readme in ROOT.glob("roles/*/README.md"):
        specs = yaml.safe_load((readme.parent / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        for entry in re.findall(r"tasks_from: ?([a-z_]+)", readme.read_text()):
            assert entry in specs, f"{readme.parent.name} README offers tasks_from {entry}, which has no entry point"


def make_shared(tmp_path: Path, shared_options: dict) -> Path:
    """Role `s` holds shared options; role `r` depends on it and reads vllm_a in main, documenting nothing."""
    roles = tmp_path / "roles"
    for role, files in {
        "s": {
            "defaults/main.yml": "vllm_a: 1\n",
            "meta/argument_specs.yml": yaml.safe_dump({"argument_specs": {"main": {"options": shared_options}}}),
        },
        "r": {
            "tasks/main.yml": "- ansible.builtin.debug: {msg: '{{ vllm_a }}'}\n",
            "meta/main.yml": "dependencies:\n  - role: vllm_ops.dflash.s\n",
            "meta/argument_specs.yml": yaml.safe_dump({"argument_specs": {"main": {"short_description": "r"}}}),
        },
    }.items():
        for name, text in files.items():
            (roles / role / name).parent.mkdir(parents=True, exist_ok=True)
            (roles / role / name).write_text(text)
    return roles


def test_a_dependency_documents_what_the_role_depending_on_it_reads(tmp_path):
    assert entry_point_problems(make_shared(tmp_path, {"vllm_a": {"type": "int", "default": 1}})) == []


def test_a_dependency_option_that_no_role_reads_is_found(tmp_path):
    options = {"vllm_a": {"type": "int", "default": 1}, "vllm_b": {"type": "int", "default": 2}}
    roles = make_shared(tmp_path, options)
    (roles / "s" / "defaults" / "main.yml").write_text("vllm_a: 1\nvllm_b: 2\n")
    assert entry_point_problems(roles) == ["s main: documents vllm_b, which no role depending on it reads"]
