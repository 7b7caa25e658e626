"""One meaning per shared role variable (issue 18 item 4): tests/tools/check_argument_specs.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

TOOL = Path(__file__).resolve().parents[2] / "tools" / "check_argument_specs.py"
SPEC = importlib.util.spec_from_file_location("check_argument_specs", TOOL)
assert SPEC and SPEC.loader
check = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check)


def write_role(roles: Path, role: str, specs: dict) -> None:
    (roles / role / "meta").mkdir(parents=True)
    (roles / role / "meta" / "argument_specs.yml").write_text(yaml.safe_dump({"argument_specs": specs}))


def test_the_roles_agree_on_every_shared_name():
    assert check.shared_name_problems() == []


ROOT = {"type": "path", "default": "/opt/vllm", "description": "Root."}


@pytest.mark.parametrize(
    ("other", "key"),
    [
        ({**ROOT, "default": "/srv/vllm"}, "default"),
        ({**ROOT, "type": "str"}, "type"),
        ({**ROOT, "description": "Root of the releases."}, "description"),
        ({k: v for k, v in ROOT.items() if k != "default"}, "default"),
    ],
    ids=["default", "type", "description", "no-default"],
)
def test_two_roles_that_disagree_fail(tmp_path, other, key):
    write_role(tmp_path, "a", {"main": {"options": {"vllm_root": ROOT}}})
    write_role(tmp_path, "b", {"main": {"options": {"vllm_root": other}}})
    assert check.shared_name_problems(tmp_path) == [f"vllm_root: a main and b main give it different {key}s"]


def test_an_entry_point_may_leave_the_default_and_description_to_main(tmp_path):
    short = {"type": "path", "description": "Where."}
    write_role(tmp_path, "a", {"main": {"options": {"vllm_root": ROOT}}, "server": {"options": {"vllm_root": short}}})
    assert check.shared_name_problems(tmp_path) == []
    write_role(tmp_path, "b", {"server": {"options": {"vllm_root": {**short, "type": "str"}}}})
    assert check.shared_name_problems(tmp_path) == [
        "vllm_root: a main and b server give it different types",
        "vllm_root: a main and b server give it different descriptions",
        "vllm_root: a main and b server give it different defaults",
    ]


def test_a_renamed_default_is_held_to_its_literal(tmp_path):
    """`new: "{{ old | default(<literal>) }}"` honours the old name; the literal is the documented default."""
    spec = {"main": {"options": {"r_new": {"type": "int", "default": 3}, "r_old": {"type": "int"}}}}
    write_role(tmp_path, "r", spec)
    (tmp_path / "r" / "defaults").mkdir()
    (tmp_path / "r" / "defaults" / "main.yml").write_text('r_new: "{{ r_old | default(3) }}"\n')
    assert check.problems_for(tmp_path / "r") == []
    (tmp_path / "r" / "defaults" / "main.yml").write_text('r_new: "{{ r_old | default(4) }}"\n')
    assert check.problems_for(tmp_path / "r") == ["r: r_new default '{{ r_old | default(4) }}' != argument_specs 3"]
