"""A role or playbook default that feeds a module option is the module's default (issue 29 item 2).

Which variable feeds which option is read from the task files (parsed YAML, not grepped): a module task's
argument, or a module_defaults entry (a group of meta/runtime.yml feeds each of its modules), whose value is
the bare variable (`{{ vllm_root }}`) or the variable unless it is empty or undefined (`| default(omit)`,
`VAR if VAR else omit`). Each value written for such a variable - roles/*/defaults/main.yml, every entry
point's meta/argument_specs.yml default, a literal `VAR | default(x)` or `vars:` in playbooks/, the
playbooks' argument specs and docs/variables.md - must equal the option's default in the argument spec the
module builds, unless it is empty where empty omits the option, or the role chooses another on purpose
(CHOSEN, each with its reason). Reads whatever roles exist: no role or variable name is listed here
except the chosen ones.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import jinja2
import jinja2.nodes
import pytest
import yaml
from helpers.module_options import MODULES, argument_spec

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "vllm_ops.dflash."
BLOCK_KEYS = ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers")
_VAR = r"([a-z_][a-z0-9_]*)"
DIRECT = re.compile(r"^\{\{\s*" + _VAR + r"\s*\}\}$")
# The option is left out when the variable is empty: the module's own default applies then.
OMIT_EMPTY = re.compile(
    r"^\{\{\s*" + _VAR + r"\s*(?:\|\s*default\(\s*omit\s*,\s*true\s*\)|\s+if\s+\1\b[^{}]*\belse\s+omit)\s*\}\}$"
)
# Left out only when undefined: a defined value, empty or not, is passed.
OMIT_UNDEFINED = re.compile(r"^\{\{\s*" + _VAR + r"\s*\|\s*default\(\s*omit\s*\)\s*\}\}$")
# A renamed role default that honours its deprecated old name: `new: "{{ old | default(<literal>) }}"`.
RENAMED = re.compile(r"^\{\{\s*" + _VAR + r"\s*\|\s*default\((?!\s*omit\b).*\)\s*\}\}$", re.DOTALL)
ENV = jinja2.Environment()

# (variable, module, option) -> why the role's default is not the module's.
CHOSEN: Dict[Tuple[str, str, str], str] = {
    ("dflash_gate_timeout", "acceptance_gate", "timeout"): (
        "the role gates a server that just started: its first completions compile graphs and take longer "
        "than the module's per-request default allows"
    ),
}


@dataclass(frozen=True)
class Feed:
    var: str
    module: str
    option: str
    omits_empty: bool
    where: str


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def task_files(root: Path) -> List[Path]:
    patterns = ("roles/*/tasks/*.yml", "roles/*/handlers/*.yml", "playbooks/*.yml", "playbooks/tasks/*.yml")
    return sorted(path for pattern in patterns for path in root.glob(pattern))


def _nodes(items: Any) -> Iterator[Dict[str, Any]]:
    """Plays, blocks and tasks, blocks opened up."""
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            yield item
            for key in BLOCK_KEYS:
                yield from _nodes(item.get(key))


def _feeds_of(args: Any, modules: List[str], where: str) -> Iterator[Feed]:
    for option, value in (args or {}).items() if isinstance(args, dict) else ():
        text = value.strip() if isinstance(value, str) else ""
        for pattern, omits_empty in ((DIRECT, False), (OMIT_EMPTY, True), (OMIT_UNDEFINED, False)):
            match = pattern.match(text)
            if match:
                for module in modules:
                    yield Feed(match.group(1), module, option, omits_empty, where)
                break


def _aliases(root: Path) -> Dict[str, str]:
    """X -> Y for each `X: "{{ Y }}"` of role defaults, role vars and `vars:` of the task files: Y feeds X's."""
    found: Dict[str, str] = {}
    mappings = [_yaml(path) for path in sorted(root.glob("roles/*/defaults/main.yml"))]
    mappings += [_yaml(path) for path in sorted(root.glob("roles/*/vars/*.yml"))]
    mappings += [node.get("vars") for path in task_files(root) for node in _nodes(_yaml(path))]
    for mapping in mappings:
        for var, value in mapping.items() if isinstance(mapping, dict) else ():
            match = (DIRECT.match(value.strip()) or RENAMED.match(value.strip())) if isinstance(value, str) else None
            if match and match.group(1) != var:
                found[var] = match.group(1)
    return found


