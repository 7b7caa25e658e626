"""Fail when a role's meta/argument_specs.yml and defaults/main.yml disagree, or two roles on a shared name.

Every default must be documented with the same default value, and every documented option that has a
default must be in defaults/main.yml (the prometheus-community/ansible convention).
A name several roles take (vllm_instance, vllm_root, ...) is one variable of the play, documented and
defaulted once, in the role `vllm` the others depend on (meta/main.yml): an entry point's reads may be
documented by its role's dependencies, and each option of a dependency must be read by a role depending on it.
Should two roles document one name anyway, both must give it the same type, default and description, so that
setting it once means the same to all of them. Entry points of one role may leave a default or the
description to their main entry point.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import jinja2
import jinja2.nodes
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
# `new: "{{ old | default(<literal>) }}"`: a renamed variable that still honours its deprecated old name; the
# literal is its default (what argument_specs documents), the old name an option of its own.
RENAMED = re.compile(r"^\{\{\s*([a-z_][a-z0-9_]*)\s*\|\s*default\((.*)\)\s*\}\}$", re.DOTALL)


def renamed(value: object) -> tuple[str, object] | None:
    """(old name, default) of a default that honours a deprecated name, else None."""
    match = RENAMED.match(value.strip()) if isinstance(value, str) else None
    return (match.group(1), yaml.safe_load(match.group(2))) if match else None


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
        elif specs[name].get("default") != (renamed(value) or (None, value))[1]:
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


# ------------------------------------------------------------------ what each entry point reads

PREFIX = re.compile(r"^(vllm|dflash)_[a-z0-9_]+$")
CONDITIONALS = ("when", "that", "changed_when", "failed_when", "until")
BLOCK_KEYS = ("block", "rescue", "always")
SET_FACT = ("ansible.builtin.set_fact", "set_fact")
INCLUDES = ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks", "include_tasks", "import_tasks")
TEMPLATE_MODULES = ("ansible.builtin.template", "template")
TEMPLATE_LOOKUP = re.compile(r"lookup\(\s*['\"](?:ansible\.builtin\.)?template['\"]\s*,\s*['\"]([^'\"]+)['\"]")
JINJA = jinja2.Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])


def _tasks(items: object) -> list[dict]:
    found: list[dict] = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            found.append(item)
            for key in BLOCK_KEYS:
                found += _tasks(item.get(key))
    return found


def _names(template: str) -> set[str]:
    """Variables a template reads: free names and attributes taken (hostvars[h].x), less its own {% set %}s."""
    tree = JINJA.parse(template)
    stored = {node.name for node in tree.find_all(jinja2.nodes.Name) if node.ctx in ("store", "param")}
    loaded = {node.name for node in tree.find_all(jinja2.nodes.Name) if node.ctx == "load"}
    return (loaded - stored) | {node.attr for node in tree.find_all(jinja2.nodes.Getattr)}


def _reads(node: object, key: str = "") -> set[str]:
    if isinstance(node, dict):
        return {name for k, value in node.items() for name in _reads(value, str(k))}
    if isinstance(node, list):
        return {name for item in node for name in _reads(item, key)}
    if not isinstance(node, str):
        return set()
    if key in CONDITIONALS and "{{" not in node:
        return _names("{{ " + node + " }}")
    return _names(node) if "{{" in node or "{%" in node else set()


def _text_templates(node: object) -> set[str]:
    """Template files a task renders: template's src, lookup('template', '<file>')."""
    if isinstance(node, dict):
        return {name for value in node.values() for name in _text_templates(value)}
    if isinstance(node, list):
        return {name for item in node for name in _text_templates(item)}
    return set(TEMPLATE_LOOKUP.findall(node)) if isinstance(node, str) else set()


def role_outputs(roles: Path = ROLES) -> set[str]:
    """Facts any role sets (its outputs, an input of another entry point, never an option)."""
    return {
        name
        for task_file in roles.glob("*/tasks/*.yml")
        for task in _tasks(yaml.safe_load(task_file.read_text()))
        for module in SET_FACT
        if isinstance(task.get(module), dict)
        for name in task[module]
    }


def _defaults(role: Path) -> dict:
    defaults_file = role / "defaults" / "main.yml"
    return (yaml.safe_load(defaults_file.read_text()) or {}) if defaults_file.exists() else {}


def dependencies(role: Path) -> list[Path]:
    """The roles of this collection that meta/main.yml names as dependencies (FQCN or short name)."""
    meta = role / "meta" / "main.yml"
    listed = (yaml.safe_load(meta.read_text()) or {}).get("dependencies") or [] if meta.exists() else []
    names = [(item.get("role") or item.get("name")) if isinstance(item, dict) else item for item in listed]
    return [role.parent / name.split(".")[-1] for name in names]


def _main_options(role: Path) -> dict:
    specs_file = role / "meta" / "argument_specs.yml"
    if not specs_file.exists():
        return {}
    return yaml.safe_load(specs_file.read_text())["argument_specs"].get("main", {}).get("options") or {}


