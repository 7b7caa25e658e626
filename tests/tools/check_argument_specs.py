"""Fail when a role's meta/argument_specs.yml and defaults/main.yml disagree.

Every default must be documented with the same default value, and every documented option that has a
default must be in defaults/main.yml (the prometheus-community/ansible convention).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"


def problems_for(role: Path) -> list[str]:
    defaults_file = role / "defaults" / "main.yml"
    specs_file = role / "meta" / "argument_specs.yml"
    if not specs_file.exists():
        return [f"{role.name}: meta/argument_specs.yml is missing"]
    defaults = (yaml.safe_load(defaults_file.read_text()) or {}) if defaults_file.exists() else {}
    specs = yaml.safe_load(specs_file.read_text())["argument_specs"]["main"].get("options", {})
    found = []
    for name, value in defaults.items():
        if name not in specs:
            found.append(f"{role.name}: default {name} is not documented in argument_specs")
        elif specs[name].get("default") != value:
            found.append(f"{role.name}: {name} default {value!r} != argument_specs {specs[name].get('default')!r}")
    for name, spec in specs.items():
        if "default" in spec and name not in defaults:
            found.append(f"{role.name}: argument_specs gives {name} a default that defaults/main.yml lacks")
    return found


def main() -> int:
    found = [p for role in sorted(ROLES.iterdir()) if role.is_dir() for p in problems_for(role)]
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
