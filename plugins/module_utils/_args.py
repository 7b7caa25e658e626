# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The option families several modules share: one argument spec each (community.docker's DOCKER_COMMON_ARGS).

The one rule for defaults in this collection: a default is a Python value written once, in a core - here for
the options several modules share, else the core's own dataclass field (GateSettings, RelativeRules, Need)
- and every argument spec reads it from there. The doc fragment `vllm_ops.dflash.common` (and a module's own
DOCUMENTATION) repeats it as literal YAML, as ansible-test wants; tests/unit/plugins/module_utils/test_args.py
keeps the two equal, and tests/unit/test_option_defaults.py the roles, playbooks and docs that feed them.

Standard library only: this runs on the target host's system Python (3.8+).
"""

from __future__ import annotations

from typing import Any, Dict

__all__ = [
    "DISK_BUDGET_ARGS",
    "DISK_BUDGET_GB",
    "INSTALLER",
    "INSTALLERS",
    "INSTALLER_ARGS",
    "INSTANCE",
    "INSTANCE_ARGS",
    "KEEP_RELEASES",
    "KEEP_RELEASES_ARGS",
    "LOOK_ARGS",
    "PYTHON",
    "ROOT",
    "ROOT_ARGS",
]

ROOT = "/opt/vllm"
INSTANCE = "default"
PYTHON = "python3"
INSTALLERS = ("auto", "uv", "pip")
INSTALLER = "auto"
KEEP_RELEASES = 3
DISK_BUDGET_GB = None  # unbounded: nothing is freed for space

Spec = Dict[str, Dict[str, Any]]

# The release tree on the host: every module that reads or writes releases/, current, state.json, the lock.
ROOT_ARGS: Spec = {"root": {"type": "path", "default": ROOT}}
# The vLLM instance (its unit, config, lock); one host may serve several.
INSTANCE_ARGS: Spec = {"instance": {"type": "str", "default": INSTANCE}}
# What makes a release's venv: the interpreter and the installer (vllm_build, vllm_drift, vllm_prerequisites).
INSTALLER_ARGS: Spec = {
    "python": {"type": "str", "default": PYTHON},
    "installer": {"type": "str", "choices": list(INSTALLERS), "default": INSTALLER},
}
# How many releases outlive a build or a prune, besides the current and previous ones.
KEEP_RELEASES_ARGS: Spec = {"keep_releases": {"type": "int", "default": KEEP_RELEASES}}
# The most the root may hold (vllm_build, vllm_release prune): the oldest caches, mirrors, wheels and releases go.
DISK_BUDGET_ARGS: Spec = {"disk_budget_gb": {"type": "float", "default": DISK_BUDGET_GB}}
# What vllm_drift's action plugin takes on the controller (the module alone refuses them), so the action and the
# module's docs read one spec: the templates it renders and hashes, and the refusals of the roles' own checks.
LOOK_ARGS: Spec = {
    "refusals": {"type": "list", "elements": "str", "default": []},
    "templates": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {
            "src": {"type": "str", "required": True},
            "role": {"type": "str"},
            "path": {"type": "path", "required": True},
            "vars": {"type": "dict", "default": {}},
            "mode": {"type": "str"},
            "owner": {"type": "str"},
            "group": {"type": "str"},
            "input_extra": {"type": "str", "default": ""},
            "input_record": {"type": "path"},
        },
    },
}