def role_internal(role: Path) -> set[str]:
    """What the role's own tasks define, in any of its task files: registers, set_fact keys, task and include
    vars, loop vars, and the template_vars of its template lookups. State between its entry points (a register
    of serving_check that serving_record reads), never an option."""
    found: set[str] = set()
    for task_file in (role / "tasks").glob("*.yml"):
        for task in _tasks(yaml.safe_load(task_file.read_text())):
            found |= set(task.get("vars") or {})
            found |= {task["register"]} if "register" in task else set()
            found.add((task.get("loop_control") or {}).get("loop_var", "item"))
            for module in SET_FACT:
                found |= set(task.get(module) or {}) if isinstance(task.get(module), dict) else set()
    for path in [*(role / "tasks").glob("*.yml"), *(role / "vars").glob("*.yml")]:
        for passed in re.findall(r"template_vars=\{([^}]*)\}", path.read_text()):
            found |= set(re.findall(r"['\"](\w+)['\"]\s*:", passed))
    return found


def entry_point_reads(role: Path, entry: str, outputs: set[str]) -> set[str]:
    """The role-prefixed variables the entry point's tasks read, the files they include and the templates they
    render followed, through the role's vars/main.yml and defaults/main.yml expressions; less what the role's
    tasks define (role_internal) and what a role outputs."""
    # A dependency's vars/main.yml is the role's too (Ansible combines them): vllm_kept_files, vllm_model_name.
    role_vars = {
        name: value
        for source in [*dependencies(role), role]
        if (source / "vars" / "main.yml").exists()
        for name, value in (yaml.safe_load((source / "vars" / "main.yml").read_text()) or {}).items()
    }
    defaults = {**{k: v for dep in dependencies(role) for k, v in _defaults(dep).items()}, **_defaults(role)}
    reads: set[str] = set()
    defined = role_internal(role)
    pending, seen = [role / "tasks" / f"{entry}.yml"], set()
    while pending:
        path = pending.pop()
        if path in seen or not path.exists():
            continue
        seen.add(path)
        if path.suffix == ".j2":
            reads |= _names(path.read_text())
            continue
        document = yaml.safe_load(path.read_text())
        reads |= _reads(document)
        for task in _tasks(document):
            for module in INCLUDES:
                target = task.get(module)
                target = target.get("file") if isinstance(target, dict) else target
                if isinstance(target, str) and "{{" not in target:
                    pending.append(role / "tasks" / target)
            for module in TEMPLATE_MODULES:
                if isinstance(task.get(module), dict) and "{{" not in str(task[module].get("src", "{{")):
                    pending.append(role / "templates" / task[module]["src"])
        pending += [role / "templates" / name for name in _text_templates(document)]
    # A role variable or default read is an expression read too (vars/main.yml is the role's own, not an option).
    followed: set[str] = set()
    while True:
        more = {
            name
            for var in (reads - followed) & (set(role_vars) | set(defaults))
            for name in _reads(role_vars.get(var, defaults.get(var)))
            | {
                t
                for template in _text_templates(role_vars.get(var, ""))
                for t in _names((role / "templates" / template).read_text())
            }
        }
        followed |= (reads - followed) & (set(role_vars) | set(defaults))
        if more <= reads:
            break
        reads |= more
    return {name for name in reads - defined - set(role_vars) - outputs if PREFIX.match(name)}


def entry_point_problems(roles: Path = ROLES) -> list[str]:
    """An entry point that reads an option its meta/argument_specs.yml does not document, or documents one no
    task of it reads."""
    outputs = role_outputs(roles)
    found = []
    read_through: dict[Path, set[str]] = {}  # a dependency's options, as read by the roles depending on it
    for specs_file in sorted(roles.glob("*/meta/argument_specs.yml")):
        role = specs_file.parents[1]
        inherited = {name for dep in dependencies(role) for name in _main_options(dep)}
        for entry, spec in yaml.safe_load(specs_file.read_text())["argument_specs"].items():
            reads = entry_point_reads(role, entry, outputs)
            for dep in dependencies(role):
                read_through.setdefault(dep, set()).update(reads & set(_main_options(dep)))
            documented = set(spec.get("options") or {})
            reads -= inherited - documented
            # main documents every default (problems_for), read by main or only by another entry point
            defaults = _defaults(role) if entry == "main" else {}
            old_names = {old for value in defaults.values() for old, _new in [renamed(value) or (None, None)] if old}
            unread = documented - reads - set(defaults) - old_names
            found += [
                f"{role.name} {entry}: reads {name}, which its argument_specs do not document"
                for name in sorted(reads - documented)
            ]
            found += [
                f"{role.name} {entry}: documents {name}, which none of its tasks reads" for name in sorted(unread)
            ]
    for dep, reads in sorted(read_through.items()):
        found += [
            f"{dep.name} main: documents {name}, which no role depending on it reads"
            for name in sorted(set(_main_options(dep)) - reads)
        ]
    return found


def main() -> int:
    found = [p for role in sorted(ROLES.iterdir()) if role.is_dir() for p in problems_for(role)]
    found += shared_name_problems()
    found += entry_point_problems()
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
