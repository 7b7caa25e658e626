# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""meta/runtime.yml's requires_ansible admits no ansible-core that lacks a feature the code uses, the
roles say the same floor, and the ansible-core running this lane is one the collection admits
(`make unit-oldest` / `unit-newest` run this file on both ends of the range)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from ansible.release import __version__ as core_version
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
# Task keywords and actions by the ansible-core release that introduced them (its porting guide).
FEATURES = {
    r"^\s*break_when:": "2.18",  # loop_control.break_when
    r"^\s*(ansible\.builtin\.)?meta:\s*end_role\b": "2.18",
}


def requires_ansible() -> SpecifierSet:
    return SpecifierSet(yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())["requires_ansible"])


def floor() -> Version:
    (lowest,) = [Version(spec.version) for spec in requires_ansible() if spec.operator == ">="]
    return lowest


def yaml_sources():
    for folder in ("roles", "playbooks", "extensions"):
        yield from sorted((ROOT / folder).rglob("*.yml"))


def test_the_floor_admits_only_cores_with_every_feature_used():
    for path in yaml_sources():
        text = path.read_text()
        for pattern, since in FEATURES.items():
            if re.search(pattern, text, re.MULTILINE):
                assert floor() >= Version(since), f"{path.relative_to(ROOT)} uses {pattern} (ansible-core {since}+)"


def test_break_when_is_what_sets_the_floor_today():
    # A guard on the table above: it must still find the feature that made 2.18 the floor.
    hits = [p for p in yaml_sources() if re.search(r"^\s*break_when:", p.read_text(), re.MULTILINE)]
    assert hits


def test_roles_state_the_same_floor():
    for meta in sorted((ROOT / "roles").glob("*/meta/main.yml")):
        stated = Version(str(yaml.safe_load(meta.read_text())["galaxy_info"]["min_ansible_version"]))
        assert stated.release[:2] == floor().release[:2], meta


def test_the_running_core_is_admitted():
    assert Version(core_version) in requires_ansible(), f"ansible-core {core_version} is outside {requires_ansible()}"