def feeds(root: Path = ROOT) -> List[Feed]:
    """Every variable -> module option the task files pass on as it is, through aliases too."""
    groups = (_yaml(root / "meta" / "runtime.yml") or {}).get("action_groups") or {}
    found: List[Feed] = []
    for path in task_files(root):
        where = str(path.relative_to(root))
        for node in _nodes(_yaml(path)):
            for key, args in (node.get("module_defaults") or {}).items():
                if key.startswith("group/" + PREFIX):
                    members = [m.rsplit(".", 1)[-1] for m in groups.get(key[len("group/" + PREFIX) :], [])]
                    found += _feeds_of(args, members, where)
                elif key.startswith(PREFIX):
                    found += _feeds_of(args, [key[len(PREFIX) :]], where)
            for key, args in node.items():
                if key.startswith(PREFIX) and key[len(PREFIX) :] in MODULES:
                    found += _feeds_of(args, [key[len(PREFIX) :]], where)
    aliases = _aliases(root)
    for feed in list(found):
        seen = {feed.var}
        var = feed.var
        while var in aliases and aliases[var] not in seen:  # X: "{{ Y }}", Y: "{{ Z }}" ...
            var = aliases[var]
            seen.add(var)
            found.append(Feed(var, feed.module, feed.option, feed.omits_empty, feed.where))
    return found


def _spec_defaults(specs: Any, where: str) -> Iterator[Tuple[str, Any, str]]:
    for entry, spec in ((specs or {}).get("argument_specs") or {}).items():
        for var, option in (spec.get("options") or {}).items():
            if "default" in option:
                yield var, option["default"], f"{where} {entry}"


def _literal_defaults(node: Any, where: str) -> Iterator[Tuple[str, Any, str]]:
    """`VAR | default(literal)` anywhere in the templates of a parsed file."""
    if isinstance(node, dict):
        for value in node.values():
            yield from _literal_defaults(value, where)
    elif isinstance(node, list):
        for item in node:
            yield from _literal_defaults(item, where)
    elif isinstance(node, str) and ("{{" in node or "{%" in node):
        for flt in ENV.parse(node).find_all(jinja2.nodes.Filter):
            named = flt.name == "default" and isinstance(flt.node, jinja2.nodes.Name)
            if named and flt.args and isinstance(flt.args[0], jinja2.nodes.Const):
                yield flt.node.name, flt.args[0].value, where


def _documented_defaults(path: Path) -> Iterator[Tuple[str, Any, str]]:
    """docs/variables.md rows: a `literal` default, or "(`module`'s own, value)"."""
    if not path.is_file():
        return
    for line in path.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not re.fullmatch(r"`[a-z0-9_]+`", cells[0]):
            continue
        own = re.fullmatch(r"\(`[a-z0-9_.]+`'s own, (.+)\)", cells[3])
        literal = re.fullmatch(r"`([^`]*)`", cells[3])
        if own or literal:
            yield cells[0].strip("`"), yaml.safe_load((own or literal).group(1)), str(path.name)


def written_defaults(root: Path = ROOT) -> List[Tuple[str, Any, str]]:
    """(variable, value, where) for every value the roles, playbooks and docs write for a variable."""
    found: List[Tuple[str, Any, str]] = []
    for path in sorted(root.glob("roles/*/defaults/main.yml")):
        found += [(var, value, str(path.relative_to(root))) for var, value in (_yaml(path) or {}).items()]
    for path in sorted(root.glob("roles/*/meta/argument_specs.yml")) + sorted(root.glob("playbooks/vars/*.yml")):
        data = _yaml(path) or {}
        where = str(path.relative_to(root))
        if "argument_specs" in data:
            found += _spec_defaults(data, where)
        else:
            found += [(var, value, where) for var, value in data.items()]
    for path in sorted(root.glob("playbooks/*.yml")) + sorted(root.glob("playbooks/tasks/*.yml")):
        where = str(path.relative_to(root))
        data = _yaml(path)
        found += _literal_defaults(data, where)
        for node in _nodes(data):
            for var, value in (node.get("vars") or {}).items() if isinstance(node.get("vars"), dict) else ():
                found.append((var, value, where))
    found += _documented_defaults(root / "docs" / "variables.md")
    # A template is no literal default: what it renders to is another variable's (an alias, checked there).
    return [item for item in found if not (isinstance(item[1], str) and "{{" in item[1])]


def same(value: Any, default: Any, kind: str) -> bool:
    if kind in ("int", "float") and not isinstance(value, bool):
        try:
            return float(value) == float(default)
        except (TypeError, ValueError):
            return False
    if kind in ("str", "path"):
        return str(value) == str(default)
    return bool(value == default)


def disagreements(
    found_feeds: List[Feed],
    values: List[Tuple[str, Any, str]],
    specs: Mapping[str, Mapping[str, Dict[str, Any]]],
    chosen: Optional[Mapping[Tuple[str, str, str], str]] = None,
) -> List[str]:
    chosen = CHOSEN if chosen is None else chosen
    problems = []
    by_var: Dict[str, List[Feed]] = {}
    for feed in found_feeds:
        by_var.setdefault(feed.var, []).append(feed)
    for var, value, where in values:
        for option in {(feed.module, feed.option, feed.omits_empty) for feed in by_var.get(var, [])}:
            module, name, omits_empty = option
            spec = specs[module].get(name)
            if spec is None or spec.get("default") is None or (var, module, name) in chosen:
                continue  # no module default to agree with, or one the role chose against
            if omits_empty and value in ("", 0, None, [], {}):
                continue  # empty: the option is left out, the module's default applies
            if not same(value, spec["default"], spec.get("type", "str")):
                problems.append(
                    f"{where}: {var} is {value!r}, but it feeds {module} option {name}, "
                    f"whose default is {spec['default']!r}"
                )
    return sorted(set(problems))


