# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One command table for the installers a release can be built with: pip and uv.

Each step of a build (create the venv, build the wheel, install into the venv, install one wheel again) is one row per
installer; a new installer, or a changed flag, is an edit of COMMANDS and nothing else.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

__all__ = ["COMMANDS", "Installer"]

# "{name}" is replaced by a value of the same name: a string is one argument, a list its items, a bool
# the flag in FLAGS (or nothing). Extra arguments (pip_args, then the targets) follow each command.
COMMANDS: Dict[str, Dict[str, Tuple[str, ...]]] = {
    "pip": {
        "venv": ("{python}", "-m", "venv", "{system_site_packages}", "{venv}"),
        # -v: the build backend's own output (compiler lines) goes to the log and the status file live.
        "wheel": ("{venv_python}", "-m", "pip", "wheel", "-v", "--no-deps", "--wheel-dir", "{dist}", "{no_isolation}"),
        "install": ("{venv_python}", "-m", "pip", "install"),
        # The one package again, over what is installed (its dependencies are in place already).
        "reinstall": ("{venv_python}", "-m", "pip", "install", "--force-reinstall", "--no-deps"),
    },
    "uv": {
        "venv": ("{uv}", "venv", "--python", "{python}", "{system_site_packages}", "{venv}"),
        "wheel": ("{uv}", "build", "--wheel", "--python", "{venv_python}", "--out-dir", "{dist}", "{no_isolation}"),
        "install": ("{uv}", "pip", "install", "--python", "{venv_python}"),
        "reinstall": ("{uv}", "pip", "install", "--python", "{venv_python}", "--reinstall", "--no-deps"),
        # The python-only bump's dependencies (_dependency_plan; uv only): what a fresh install would get (its
        # plan, " + name==version", on stderr), exact pins over what is installed, and removals.
        "dry_run": ("{uv}", "pip", "install", "--python", "{venv_python}", "--dry-run"),
        "pinned": ("{uv}", "pip", "install", "--python", "{venv_python}", "--no-deps"),
        "uninstall": ("{uv}", "pip", "uninstall", "--python", "{venv_python}"),
    },
}
FLAGS = {"system_site_packages": "--system-site-packages", "no_isolation": "--no-build-isolation"}

Value = Union[str, bool, Sequence[str], None]


class Installer:
    """An installer (`pip` or `uv`) and, for uv, the executable that runs it."""

    def __init__(self, name: str, executable: Optional[str] = None) -> None:
        if name not in COMMANDS:
            raise ValueError(f"installer {name!r} is not one of {', '.join(COMMANDS)}")
        self.name = name
        self.executable = executable or name

    def __repr__(self) -> str:
        return f"Installer({self.name}, {self.executable})"

    def argv(self, step: str, extra: Sequence[str] = (), **values: Value) -> List[str]:
        """The command line of `step` (venv, wheel, install) with `values` filled in, then `extra`."""
        values.setdefault("uv", self.executable)
        argv: List[str] = []
        for token in COMMANDS[self.name][step]:
            if not (token.startswith("{") and token.endswith("}")):
                argv.append(token)
                continue
            name = token[1:-1]
            value = values[name]
            if isinstance(value, bool):
                argv.extend([FLAGS[name]] if value else [])
            elif isinstance(value, str):
                argv.append(value)
            elif value is not None:
                argv.extend(value)
        return argv + list(extra)
