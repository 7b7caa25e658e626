"""vllm_install's drift look names the release with the same build options as the role's own lookup.

A build option passed to the lookup but not to vllm_drift would make the look name another release, so
every re-run would take the full path; this keeps the two task files in step.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build import BUILD_ARGUMENT_SPEC

TASKS = Path(__file__).resolve().parents[3] / "roles" / "vllm_install" / "tasks"
# Options of the lookup that only an install from the fleet's wheel sets (the look asks about the build).
# how a given wheel is installed and checked (wheel_sha256: the copy must have the build's), not which release it is
INSTALL_ONLY = {"wheel", "wheel_precompiled", "wheel_precompiled_reason", "wheel_sha256"}


def _args(path: Path, name: str, module: str) -> dict:
    """The task's options for `module`, with what its blocks' module_defaults give it (root)."""

    def walk(tasks: list, defaults: dict) -> dict | None:
        for task in tasks:
            given = {**defaults, **task.get("module_defaults", {}).get("group/vllm_ops.dflash.vllm_root", {})}
            if task.get("name") == name:
                return {**given, **task[module]}
            for key in ("block", "rescue", "always"):
                found = walk(task.get(key, []), given)
                if found is not None:
                    return found
        return None

    found = walk(yaml.safe_load(path.read_text()), {})
    assert found is not None, f"{path.name} has no task {name!r}"
    return found


def test_the_look_passes_every_build_option_of_the_lookup():
    lookup = _args(
        TASKS / "main.yml", "Look the release up (nothing is built or written)", "vllm_ops.dflash.vllm_build"
    )
    drift = _args(TASKS / "drift.yml", "Would a deploy change this host", "vllm_ops.dflash.vllm_drift")
    # the options that name a release (vllm_build's other options, keep_releases and run_id, do not)
    shared = {key: value for key, value in lookup.items() if key in BUILD_ARGUMENT_SPEC and key not in INSTALL_ONLY}
    assert len(shared) == len(BUILD_ARGUMENT_SPEC) - len(INSTALL_ONLY)
    assert {key: drift.get(key) for key in shared} == shared
