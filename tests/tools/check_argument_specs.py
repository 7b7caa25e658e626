"""Fail when a role's meta/argument_specs.yml and defaults/main.yml disagree, or two roles on a shared name.

Every default must be documented with the same default value, and every documented option that has a
default must be in defaults/main.yml (the prometheus-community/ansible convention).
A name several roles take (vllm_instance, vllm_root, ...) is one variable of the play: every role must give
it the same type, default and description, so that setting it once means the same to all of them. Entry
points of one role may leave a default or the description to their main entry point.
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


SHAPE = ("type", "elements", "choices")


def shared_name_problems(roles: Path = ROLES) -> list[str]:
    """Disagreements on a name between two roles (any entry point) or two entry points of one role."""
    seen: dict[str, list[tuple[str, dict]]] = {}
    for specs_file in sorted(roles.glob("*/meta/argument_specs.yml")):
        for entry, spec in yaml.safe_load(specs_file.read_text())["argument_specs"].items():
            for name, option in (spec.get("options") or {}).items():
                seen.setdefault(name, []).append((f"{specs_file.parts[-3]} {entry}", option))
    found = []
    for name, places in sorted(seen.items()):
        (first, option), rest = places[0], places[1:]
        for where, other in rest:
            same_role = where.split()[0] == first.split()[0]
            keys = [
                k
                for k in SHAPE
                if option.get(k, "str" if k == "type" else None) != other.get(k, "str" if k == "type" else None)
            ]
            if "default" in option and "default" in other and option["default"] != other["default"]:
                keys.append("default")
            if not same_role and option.get("description") != other.get("description"):
                keys.append("description")
            if not same_role and ("default" in option) != ("default" in other):
                keys.append("default")
            found += [f"{name}: {first} and {where} give it different {key}s" for key in keys]
    return found


def main() -> int:
    found = [p for role in sorted(ROLES.iterdir()) if role.is_dir() for p in problems_for(role)]
    found += shared_name_problems()
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
