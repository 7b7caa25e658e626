"""The cores under plugins/module_utils import each other without a cycle (every import, also in a function)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

CORES = Path(__file__).resolve().parents[4] / "plugins" / "module_utils"
PACKAGE = "ansible_collections.vllm_ops.dflash.plugins.module_utils"


def imported_cores(source: str) -> Set[str]:
    """The sibling cores a source imports: `from <package>._x import ...`, `from <package> import _x`."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(PACKAGE + "._"):
                found.add(node.module[len(PACKAGE) + 1 :].split(".")[0])
            elif node.module == PACKAGE:
                found.update(alias.name for alias in node.names if alias.name.startswith("_"))
        elif isinstance(node, ast.Import):
            found.update(
                alias.name[len(PACKAGE) + 1 :].split(".")[0]
                for alias in node.names
                if alias.name.startswith(PACKAGE + "._")
            )
    return found


def a_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import cycle of `graph` (the path, its first name again at the end), or [] when there is none."""
    state: Dict[str, int] = {}  # 1: on the path, 2: done
    path: List[str] = []

    def visit(name: str) -> List[str]:
        state[name] = 1
        path.append(name)
        for other in sorted(graph.get(name, ())):
            if state.get(other) == 1:
                return [*path[path.index(other) :], other]
            if other not in state:
                found = visit(other)
                if found:
                    return found
        path.pop()
        state[name] = 2
        return []

    for name in sorted(graph):
        if name not in state:
            found = visit(name)
            if found:
                return found
    return []


def test_the_cores_import_each_other_without_a_cycle():
    graph = {path.stem: imported_cores(path.read_text()) for path in sorted(CORES.glob("_*.py"))}
    assert len(graph) > 20  # the walk found the cores
    assert a_cycle(graph) == [], " -> ".join(a_cycle(graph))


@pytest.mark.parametrize(
    ("graph", "cycle"),
    [
        ({"_a": {"_b"}, "_b": {"_c"}, "_c": set()}, []),
        ({"_a": {"_b"}, "_b": {"_a"}}, ["_a", "_b", "_a"]),
        ({"_a": {"_b"}, "_b": {"_c"}, "_c": {"_b"}}, ["_b", "_c", "_b"]),
    ],
)
def test_a_cycle_is_found(graph, cycle):
    assert a_cycle(graph) == cycle


def test_imports_in_a_function_and_of_the_package_count():
    source = (
        f"from {PACKAGE}._common import utc_now\n"
        f"from {PACKAGE} import _git\n"
        f"def later():\n    from {PACKAGE}._release_install import install_release\n"
        "import os\n"
    )
    assert imported_cores(source) == {"_common", "_git", "_release_install"}


# What only making a release needs: vllm_build's, never in the look's payload.
BUILD_MACHINERY = {
    "_build",
    "_build_release",
    "_build_requirements",
    "_builder",
    "_dependency_plan",
    "_pep517",
    "_python_only",
    "_release_install",
    "_wheel_overlay",
    "_wheel_tags",
}


def shipped_cores(module: str) -> Set[str]:
    """The cores AnsiballZ ships with a module: every core its imports reach, as its recursive_finder walks them
    (every import, in a function or under TYPE_CHECKING too)."""
    found: Set[str] = set()
    sources = [(CORES.parent / "modules" / f"{module}.py").read_text()]
    while sources:
        for name in imported_cores(sources.pop()) - found:
            found.add(name)
            if (CORES / f"{name}.py").is_file():
                sources.append((CORES / f"{name}.py").read_text())
    return found


# What only predicting a build needs (the run in check mode) or deciding it: never in the look's payload either.
PREDICTION = {
    "_build_budget",
    "_build_decision",
    "_build_result",
    "_build_run",
    "_disk_budget",
    "_precompiled",
    "_release_plan",
    "_vendor",
    "_wheel_compat",
}


def test_the_look_ships_without_the_build_or_its_prediction():
    """vllm_drift's look runs on every host of every deploy: AnsiballZ scans and ships each core it imports, on
    the controller once per run while the other hosts wait, and each host imports them (issue 30: the build's
    cores made that scan three times a ping's; the decision's cores and packaging's tags were 40 % of the rest)."""
    shipped = shipped_cores("vllm_drift")
    assert {"_drift", "_build_lookup", "_build_options", "_git", "_releases"} <= shipped  # the walk followed the chain
    assert shipped & (BUILD_MACHINERY | PREDICTION) == set()
    assert shipped_cores("vllm_build") >= BUILD_MACHINERY | PREDICTION  # the names are the build's
