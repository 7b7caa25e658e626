"""Every entry point's meta/argument_specs.yml documents every option its tasks read (issue 27 item 4).

The secondary entry points (vllm_install drift, vllm_service expected_files and ready, dflash_config
expected_files, dflash_gate rollback, serving_check, serving_record) documented 0-5 options and read up to 21:
ansible-doc showed a user a fraction of what sets them, and validation skipped the rest. The check walks an
entry point's task file, the files it includes and the templates it renders, through the role's vars/ and
defaults/ expressions, and compares the vllm_*/dflash_* names read with the options documented.
"""

from __future__ import annotations

import importlib.util
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
