# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The builder of one release attempt: each step a command under the build's deadline, logged and masked.

It makes the venv, builds the wheel (pip's isolated build, or the PEP 517 hooks of _pep517; through the
wheel overlay of _wheel_overlay when a precompiled base wheel is at hand), installs it, and takes the
credentials of pip_args off every argv. It is handed only the options it reads (BuilderOptions); what to
build and where is the run's (_build) and the release attempt's (_build_release).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import urllib.parse
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_host import no_space_hint, probe_python
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    MASK,
    PRECOMPILED_ENV,
    BuildError,
    BuildOptions,
    OptionError,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_paths import Paths
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_requirements import build_requirements
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import StatusFile
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import (
    open_private_append,
    redact_url,
    remove_tree_within,
    utc_now,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import CommandResult, Deadline
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import run as run_command
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import GitError, checkout, git_env
from ansible_collections.vllm_ops.dflash.plugins.module_utils._installer import Installer
from ansible_collections.vllm_ops.dflash.plugins.module_utils._pep517 import MARK as PEP517_MARK
from ansible_collections.vllm_ops.dflash.plugins.module_utils._pep517 import build_system
from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_overlay import (
    OverlayError,
    link_installed,
    overlay,
    stub_for,
    unpack_members,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_tags import base_tagged

__all__ = ["KILL_GRACE", "TAIL_LINES", "Builder", "BuilderOptions", "note", "single_wheel"]

TAIL_LINES = 20
KILL_GRACE = 10.0


def single_wheel(directory: str) -> Optional[str]:
    if not os.path.isdir(directory):
        return None
    wheels = sorted(f for f in os.listdir(directory) if f.endswith(".whl"))
    if len(wheels) > 1:
        raise BuildError(f"{directory} holds several wheels ({', '.join(wheels)}); keep one or remove the directory")
    return os.path.join(directory, wheels[0]) if wheels else None


def note(log_path: str, text: str) -> None:
    with open_private_append(log_path) as handle:  # 0600: a tool may echo a credential into the log
        handle.write(f"[{utc_now()}] {text}\n".encode())


class BuilderOptions(NamedTuple):
    """The options the builder's steps read; the rest of BuildOptions is the run's."""

    build_env: Mapping[str, str]
    pip_args: List[str]
    build_timeout: float
    build_isolation: bool
    system_site_packages: bool

    @classmethod
    def of(cls, opts: BuildOptions) -> BuilderOptions:
        return cls(
            dict(opts.build_env), list(opts.pip_args), opts.build_timeout, opts.build_isolation,
            opts.system_site_packages,
        )  # fmt: skip


class Builder:
    """One release attempt: every step appends to the log, shares the deadline and updates the status."""

    def __init__(
        self,
        opts: BuilderOptions,
        paths: Paths,
        deadline: Deadline,
        installer: Installer,
        python: str,
        status: StatusFile,
        added_env: Mapping[str, str],
    ) -> None:
        self.opts = opts
        self.paths = paths
        self.deadline = deadline
        self.installer = installer
        self.python = python
        self.status = status
        self.secrets = status.secrets
        env = git_env()
        for name in PRECOMPILED_ENV:
            env.pop(name, None)
        env.update(opts.build_env)
        env.update({"LC_ALL": "C", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"})
        env.update(added_env)
        env.update({"TMPDIR": paths.tmp, "TEMP": paths.tmp, "TMP": paths.tmp})
        # Credentials in pip_args' URLs never go on an argv (every local user reads it in `ps`): the URLs go
        # without them, the credentials to pip and uv through a 0600 netrc file in the build directory.
        self.pip_args, self.netrc_text = _credentials_off_argv(opts.pip_args)
        self.netrc = os.path.join(paths.build, ".netrc-credentials")
        if self.netrc_text:
            env["NETRC"] = self.netrc
        self.env = env
        # (wheel built from the stub, its placeholders, the unpacked members): set by the overlay.
        self.linkable: Optional[Tuple[str, Dict[str, Dict[str, Any]], str]] = None
        self.install_record: Dict[str, Any] = {"how": "wheel"}
        self.tags: Optional[Dict[str, Any]] = None  # the precompiled wheel's tags (_wheel_tags), when built here

    @property
    def venv_python(self) -> str:
        return os.path.join(self.paths.venv, "bin", "python")

    def note(self, text: str) -> None:
        note(self.paths.log, self.status.scrub(text))

    def step(
        self, what: str, argv: List[str], cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None
    ) -> CommandResult:
        self.ready_to_run()
        try:
            result = run_command(
                argv,
                self.deadline.remaining(),
                log_path=self.paths.log,
                env=dict(env or self.env),
                cwd=cwd,
                grace=KILL_GRACE,
                tail_lines=TAIL_LINES,
                progress=self.status.tick,
            )
        finally:
            _scrub_file(self.paths.log, self.secrets)  # a tool may echo a secret it was given
        return self.checked(what, result)

    def ready_to_run(self) -> None:
        """What every command of the build needs: its TMPDIR, and the netrc file of pip_args' credentials."""
        os.makedirs(self.paths.tmp, exist_ok=True)
        if self.netrc_text and not os.path.exists(self.netrc):  # the build directory is made (again) here
            with os.fdopen(os.open(self.netrc, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
                handle.write(self.netrc_text)

    def run_captured(self, argv: List[str]) -> CommandResult:
        """A command of the build with its output in the result, not the log, and no status ticks: safe in
        a thread beside the build's own steps (ready_to_run first, then `checked` and `logged` by the caller)."""
        return run_command(argv, self.deadline.remaining(), env=dict(self.env), grace=KILL_GRACE, tail_lines=TAIL_LINES)

    def logged(self, result: CommandResult) -> None:
        """A captured command and its output into the log (masked as the log's other lines are)."""
        self.note(f"$ {result.command}: exit {result.rc} after {result.elapsed:.1f}s\n{result.stdout}{result.stderr}")

    def checked(self, what: str, result: CommandResult) -> CommandResult:
        """`result`, or the BuildError that names the deadline or the exit code."""
        if result.timed_out:
            survivors = f"; processes that would not die: {result.survivors}" if result.survivors else ""
            raise BuildError(
                f"{what} timed out: build_timeout={self.opts.build_timeout:.0f}s (fetch + build + install) "
                f"ran out; its process group was killed{survivors}. Raise build_timeout, or lower the build's "
                "cost (e.g. build_env MAX_JOBS / TORCH_CUDA_ARCH_LIST)"
            )
        if result.rc != 0:
            raise BuildError(
                f"{what} failed with exit code {result.rc}{no_space_hint(self.paths.root, result.log_tail)}"
            )
        return result

    def install_build_requirements(self, src: str, keep_torch: bool) -> Optional[str]:
        """Install the checkout's build requirements into the venv (a build without isolation builds
        against the venv). Returns where they came from, or None when the checkout declares none."""
        device = self.env.get("VLLM_TARGET_DEVICE")
        found = build_requirements(src, self.paths.requirements, device, keep_torch)
        if found is None:
            self.note("build_isolation=false: the checkout declares no build requirements; building against the venv")
            return None
        self.note(f"build_isolation=false: installing the build requirements of {found.source} into the venv")
        if found.skipped:
            self.note(f"the venv already sees torch: left out of the build requirements: {', '.join(found.skipped)}")
        argv = self.installer.argv("install", [*self.pip_args, "-r", found.file], venv_python=self.venv_python)
        self.step(f"installing the build requirements ({found.source})", argv, cwd=src)
        return found.source

    def venv_torch(self) -> Optional[str]:
        """The torch version the venv's own python sees (what a build without isolation compiles against)."""
        return probe_python(self.venv_python, with_torch=True)[1]

    def create_venv(self) -> None:
        argv = self.installer.argv(
            "venv", python=self.python, venv=self.paths.venv, system_site_packages=self.opts.system_site_packages
        )
        self.step("creating the venv", argv)

    def build_wheel(self, src: str) -> str:
        base = self.env.get("VLLM_PRECOMPILED_WHEEL_LOCATION", "")
        if not os.path.isfile(base):
            self._run_build(src, self.env)
            return self._keep_built()
        wheel = self._build_overlaid(src, base)
        if not wheel:
            self._run_build(src, self.env)
            wheel = self._keep_built()
        return self._base_tagged(wheel, base)

    def _base_tagged(self, wheel: str, base: str) -> str:
        """The precompiled wheel with the base wheel's tags when its libraries are all the base wheel's
        (_wheel_tags): installable on every Python the base wheel is, not only the build host's."""
        try:
            tagged = base_tagged(wheel, base)
        except OverlayError as exc:
            raise BuildError(
                f"the built wheel {wheel} cannot be read ({exc}). Fix: remove {os.path.dirname(wheel)} and build again"
            ) from exc
        self.tags = tagged.details()
        self.note(f"wheel tags: {tagged.reason}")
        return tagged.path

    def _run_build(self, src: str, env: Mapping[str, str]) -> None:
        """Build the wheel of `src` into the dist directory: pip's own isolated build (`pip wheel`), else
        both PEP 517 hooks in one process (_pep517) in a build env made here, or in the venv."""
        if self.installer.name == "pip" and self.opts.build_isolation:
            argv = self.installer.argv(
                "wheel", [*self.pip_args, src], venv_python=self.venv_python, dist=self.paths.dist,
                no_isolation=False,
            )  # fmt: skip
            self.step("building the wheel", argv, cwd=src, env=env)
            return
        try:
            system = build_system(src)
        except ValueError as exc:
            raise BuildError(f"{exc}; fix the ref's pyproject.toml") from exc
        python = self.venv_python
        if self.opts.build_isolation:  # a venv of the build requirements alone, as a frontend makes it
            python = self._build_env(system.requires)
        env = dict(env, PATH=os.pathsep.join([os.path.dirname(python), env.get("PATH", os.defpath)]))
        self.note(f"building with {system.backend}'s PEP 517 hooks in one process of {python}")
        for attempt in (1, 2):
            script = os.path.join(self.paths.build, "pep517_hooks.py")
            argv = system.hooks_argv(python, script, self.paths.dist, strict=self.opts.build_isolation)
            self.step("building the wheel", argv, cwd=src, env=env)
            found = _hooks_result(self.paths.log)
            missing = found.get("missing") if found else None
            if not missing:
                return
            if attempt == 2:
                raise BuildError(f"the build backend still asks for {', '.join(missing)} after installing it")
            self.note(f"get_requires_for_build_wheel asks for {', '.join(missing)}: installing into the build env")
            argv = self.installer.argv("install", [*self.pip_args, *missing], venv_python=python)
            self.step("installing what the build backend asks for", argv)

    def _build_env(self, requires: List[str]) -> str:
        """A venv holding `[build-system] requires` alone (from the installer's cache), its python."""
        env_dir = os.path.join(self.paths.build, "build-env")
        argv = self.installer.argv("venv", python=self.python, venv=env_dir, system_site_packages=False)
        self.step("creating the build env", argv)
        python = os.path.join(env_dir, "bin", "python")
        if requires:
            argv = self.installer.argv("install", [*self.pip_args, *requires], venv_python=python)
            self.step("installing the build requirements into the build env", argv)
        return python

    def _keep_built(self) -> str:
        built = single_wheel(self.paths.dist)
        if not built:
            raise BuildError(f"the build produced no wheel in {self.paths.dist}")
        os.makedirs(self.paths.wheels, exist_ok=True)
        final = os.path.join(self.paths.wheels, os.path.basename(built))
        os.replace(built, final)  # a wheel in wheels/<name>/ is complete by construction
        return final

    def _build_overlaid(self, src: str, base: str) -> Optional[str]:
        """The precompiled build through the wheel overlay (_wheel_overlay): setup.py extracts from a stub of
        the base wheel, and the large members are copied raw from the base wheel into the built one.

        Returns the wheel, or None when the overlay refused the built wheel (the caller builds again the
        plain way: slower, never wrong).
        """
        try:
            stub = stub_for(base, os.path.join(self.paths.root, "cache", "overlay"))
        except (OverlayError, OSError) as exc:
            raise BuildError(f"precompiled_wheel {base} cannot be used ({exc})") from exc
        self.note(f"wheel overlay: setup.py extracts from the stub {stub}")
        self._run_build(src, dict(self.env, VLLM_PRECOMPILED_WHEEL_LOCATION=stub))
        built = single_wheel(self.paths.dist)
        if not built:
            raise BuildError(f"the build produced no wheel in {self.paths.dist}")
        os.makedirs(self.paths.wheels, exist_ok=True)
        final = os.path.join(self.paths.wheels, os.path.basename(built))
        try:
            counts = overlay(built, base, final)
        except OverlayError as exc:
            self.note(f"wheel overlay refused the built wheel ({exc}); building again from {base}")
            remove_tree_within(self.paths.root, self.paths.dist)
            return None
        self.note(f"wheel overlay: {counts['swapped']} members ({counts['swapped_bytes']} bytes) copied from {base}")
        try:
            members = unpack_members(stub, base)
        except (OverlayError, OSError) as exc:
            self.note(f"wheel overlay: the base wheel's members cannot be unpacked ({exc}); installing {final}")
            os.unlink(built)
            return final
        os.makedirs(self.paths.from_stub, exist_ok=True)
        kept = os.path.join(self.paths.from_stub, os.path.basename(built))
        os.replace(built, kept)
        self.linkable = (kept, counts["placeholders"], members)
        return final

    def adopt_wheel(self, given: str) -> str:
        """Copy a wheel supplied by the user into wheels/<name>/ (atomically, as the only wheel)."""
        os.makedirs(self.paths.wheels, exist_ok=True)
        final = os.path.join(self.paths.wheels, os.path.basename(given))
        if os.path.abspath(given) != final:
            tmp = os.path.join(self.paths.wheels, ".incoming")
            shutil.copyfile(given, tmp)
            for old in os.listdir(self.paths.wheels):
                if old.endswith(".whl"):
                    os.unlink(os.path.join(self.paths.wheels, old))
            os.replace(tmp, final)
        return final

    def install(self, wheel: str, wheel_sha: str) -> None:
        """Install `wheel`; one built through the overlay as the wheel built from the stub, its placeholders
        then hard-linked to the base wheel's members (_wheel_overlay.link_installed): the same files."""
        if self.linkable is None:
            argv = self.installer.argv("install", [*self.pip_args, wheel], venv_python=self.venv_python)
            self.step("installing the wheel", argv)
            return
        from_stub, placeholders, members = self.linkable
        argv = self.installer.argv("install", [*self.pip_args, from_stub], venv_python=self.venv_python)
        self.step("installing the wheel built from the stub", argv)
        try:
            counts = link_installed(self._dist_info(wheel), placeholders, members, (wheel, wheel_sha))
        except (OverlayError, OSError, ValueError) as exc:
            self.note(f"linked install refused ({exc}); installing {wheel} over it")
            argv = self.installer.argv("reinstall", [*self.pip_args, wheel], venv_python=self.venv_python)
            self.step("installing the wheel", argv)
            self.install_record = {"how": "wheel", "linked_install_refused": str(exc)}
            return
        self.note(
            f"linked install: {counts['linked']} members hard-linked ({counts['copied']} copied, "
            f"{counts['linked_bytes']} bytes) from {members}, the rest installed from {from_stub}"
        )
        self.install_record = dict(counts, how="linked", members=members)

    def _dist_info(self, wheel: str) -> str:
        name, version = os.path.basename(wheel).split("-")[:2]
        pattern = os.path.join(glob.escape(self.paths.venv), "lib*", "python*", "site-packages")
        found = {
            os.path.realpath(p) for p in glob.glob(os.path.join(pattern, glob.escape(f"{name}-{version}.dist-info")))
        }
        if len(found) != 1:
            raise OverlayError(f"{len(found)} installed {name}-{version}.dist-info in {self.paths.venv}, not one")
        return found.pop()

    def checkout(self, mirror: str, commit: str) -> None:
        try:
            checkout(mirror, commit, self.paths.src, self.deadline.remaining(), self.paths.log)
        except GitError as exc:
            raise BuildError(str(exc)) from exc


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"`]+")


def _credentials_off_argv(args: List[str]) -> Tuple[List[str], str]:
    """pip_args with the credentials of their URLs taken out, and the netrc text that gives them to pip and
    uv instead (empty when there are none). One credential per host: netrc has one entry per machine."""
    machines: Dict[str, Tuple[str, str]] = {}

    def take(match: re.Match) -> str:
        url = match.group(0)
        if redact_url(url) == url:
            return url
        parts = urllib.parse.urlsplit(url)
        login, password = urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or "")
        host = parts.hostname or ""
        if not host or any(not token.isprintable() or " " in token or '"' in token for token in (login, password)):
            raise OptionError(
                f"a URL of pip_args ({redact_url(url)}) has credentials that cannot be handed over without the "
                "command line (no host, or a space, quote or control character in them). Fix: use a token "
                "without those, or a netrc file or keyring of the build user"
            )
        if machines.setdefault(host, (login, password)) != (login, password):
            raise OptionError(
                f"pip_args give two different credentials for {host}; pip and uv get them from one netrc entry "
                "per host. Fix: use one credential for the host"
            )
        return redact_url(url)

    cleaned = [_URL.sub(take, arg) for arg in args]
    lines = [
        f"machine {host} login {login}" + (f" password {password}" if password else "")
        for host, (login, password) in machines.items()
    ]
    return cleaned, "".join(line + "\n" for line in lines)


def _hooks_result(log_path: str) -> Optional[Dict[str, Any]]:
    """The last result line that _pep517.HOOKS printed into the build log."""
    found = None
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.startswith(PEP517_MARK):
                with contextlib.suppress(ValueError):
                    found = json.loads(line[len(PEP517_MARK) :])
    return found if isinstance(found, dict) else None


def _scrub_file(path: str, secrets: List[str]) -> None:
    """Mask `secrets` in a log file (written by the tools themselves, who may echo what they were given)."""
    if not secrets:
        return
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            text = handle.read()
        scrubbed = text
        for secret in secrets:
            scrubbed = scrubbed.replace(secret, MASK)
        if scrubbed != text:
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as handle:
                handle.write(scrubbed)
