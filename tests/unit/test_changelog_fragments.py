"""Changelog fragments as antsibull-changelog wants them: it lists new modules and roles itself."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

FRAGMENTS = Path(__file__).resolve().parents[2] / "changelogs" / "fragments"
MODULES = {p.stem for p in (FRAGMENTS.parents[1] / "plugins" / "modules").glob("*.py")}
# "<module> - new module..." (the ansible-test docs: new plugins are found from version_added, never a fragment)
NEW_MODULE = re.compile(r"^\s*(\S+)\s+-\s+new\s+module\b", re.IGNORECASE)


def test_no_fragment_announces_a_new_module():
    announced = []
    for fragment in sorted(FRAGMENTS.glob("*.yml")):
        for section, entries in (yaml.safe_load(fragment.read_text()) or {}).items():
            for entry in entries or []:
                match = NEW_MODULE.match(entry)
                if match and match.group(1) in MODULES:
                    announced.append(f"{fragment.name} ({section}): {match.group(1)}")
    assert announced == [], "antsibull-changelog adds new modules from version_added: " + ", ".join(announced)