@functools.lru_cache(maxsize=None)
def checkout() -> Tuple[List[Feed], List[Tuple[str, Any, str]], Dict[str, Dict[str, Dict[str, Any]]]]:
    """This checkout's feeds, written values and module specs (read once: parsing the YAML takes seconds)."""
    return feeds(), written_defaults(), {name: argument_spec(name) for name in MODULES}


def test_every_default_that_feeds_a_module_option_is_the_modules():
    assert disagreements(*checkout()) == []


def test_the_feeds_are_found_in_the_roles_and_playbooks():
    """The mapping is read, not empty: root through module_defaults, the gate's thresholds from its role."""
    found = {(feed.var, feed.module, feed.option) for feed in checkout()[0]}
    assert ("vllm_root", "vllm_release", "root") in found
    assert any(module == "acceptance_gate" and option == "min_mean_acceptance_length" for _var, module, option in found)


def test_each_chosen_difference_is_real():
    """CHOSEN lists only a variable that feeds the option and really differs from its default."""
    found_feeds, values, specs = checkout()
    found = {(feed.var, feed.module, feed.option) for feed in found_feeds}
    for key in CHOSEN:
        assert key in found, f"{key} is no feed any more: drop it from CHOSEN"
        mine = [value for value in values if value[0] == key[0]]
        assert disagreements(found_feeds, mine, specs, chosen={}), f"{key} agrees with the module now: drop it"


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


RUNTIME = "action_groups:\n  vllm_root: [vllm_release]\n"
GROUP_TASKS = """
- name: Block
  module_defaults:
    group/vllm_ops.dflash.vllm_root:
      root: "{{ vllm_root }}"
  block:
    - name: Status
      vllm_ops.dflash.vllm_release:
        keep_releases: "{{ vllm_keep | default(omit, true) }}"
"""
SPECS = {
    "vllm_release": {"root": {"type": "path", "default": "/opt/vllm"}, "keep_releases": {"type": "int", "default": 3}}
}


@pytest.mark.parametrize(
    ("where", "text", "expected"),
    [
        ("roles/a/defaults/main.yml", "vllm_root: /srv/vllm\n", "roles/a/defaults/main.yml: vllm_root is '/srv/vllm'"),
        (
            "roles/a/meta/argument_specs.yml",
            "argument_specs:\n  main:\n    options:\n      vllm_keep: {type: int, default: 5}\n",
            "roles/a/meta/argument_specs.yml main: vllm_keep is 5",
        ),
        (
            "playbooks/site.yml",
            "- hosts: all\n  vars:\n    x: \"{{ vllm_root | default('/data/vllm') }}\"\n  tasks: []\n",
            "playbooks/site.yml: vllm_root is '/data/vllm'",
        ),
        (
            "docs/variables.md",
            "| variable | playbook | type | default | what |\n|---|---|---|---|---|\n"
            "| `vllm_keep` | deploy | int | (`vllm_release`'s own, 4) | Kept. |\n",
            "variables.md: vllm_keep is 4",
        ),
        (
            "roles/b/defaults/main.yml",
            'vllm_keep: "{{ shared_keep }}"\nshared_keep: 7\n',
            "roles/b/defaults/main.yml: shared_keep is 7",
        ),
    ],
    ids=["role-default", "role-spec", "playbook", "docs", "alias"],
)
def test_a_value_that_disagrees_with_the_module_fails(tmp_path, where, text, expected):
    root = _tree(tmp_path, {"meta/runtime.yml": RUNTIME, "roles/a/tasks/main.yml": GROUP_TASKS, where: text})
    problems = disagreements(feeds(root), written_defaults(root), SPECS)
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_an_empty_value_that_omits_the_option_and_an_equal_one_pass(tmp_path):
    defaults = "vllm_root: /opt/vllm\nvllm_keep: 0\n"
    root = _tree(
        tmp_path,
        {"meta/runtime.yml": RUNTIME, "roles/a/tasks/main.yml": GROUP_TASKS, "roles/a/defaults/main.yml": defaults},
    )
    assert disagreements(feeds(root), written_defaults(root), SPECS) == []


def test_a_deprecated_old_name_feeds_what_its_new_name_feeds():
    # dflash_config_capability_probes: "{{ dflash_capability_probes | default({...}) }}" (renamed in 0.2.0)
    found = {(feed.var, feed.module, feed.option) for feed in checkout()[0]}
    assert ("dflash_config_capability_probes", "dflash_preflight", "capability_probes") in found
    assert ("dflash_capability_probes", "dflash_preflight", "capability_probes") in found
