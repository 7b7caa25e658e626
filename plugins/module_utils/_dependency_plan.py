# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The python-only bump's third-party dependencies, resolved now as the normal build resolves them.

The normal build installs the wheel into a new venv, so the index decides the versions of vLLM's
dependencies at build time; the bump starts from an earlier release's venv, which holds the index's
versions of then (the real-vLLM lane of 2026-12-04: httpx2 2.16.2 kept where the build got 2.17.0). So
the bump asks uv what it would install into an empty venv of the same kind (its own dry run: the same
resolver, index options and system site packages as the build), and makes the bump's venv hold exactly
that: the versions that moved are installed (exact pins, no dependencies: uv writes the same files,
REQUESTED included, whichever way a package came) and the packages no longer wanted removed.
"""

from __future__ import annotations

import os
import re
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import BuildError, canonical_package
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import remove_tree_within
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import CommandResult
from ansible_collections.vllm_ops.dflash.plugins.module_utils._python_only import Refused, site_packages

if TYPE_CHECKING:
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._builder import Builder

__all__ = ["DependencyPlan", "PlanError", "difference", "installed", "planned_uv"]

# uv's dry run: " + name==version", or " + name @ <url>" for a direct reference (the wheel itself).
_UV_PLANNED = re.compile(r"^ \+ (?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:==(?P<version>\S+)| @ (?P<url>\S+))")
_WOULD_INSTALL = re.compile(r"^Would install \d+ packages?$", re.MULTILINE)


class PlanError(Refused):
    """The installer's plan cannot be read, or cannot be applied to the bump's venv: the bump is refused."""


def planned_uv(output: str) -> Dict[str, str]:
    """What `uv pip install --dry-run` would install, by canonical name: its version, or `@ <url>`."""
    found = {}
    for line in output.splitlines():
        match = _UV_PLANNED.match(line)
        if match:
            found[canonical_package(match.group("name"))] = match.group("version") or "@ " + match.group("url")
    if not found or not _WOULD_INSTALL.search(output):
        raise PlanError("uv's dry run names no package it would install: another output format")
    return found


def installed(site: str) -> Dict[str, str]:
    """The distributions a site-packages holds (their dist-info METADATA), version by canonical name."""
    found = {}
    for entry in os.listdir(site) if os.path.isdir(site) else []:
        metadata = os.path.join(site, entry, "METADATA")
        if not entry.endswith(".dist-info") or not os.path.isfile(metadata):
            continue
        fields: Dict[str, str] = {}
        with open(metadata, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break  # the headers end at the first empty line
                key, _sep, value = line.partition(":")
                fields.setdefault(key.strip().lower(), value.strip())
        if "name" in fields and "version" in fields:
            found[canonical_package(fields["name"])] = fields["version"]
    return found


def difference(
    planned: Mapping[str, str], held: Mapping[str, str], seeded: Mapping[str, str], package: str
) -> Tuple[List[str], List[str]]:
    """(pins to install, names to remove) that make `held` (the bump's venv) what a fresh install gives:
    `planned` over an empty venv holding `seeded` (what `uv venv` put there: nothing, or pip with --seed).
    The package itself is the bump's own (its version is checked, not installed here)."""
    package = canonical_package(package)
    pins = sorted(
        f"{name}=={version}" for name, version in planned.items() if name != package and held.get(name) != version
    )
    removed = sorted(
        name for name in held if name != package and name not in planned and seeded.get(name) != held[name]
    )
    return pins, removed


class DependencyPlan:
    """uv's dry run of a fresh install of `wheel` (the bump's new wheel) into an empty venv, started at once
    in a thread: the bump links its venv and checks its RECORD meanwhile (the dry run is mostly uv asking the
    index: 4.2 s of the real-vLLM bump's 7.9 s on 2026-12-06, 0.06 s offline). `settle` waits for it and
    applies it; `close` (always) waits and removes the empty venv."""

    def __init__(self, builder: Builder, wheel: str) -> None:
        self.builder = builder
        self.wheel = wheel
        self.directory = os.path.join(builder.paths.build, "dependency-plan")
        self.venv = os.path.join(self.directory, "venv")
        remove_tree_within(builder.paths.root, self.directory)
        os.makedirs(self.directory)
        builder.ready_to_run()
        self.results: List[Tuple[str, CommandResult]] = []
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="dependency-plan", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        builder, python = self.builder, os.path.join(self.venv, "bin", "python")
        steps = [
            ("creating an empty venv for the dependency plan", builder.installer.argv(
                "venv", python=builder.python, venv=self.venv, system_site_packages=builder.opts.system_site_packages,
            )),
            ("the dry run of a fresh install of the wheel",
             builder.installer.argv("dry_run", [*builder.pip_args, self.wheel], venv_python=python)),
        ]  # fmt: skip
        try:
            for what, argv in steps:
                result = builder.run_captured(argv)
                self.results.append((what, result))
                if not result.ok:
                    return
        except BaseException as exc:  # an OSError of the start, in this thread: settle raises it as a refusal
            self.error = exc

    def close(self) -> None:
        self._thread.join()
        remove_tree_within(self.builder.paths.root, self.directory)

    def _planned(self) -> Tuple[Dict[str, str], Dict[str, str]]:
        """(what a fresh install gets, what the empty venv held) once the dry run is done."""
        self._thread.join()
        for _what, result in self.results:
            self.builder.logged(result)
        if self.error is not None:
            raise PlanError(f"the dry run of a fresh install could not run: {self.error}")
        try:
            for what, result in self.results:
                self.builder.checked(what, result)
        except BuildError as exc:
            if self.builder.deadline.remaining() <= 0:
                raise
            raise PlanError(str(exc)) from exc
        return planned_uv(self.results[-1][1].stderr + self.results[-1][1].stdout), installed(site_packages(self.venv))

    def settle(self, venv: str, package: str, version: str) -> Dict[str, Any]:
        """Make the bump's `venv` hold the dependencies a fresh install of the wheel (`package` at `version`)
        gets now. Returns the record: planned (count), installed and removed (what changed). Raises PlanError
        when the plan cannot be read or applied, BuildError when the deadline ran out."""
        builder = self.builder
        planned, seeded = self._planned()
        own = planned.get(canonical_package(package))
        if own not in (version, "@ " + urllib.parse.urlunsplit(("file", "", os.path.abspath(self.wheel), "", ""))):
            raise PlanError(
                f"a fresh install of {os.path.basename(self.wheel)} would install {package} {own or 'not at all'}"
            )
        direct = sorted(
            name for name, value in planned.items() if value.startswith("@") and name != canonical_package(package)
        )
        if direct:
            raise PlanError(f"a fresh install takes {', '.join(direct)} from a URL: no version to pin")
        site = site_packages(venv)
        held = installed(site)
        pins, removed = difference(planned, held, seeded, package)
        record: Dict[str, Any] = {"planned": len(planned), "installed": pins, "removed": removed}
        if not pins and not removed:
            builder.note(f"dependency plan: the {len(planned)} packages a fresh install gets are those the venv holds")
            return record
        moved = [f"{pin} (held {held.get(pin.split('==')[0], 'none')})" for pin in pins]
        builder.note(f"dependency plan: the index moved since the earlier release: {', '.join(moved + removed)}")
        python = os.path.join(venv, "bin", "python")
        try:
            if removed:
                argv = builder.installer.argv("uninstall", removed, venv_python=python)
                builder.step("removing what a fresh install no longer gets", argv)
            if pins:
                argv = builder.installer.argv("pinned", [*builder.pip_args, *pins], venv_python=python)
                builder.step("installing the versions a fresh install gets", argv)
        except BuildError as exc:
            if builder.deadline.remaining() <= 0:
                raise
            raise PlanError(f"the dependencies that moved cannot be installed: {exc}") from exc
        now = installed(site)
        still = [p for p in pins if now.get(p.split("==")[0]) != p.split("==")[1]] + [r for r in removed if r in now]
        if still:
            raise PlanError(f"after installing them the venv still differs from the plan: {', '.join(still)}")
        return record
