"""The playbooks' own variables (issue 27 item 4): one spec, one table, and a check at the start of each playbook.

A dflash_*/vllm_* variable that a playbook reads and that neither the playbook itself nor a role defines
(an option of some entry point's meta/argument_specs.yml, a fact a role sets, or a variable of its vars/) is
one of the playbook's own variables: it must be in playbooks/vars/argument_specs.yml under that playbook's
entry point, and in docs/variables.md with the same default. The names are read from the Jinja of the
playbooks (parsed, not grepped), so a variable only mentioned in a message does not count and one read as
hostvars[h].x does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import jinja2.nodes
import pytest
import yaml
from helpers.playbook import files

ROOT = Path(__file__).resolve().parents[2]
SPEC_FILE = ROOT / "playbooks" / "vars" / "argument_specs.yml"
TABLE_FILE = ROOT / "docs" / "variables.md"
# playbook -> its entry point in SPEC_FILE; the task file every playbook imports first is read with each.
PLAYBOOKS = {"deploy_dflash.yml": "deploy_dflash", "rollback.yml": "rollback"}
SHARED_TASKS = [ROOT / "playbooks" / "tasks" / "check_variables.yml"]
PREFIX = re.compile(r"^(dflash|vllm)_[a-z0-9_]+$")
# Keys whose value is a bare Jinja expression, not a template.
CONDITIONALS = ("when", "that", "changed_when", "failed_when", "until")
BLOCK_KEYS = ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers")
SET_FACT = ("ansible.builtin.set_fact", "set_fact")
ENV = jinja2.Environment()


def tasks_of(node: object) -> list[dict]:
    """Plays and tasks of a playbook or task file, blocks opened up."""
    found: list[dict] = []

    def walk(items: object) -> None:
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict):
                found.append(item)
                for key in BLOCK_KEYS:
                    walk(item.get(key))

    walk(node)
    return found


def names_in_expression(expression: str) -> set[str]:
    """Variables an expression reads: its free names and the attributes it takes (hostvars[h].dflash_x)."""
    tree = ENV.parse("{{ " + expression + " }}")
    names = {node.name for node in tree.find_all(jinja2.nodes.Name) if node.ctx == "load"}
    names |= {node.attr for node in tree.find_all(jinja2.nodes.Getattr)}
    return names


def names_in_template(text: str) -> set[str]:
    tree = ENV.parse(text)
    names = {node.name for node in tree.find_all(jinja2.nodes.Name) if node.ctx == "load"}
    names |= {node.attr for node in tree.find_all(jinja2.nodes.Getattr)}
    return names


def reads_of(node: object, key: str = "") -> set[str]:
    if isinstance(node, dict):
        return {name for k, value in node.items() for name in reads_of(value, str(k))}
    if isinstance(node, list):
        return {name for item in node for name in reads_of(item, key)}
    if isinstance(node, bool) or not isinstance(node, str):
        return set()
    if key in CONDITIONALS and "{{" not in node:
        return names_in_expression(node)
    return names_in_template(node) if "{{" in node or "{%" in node else set()


def defined_by(items: list[dict]) -> set[str]:
    """What plays and tasks define themselves: vars, registers, set_fact keys, loop vars."""
    found: set[str] = set()
    for item in items:
        found |= set(item.get("vars") or {})
        if "register" in item:
            found.add(item["register"])
        for key in SET_FACT:
            if isinstance(item.get(key), dict):
                found |= set(item[key]) - {"cacheable"}
        found.add((item.get("loop_control") or {}).get("loop_var", "item"))
    return found


def role_names(root: Path = ROOT) -> set[str]:
    """Every option of every role entry point, every fact a role sets and the register of an entry point that is one
    task (its outputs: tests/unit/roles/test_role_contracts.py), and every variable of a role's vars/ (the deploy's
    look reads the roles' derived paths and speculative input for its templates)."""
    found: set[str] = set()
    for specs in (root / "roles").glob("*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(specs.read_text())["argument_specs"].values():
            found |= set(entry.get("options") or {})
    for task_file in (root / "roles").glob("*/tasks/*.yml"):
        items = tasks_of(yaml.safe_load(task_file.read_text()))
        found |= {key for item in items for fact in SET_FACT if isinstance(item.get(fact), dict) for key in item[fact]}
        if len(items) == 1 and "register" in items[0]:
            found.add(items[0]["register"])
    for role_vars in (root / "roles").glob("*/vars/*.yml"):
        found |= set(yaml.safe_load(role_vars.read_text()) or {})
    return found


def own_variables(playbook: Path, shared: tuple[Path, ...] = tuple(SHARED_TASKS), root: Path = ROOT) -> set[str]:
    """The dflash_*/vllm_* variables a playbook reads that nothing but the playbook's user defines."""
    # The playbook, the task files its plays include (the deploy's build and rollout) and the shared check.
    paths = dict.fromkeys([*files(playbook.name, playbook.parent), *shared])
    documents = [yaml.safe_load(path.read_text()) for path in paths]
    items = [item for document in documents for item in tasks_of(document)]
    reads = {name for document in documents for name in reads_of(document)}
    return {name for name in reads - defined_by(items) - role_names(root) if PREFIX.match(name)}


def spec_options(entry: str) -> dict:
    return yaml.safe_load(SPEC_FILE.read_text())["argument_specs"][entry]["options"]


def table_rows() -> dict[tuple[str, str], str]:
    """(variable, playbook entry) -> the default cell of docs/variables.md's table."""
    rows = {}
    for line in TABLE_FILE.read_text().splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if line.startswith("| `") and len(cells) >= 5:
            entry = {"deploy": "deploy_dflash", "rollback": "rollback"}[cells[1]]
            rows[(cells[0].strip("`"), entry)] = cells[3]
    return rows


@pytest.mark.parametrize(("playbook", "entry"), sorted(PLAYBOOKS.items()))
def test_the_spec_declares_exactly_the_variables_the_playbook_reads(playbook, entry):
    assert own_variables(ROOT / "playbooks" / playbook) == set(spec_options(entry))


def test_the_table_has_every_variable_of_the_spec_with_its_default():
    expected = {(name, entry) for entry in PLAYBOOKS.values() for name in spec_options(entry)}
    rows = table_rows()
    assert set(rows) == expected
    for (name, entry), cell in rows.items():
        option = spec_options(entry)[name]
        if "default" in option:
            assert yaml.safe_load(cell.strip("`")) == option["default"], name
        else:
            assert cell.startswith("("), f"{name}: no default in the spec, so the table says what applies instead"


DEFAULT_CALL = re.compile(r"\b((?:dflash|vllm)_[a-z0-9_]+) \| default\(((?:[^()]|\([^()]*\))*?)(?:, true)?\)")


@pytest.mark.parametrize(("playbook", "entry"), sorted(PLAYBOOKS.items()))
def test_the_defaults_the_playbook_applies_are_the_spec_s(playbook, entry):
    options = spec_options(entry)
    applied = DEFAULT_CALL.findall("\n".join(path.read_text() for path in files(playbook)))
    checked = [name for name, _literal in applied if name in options and "default" in options[name]]
    assert checked  # the pattern finds the playbook's defaults at all
    for name, literal in applied:
        if name in options and "default" in options[name]:
            assert yaml.safe_load(literal) == options[name]["default"], f"{playbook}: {name} | default({literal})"


def test_the_check_finds_a_variable_the_playbook_reads_undeclared(tmp_path):
    (tmp_path / "roles" / "r" / "meta").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "meta" / "argument_specs.yml").write_text(
        "argument_specs: {main: {options: {vllm_root: {type: path}}}}\n"
    )
    playbook = tmp_path / "p.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "all",
                    "vars": {"dflash_mine": "{{ vllm_root }}"},
                    "tasks": [
                        {"debug": {"msg": "set dflash_only_in_prose to fix it"}, "when": "dflash_new_knob | bool"},
                        {"debug": {"msg": "{{ hostvars[item].dflash_per_host | default(1) }} {{ dflash_mine }}"}},
                        {"set_fact": {"dflash_fact": 1}, "register": "dflash_registered"},
                        {"debug": {"msg": "{{ dflash_fact }} {{ dflash_registered }}"}},
                    ],
                }
            ]
        )
    )
    assert own_variables(playbook, shared=(), root=tmp_path) == {"dflash_new_knob", "dflash_per_host"}


def test_each_playbook_checks_its_variables_first():
    for playbook, entry in PLAYBOOKS.items():
        first = yaml.safe_load((ROOT / "playbooks" / playbook).read_text())[0]
        task = first["tasks"][0]
        assert task["ansible.builtin.import_tasks"] == "tasks/check_variables.yml"
        assert task["vars"] == {"dflash_playbook_entry": entry}
        assert task["run_once"] is True  # a failure there fails every host of the play
        assert task["tags"] == ["always"]  # under any --tags


# ------------------------------------------------------------------ the check, run by ansible-playbook


def run_check(tmp_path: Path, playbook: str, extra: dict) -> subprocess.CompletedProcess:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump({"gpu_hosts": {"hosts": {"gpu1": {}, "gpu2": {}}, "vars": {"ansible_connection": "local"}}})
    )
    # Only the first play, the one with the check: a wrong value must stop the playbook there.
    first = yaml.safe_load((ROOT / "playbooks" / playbook).read_text())[0]
    first["tasks"] = [
        *first["tasks"][:1],
        {"name": "Past the check", "ansible.builtin.debug": {"msg": "PAST THE CHECK"}},
    ]
    (tmp_path / "tasks").mkdir()
    (tmp_path / "vars").mkdir()
    (tmp_path / "tasks" / "check_variables.yml").write_text(SHARED_TASKS[0].read_text())
    (tmp_path / "vars" / "argument_specs.yml").write_text(SPEC_FILE.read_text())
    (tmp_path / "play.yml").write_text(yaml.safe_dump([first]))
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inventory),
            str(tmp_path / "play.yml"),
            "-e",
            yaml.safe_dump(extra, default_flow_style=True),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("playbook", "extra", "message"),
    [
        (
            "deploy_dflash.yml",
            {"dflash_wheel_distribution": "scp"},
            "dflash_wheel_distribution must be one of: peer, controller",
        ),
        ("deploy_dflash.yml", {"dflash_skip_unchanged": "maybe"}, "argument 'dflash_skip_unchanged' is of type str"),
        ("deploy_dflash.yml", {"dflash_serial": [1, "x"]}, 'dflash_serial=[1, "x"] is not a batch size'),
        ("rollback.yml", {"dflash_serial": "0%"}, 'dflash_serial="0%" is not a batch size'),
    ],
)
def test_a_wrong_value_stops_the_playbook_at_the_check(tmp_path, playbook, extra, message):
    proc = run_check(tmp_path, playbook, extra)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stdout + proc.stderr
    assert "PAST THE CHECK" not in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("playbook", "extra"),
    [
        ("deploy_dflash.yml", {}),
        ("deploy_dflash.yml", {"dflash_serial": [1, "25%", "100%"], "dflash_wheel_distribution": "controller"}),
        ("rollback.yml", {"dflash_serial": "50%", "vllm_rollback_release": "0123456789ab-deadbeef"}),
    ],
)
def test_good_values_pass_the_check(tmp_path, playbook, extra):
    proc = run_check(tmp_path, playbook, extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PAST THE CHECK") == 2  # both hosts go on
