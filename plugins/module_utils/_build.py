# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build a pinned ref of vLLM into a release that is complete or absent, never half there.

A release is `<root>/releases/<sha12>-<inputs8>/` (venv/ + manifest.json). The name is a function of
the commit and the build inputs, so "is it built?" is one path lookup and re-runs do nothing. The
manifest is written last: a directory without it is debris from an interrupted run and is removed.
Fetch, checkout, venv, wheel build and install share one deadline; on any failure the half release
and the checkout go, the log stays, and `current` is never touched (activation is vllm_release's job).

The layers under this one (as kubernetes.core's k8s/ core): the options (_build_options), the host
environment (_build_host), the status file (_build_status), the installer command table (_installer)
and the precompiled decision (_precompiled). This file is the run: resolve, plan, build, record.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import shutil
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_host import (
    cache_env,
    derive_max_jobs,
    find_installer,
    find_python,
    max_jobs,
    probe_python,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    BUILD_ARGUMENT_SPEC,
    MASK,
    PRECOMPILED_ENV,
    VLLM_BUILD_ARGUMENT_SPEC,
    BuildError,
    BuildOptions,
    build_options,
    canonical_package,
    option_secrets,
    recorded_build_env,
    recorded_pip_args,
    validate,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_requirements import build_requirements
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import STATUS_NAME, StatusFile
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import (
    read_json,
    redact_url,
    sha256_file,
    utc_now,
    write_json_atomic,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import (
    CommandInterrupted,
    CommandResult,
    Deadline,
    tail,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import run as run_command
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import (
    GitError,
    Resolution,
    checkout,
    commit_exists,
    ensure_mirror,
    fetch_ref,
    fetch_short_sha,
    git_env,
    is_full_sha,
    mirror_path,
    normalize_repo,
    resolve_remote,
    resolve_short_sha,
    rev_parse,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._installer import Installer
from ansible_collections.vllm_ops.dflash.plugins.module_utils._lock import LockTimeout, host_lock
from ansible_collections.vllm_ops.dflash.plugins.module_utils._pep517 import MARK as PEP517_MARK
from ansible_collections.vllm_ops.dflash.plugins.module_utils._pep517 import build_system
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import (
    Decision,
    PrecompiledError,
    base_dest_ref,
    base_label,
    base_unusable,
    compiled_from_its_sources,
    decide_against,
    decide_options,
    options_need_git,
    parse_base,
    predict_decision,
    wheel_decision,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import remove_hidden_first, run_action_unlocked
from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_overlay import (
    OverlayError,
    link_installed,
    overlay,
    stub_for,
    unpack_members,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_tags import base_tagged

# The names other files import from here (the modules, _drift, the tests) stay importable from here.
__all__ = [
    "BUILD_ARGUMENT_SPEC",
    "MANIFEST_SCHEMA",
    "STATUS_NAME",
    "VLLM_BUILD_ARGUMENT_SPEC",
    "BuildError",
    "BuildOptions",
    "StatusFile",
    "build",
    "build_options",
    "cache_env",
    "derive_max_jobs",
    "inputs_hash",
    "option_secrets",
    "prune_after_build",
    "release_name",
    "url_secrets",
]

MANIFEST_SCHEMA = 1
TAIL_LINES = 20
KILL_GRACE = 10.0
# A release built beside the one `current` names (releases/.building-<name>), swapped in when complete.
STAGING_PREFIX = ".building-"
_NO_SPACE = ("No space left on device", "[Errno 28]", "ENOSPC", "Disk quota exceeded")
# vllm_drift imports the old name.
url_secrets = option_secrets


def inputs_hash(inputs: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the build inputs."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def release_name(commit: Optional[str], digest: str, version: Optional[str] = None, package: str = "vllm") -> str:
    """The one naming function: `<sha12>-<inputs8>` of a git commit, `<package>-<version>-<inputs8>` of a
    release from an index (_release_install). _releases.RELEASE_NAME matches both."""
    if version:
        return f"{canonical_package(package)}-{version}-{digest[:8]}"
    return f"{(commit or '')[:12]}-{digest[:8]}"


def _log_path(root: str, label: str) -> str:
    return os.path.join(root, "logs", f"build-{label}-{utc_now().replace('-', '').replace(':', '')}.log")


class _Paths:
    """Where one release attempt writes. `staging`: the release is built beside its final place (which
    `current` names) and swapped in at the end, so what serves is never removed or rebuilt in place."""

    def __init__(self, root: str, name: str, log: Optional[str] = None, staging: bool = False) -> None:
        self.root = root
        self.final = os.path.join(root, "releases", name)
        self.release = os.path.join(root, "releases", STAGING_PREFIX + name) if staging else self.final
        self.venv = os.path.join(self.release, "venv")
        self.manifest = os.path.join(self.release, "manifest.json")
        self.wheels = os.path.join(root, "wheels", name)
        self.build = os.path.join(root, "build", name)
        self.src = os.path.join(self.build, "src")
        self.dist = os.path.join(self.build, "dist")
        # TMPDIR of every step: pip's and uv's build environments (torch included: GBs for vLLM) go with
        # the build directory, also after a kill.
        self.tmp = os.path.join(self.build, "tmp")
        self.requirements = os.path.join(self.build, "build-requirements.txt")
        self.from_stub = os.path.join(self.build, "from-stub")  # the wheel built from the stub, installed
        self.log = log or _log_path(root, name)


def prune_after_build(root: str, keep: int, made: str) -> List[str]:
    """vllm_release's prune, run by the build that holds the host lock, never removing the release it made.

    keep < 1 disables pruning after a build (the module's keep_releases=0), where vllm_release's own
    prune with 0 keeps only the current and previous releases. Returns the names removed.
    """
    if keep < 1:
        return []
    return list(run_action_unlocked(root, "prune", keep_releases=keep, protect=[made])["pruned"])


def _single_wheel(directory: str) -> Optional[str]:
    if not os.path.isdir(directory):
        return None
    wheels = sorted(f for f in os.listdir(directory) if f.endswith(".whl"))
    if len(wheels) > 1:
        raise BuildError(f"{directory} holds several wheels ({', '.join(wheels)}); keep one or remove the directory")
    return os.path.join(directory, wheels[0]) if wheels else None


def _wheel_version(path: str) -> str:
    parts = os.path.basename(path).split("-")
    return parts[1] if len(parts) >= 5 else ""


def _note(log_path: str, text: str) -> None:
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as handle:
        handle.write(f"[{utc_now()}] {text}\n")


class _Builder:
    """One release attempt: every step appends to the log, shares the deadline and updates the status."""

    def __init__(
        self,
        opts: BuildOptions,
        paths: _Paths,
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
        self.env = env
        # (wheel built from the stub, its placeholders, the unpacked members): set by the overlay.
        self.linkable: Optional[Tuple[str, Dict[str, Dict[str, Any]], str]] = None
        self.install_record: Dict[str, Any] = {"how": "wheel"}
        self.tags: Optional[Dict[str, Any]] = None  # the precompiled wheel's tags (_wheel_tags), when built here

    @property
    def venv_python(self) -> str:
        return os.path.join(self.paths.venv, "bin", "python")

    def note(self, text: str) -> None:
        _note(self.paths.log, self.status.scrub(text))

    def step(
        self, what: str, argv: List[str], cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None
    ) -> CommandResult:
        os.makedirs(self.paths.tmp, exist_ok=True)
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
        if result.timed_out:
            survivors = f"; processes that would not die: {result.survivors}" if result.survivors else ""
            raise BuildError(
                f"{what} timed out: build_timeout={self.opts.build_timeout:.0f}s (fetch + build + install) "
                f"ran out; its process group was killed{survivors}. Raise build_timeout, or lower the build's "
                "cost (e.g. build_env MAX_JOBS / TORCH_CUDA_ARCH_LIST)"
            )
        if result.rc != 0:
            raise BuildError(
                f"{what} failed with exit code {result.rc}{_no_space_hint(self.paths.root, result.log_tail)}"
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
        argv = self.installer.argv("install", [*self.opts.pip_args, "-r", found.file], venv_python=self.venv_python)
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
                "wheel", [*self.opts.pip_args, src], venv_python=self.venv_python, dist=self.paths.dist,
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
            argv = self.installer.argv("install", [*self.opts.pip_args, *missing], venv_python=python)
            self.step("installing what the build backend asks for", argv)

    def _build_env(self, requires: List[str]) -> str:
        """A venv holding `[build-system] requires` alone (from the installer's cache), its python."""
        env_dir = os.path.join(self.paths.build, "build-env")
        argv = self.installer.argv("venv", python=self.python, venv=env_dir, system_site_packages=False)
        self.step("creating the build env", argv)
        python = os.path.join(env_dir, "bin", "python")
        if requires:
            argv = self.installer.argv("install", [*self.opts.pip_args, *requires], venv_python=python)
            self.step("installing the build requirements into the build env", argv)
        return python

    def _keep_built(self) -> str:
        built = _single_wheel(self.paths.dist)
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
            stub = stub_for(base, os.path.join(self.opts.root, "cache", "overlay"))
        except (OverlayError, OSError) as exc:
            raise BuildError(f"precompiled_wheel {base} cannot be used ({exc})") from exc
        self.note(f"wheel overlay: setup.py extracts from the stub {stub}")
        self._run_build(src, dict(self.env, VLLM_PRECOMPILED_WHEEL_LOCATION=stub))
        built = _single_wheel(self.paths.dist)
        if not built:
            raise BuildError(f"the build produced no wheel in {self.paths.dist}")
        os.makedirs(self.paths.wheels, exist_ok=True)
        final = os.path.join(self.paths.wheels, os.path.basename(built))
        try:
            counts = overlay(built, base, final)
        except OverlayError as exc:
            self.note(f"wheel overlay refused the built wheel ({exc}); building again from {base}")
            shutil.rmtree(self.paths.dist, ignore_errors=True)
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
            argv = self.installer.argv("install", [*self.opts.pip_args, wheel], venv_python=self.venv_python)
            self.step("installing the wheel", argv)
            return
        from_stub, placeholders, members = self.linkable
        argv = self.installer.argv("install", [*self.opts.pip_args, from_stub], venv_python=self.venv_python)
        self.step("installing the wheel built from the stub", argv)
        try:
            counts = link_installed(self._dist_info(wheel), placeholders, members, (wheel, wheel_sha))
        except (OverlayError, OSError, ValueError) as exc:
            self.note(f"linked install refused ({exc}); installing {wheel} over it")
            argv = self.installer.argv("reinstall", [*self.opts.pip_args, wheel], venv_python=self.venv_python)
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


def _hooks_result(log_path: str) -> Optional[Dict[str, Any]]:
    """The last result line that _pep517.HOOKS printed into the build log."""
    found = None
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.startswith(PEP517_MARK):
                with contextlib.suppress(ValueError):
                    found = json.loads(line[len(PEP517_MARK) :])
    return found if isinstance(found, dict) else None


def _fetch_commit(repo: str, mirror: str, resolution: Resolution, deadline: Deadline, log: str) -> None:
    """Bring the mirror up to date (a fetch, or the first clone) and make sure it holds the commit."""
    commit = resolution.commit or ""
    extra = [resolution.full_ref] if resolution.kind == "ref" and resolution.full_ref else []
    ensure_mirror(repo, mirror, deadline.remaining(), log, extra)
    if not commit_exists(mirror, commit):  # a SHA reachable from no branch or tag: ask for it
        with contextlib.suppress(GitError):  # a server that refuses says so in the log
            ensure_mirror(repo, mirror, deadline.remaining(), log, [commit])
    if not commit_exists(mirror, commit):
        raise BuildError(
            f"commit {commit} does not exist in {redact_url(repo)} (or the server does not serve it by SHA);"
            " check `ref`, or name it by a branch, tag or refs/pull/N/head"
        )


def _fetch_base(repo: str, mirror: str, base: str, deadline: Deadline, log: str) -> str:
    """The commit of `precompiled_base` in the mirror, fetching it from its repository when needed."""
    base_url, base_ref = parse_base(base)
    if base_url is None or normalize_repo(base_url) == repo:  # same_repo, spelled out for the type checker
        sha = rev_parse(mirror, base_ref)  # ensure_mirror fetched every branch and tag
        if sha is None and (base_ref.startswith("refs/") or is_full_sha(base_ref)):
            ensure_mirror(repo, mirror, deadline.remaining(), log, [base_ref])
            sha = rev_parse(mirror, base_ref)
        if sha is None:
            raise PrecompiledError(f"{base_ref!r} is not a branch, tag, ref or commit of {redact_url(repo)}")
        return sha
    resolution = resolve_remote(base_url, base_ref, min(deadline.remaining(), 120.0))
    if not resolution.commit:
        raise PrecompiledError(f"{base_ref!r} is a short SHA, which cannot be fetched from another repository")
    if not commit_exists(mirror, resolution.commit):
        source = resolution.full_ref if resolution.full_ref else resolution.commit
        fetch_ref(base_url, mirror, source, base_dest_ref(base_url), deadline.remaining(), log)
    return resolution.commit


def _fetch_base_and_decide(
    opts: BuildOptions, repo: str, mirror: str, commit: str, inputs: Mapping[str, Any], deadline: Deadline, log: str
) -> Decision:
    """The build's decision: fetch precompiled_base into the mirror, then decide (_precompiled)."""
    label = base_label(*parse_base(opts.precompiled_base))
    try:
        base_commit = _fetch_base(repo, mirror, opts.precompiled_base, deadline, log)
    except (GitError, PrecompiledError) as exc:
        return base_unusable(opts, label, exc)
    return decide_against(opts, mirror, commit, base_commit, label, inputs)


def _named(commit: str, inputs: Mapping[str, Any], use_precompiled: bool) -> Tuple[str, str]:
    """(digest, release name): the precompiled decision is a build input, its environment is not."""
    digest = inputs_hash(dict(inputs, precompiled=use_precompiled))
    return digest, release_name(commit, digest)


def _read_manifest(release: str) -> Optional[Dict[str, Any]]:
    """The manifest of a complete release; None when it is missing, not JSON or not an object: such a
    release is incomplete and is built again (beside it when `current` names it), never an error."""
    try:
        manifest = read_json(os.path.join(release, "manifest.json"), None)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _existing(opts: BuildOptions, commit: str, inputs: Mapping[str, Any]) -> Optional[Tuple[str, str, Dict]]:
    """An already built release of `commit` that this run accepts: (name, digest, manifest).

    auto accepts a full build, and a precompiled one only if auto decided it (from the diff): one forced
    with `always` may hold compiled modules that do not match the commit's sources.
    """
    choices = {"never": [False], "always": [True]}.get(opts.precompiled, [False, True])
    if wheel_decision(opts) is not None:  # the wheel's own variant, not an earlier build of the other
        choices = [bool(opts.wheel_precompiled)]
    for use in choices:
        digest, name = _named(commit, inputs, use)
        manifest = _read_manifest(os.path.join(opts.root, "releases", name))
        if manifest is None:
            continue
        if opts.precompiled == "auto" and not compiled_from_its_sources(manifest):
            continue
        return name, digest, manifest
    return None


def _added_env(opts: BuildOptions, installer: Installer, decision: Decision) -> Tuple[Dict[str, str], Dict[str, str]]:
    """What vllm_build adds to the build's environment (none of it a build input), and where MAX_JOBS came from."""
    user = dict(os.environ)
    user.update(opts.build_env)
    jobs = max_jobs(opts.build_env, os.environ)
    added: Dict[str, str] = {}
    if jobs["source"].startswith("derived"):
        added["MAX_JOBS"] = jobs["value"]
    added.update(cache_env(opts.root, installer.name, user))
    added.update(decision.env())
    return added, jobs


def _failure_message(cause: str, log_path: str) -> str:
    return (
        f"{cause}. The release was not created and `current` is unchanged. "
        f"Full log: {log_path}\n--- last lines of the log ---\n{tail(log_path, TAIL_LINES)}"
    )


class _Plan:
    """What one release attempt builds: the commit, its inputs, the precompiled decision and the name."""

    def __init__(
        self,
        resolution: Resolution,
        repo: str,
        mirror: str,
        inputs: Dict[str, Any],
        decision: Decision,
        max_jobs: Mapping[str, str],
        added_env: Mapping[str, str],
    ) -> None:
        self.resolution = resolution
        self.commit = resolution.commit or ""
        self.repo = repo
        self.mirror = mirror
        self.decision = decision
        self.inputs = dict(inputs, precompiled=decision.use)
        self.digest, self.name = _named(self.commit, inputs, decision.use)
        self.max_jobs = dict(max_jobs)
        self.added_env = dict(added_env)
        self.existing: Optional[Dict[str, Any]] = None  # the manifest, when the release exists already


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


def _no_space_hint(root: str, text: str) -> str:
    """'; no space left on device ...' when `text` (a log tail, an error) says so or the root's file system is full."""
    free = None
    with contextlib.suppress(OSError):
        stat = os.statvfs(root if os.path.isdir(root) else os.path.dirname(root))
        free = stat.f_bavail * stat.f_frsize
    if not (any(sign in text for sign in _NO_SPACE) or (free is not None and free < 64 * 1024**2)):
        return ""
    left = f" ({free / 1024**2:.0f} MiB free)" if free is not None else ""
    return (
        f"; no space left on device on the file system of {root}{left}. Fix: free space there (old releases: "
        f"vllm_release action=prune; caches: {os.path.join(root, 'cache')}) or give `root` a larger disk, then re-run"
    )


def _serving(root: str) -> Optional[str]:
    """The release name `current` points to (what serves), or None."""
    with contextlib.suppress(OSError):
        return os.path.basename(os.path.normpath(os.readlink(os.path.join(root, "current"))))
    return None


def _remove_debris(root: str) -> None:
    """Checkouts and staged releases of builds that were killed outright (we hold the host lock: no other
    build runs). Their TMPDIR, with pip's build environments, is inside the checkout's directory."""
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(os.path.join(root, "build")):
            shutil.rmtree(os.path.join(root, "build", name), ignore_errors=True)
    releases = os.path.join(root, "releases")
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(releases)):
            staged = os.path.join(releases, name)
            final = os.path.join(releases, name[len(STAGING_PREFIX) :])
            if not name.startswith(STAGING_PREFIX):
                continue
            if not os.path.lexists(final) and os.path.isfile(os.path.join(staged, "manifest.json")):
                os.rename(staged, final)  # killed between the two renames of a swap: finish it
            else:
                shutil.rmtree(staged, ignore_errors=True)


def _relocate_venv(venv: str, old: str, new: str) -> None:
    """Make the venv at `venv`, created as `old`, right for the path `new`: its scripts' shebangs, the
    activate files and pyvenv.cfg name the path the venv was created at (its python finds itself)."""
    candidates = [os.path.join(venv, "pyvenv.cfg")]
    bin_dir = os.path.join(venv, "bin")
    with contextlib.suppress(FileNotFoundError):
        candidates += [os.path.join(bin_dir, name) for name in os.listdir(bin_dir)]
    for path in candidates:
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 1024**2:
            continue
        with open(path, "rb") as handle:
            data = handle.read()
        if old.encode() in data:
            mode = os.stat(path).st_mode
            tmp = path + ".relocate"
            with open(tmp, "wb") as handle:
                handle.write(data.replace(old.encode(), new.encode()))
            os.chmod(tmp, mode)
            os.replace(tmp, path)


def _swap_in(paths: _Paths) -> None:
    """Put the release built beside its final place there: the old directory (incomplete, named by
    `current`) is renamed away and the new one renamed in, two renames in one directory."""
    _relocate_venv(paths.venv, paths.venv, os.path.join(paths.final, "venv"))
    old = os.path.join(os.path.dirname(paths.final), f"{STAGING_PREFIX}{os.path.basename(paths.final)}.old")
    shutil.rmtree(old, ignore_errors=True)
    os.rename(paths.final, old)
    os.rename(paths.release, paths.final)
    shutil.rmtree(old, ignore_errors=True)


def _make_release(opts: BuildOptions, builder: _Builder, plan: _Plan) -> Dict[str, Any]:
    paths = builder.paths
    status = builder.status
    started = time.monotonic()
    _remove_debris(opts.root)
    if not paths.release.startswith(os.path.join(opts.root, "releases", STAGING_PREFIX)):
        remove_hidden_first(paths.release)  # debris of a run that was killed outright (no manifest: we hold the lock)
    builder.note(f"vllm_build {plan.name}: {redact_url(plan.repo)} {opts.ref} -> {plan.commit}")
    if paths.release != paths.final:
        builder.note(
            f"{paths.final} has no valid manifest.json but `current` names it: building beside it "
            f"({paths.release}) and swapping it in when complete; what serves stays until then"
        )
    builder.note("inputs: " + json.dumps(plan.inputs, sort_keys=True))
    builder.note(f"precompiled: {'yes' if plan.decision.use else 'no'}: {plan.decision.reason}")
    builder.note(f"MAX_JOBS={plan.max_jobs['value']} ({plan.max_jobs['source']})")
    added = {key: redact_url(value) for key, value in plan.added_env.items()}
    builder.note("environment added by vllm_build (not build inputs): " + json.dumps(added, sort_keys=True))
    build_torch = None
    try:
        if opts.wheel:
            wheel = builder.adopt_wheel(opts.wheel)
            source = "wheel"
        else:
            wheel = _single_wheel(paths.wheels) or ""
            source = "build" if not wheel else "wheel"
            if wheel:
                builder.note(f"reusing the wheel built earlier: {wheel}")
            else:
                status.stage("fetch", f"checking out {plan.commit[:12]}")
                builder.checkout(plan.mirror, plan.commit)
        status.stage("install" if wheel else "build", "creating the venv")
        builder.create_venv()
        if not wheel:
            if not opts.build_isolation:
                builder.install_build_requirements(paths.src, keep_torch=plan.inputs.get("torch") is None)
                build_torch = builder.venv_torch()
                builder.note(f"the wheel builds against the venv's torch: {build_torch or 'none'}")
            wheel = builder.build_wheel(paths.src)
            status.stage("install", f"installing {os.path.basename(wheel)}")
        wheel_sha = sha256_file(wheel)
        builder.install(wheel, wheel_sha)
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "name": plan.name,
            "commit": plan.commit,
            "requested_ref": opts.ref,
            "resolved_ref": plan.resolution.full_ref,
            "repo": redact_url(plan.repo),
            "inputs": plan.inputs,
            "inputs_hash": plan.digest,
            "wheel": {"path": wheel, "sha256": wheel_sha},
            "version": _wheel_version(wheel),
            "built_at": utc_now(),
            "build_seconds": round(time.monotonic() - started, 3),
            "stage_seconds": status.durations(),
            "log_path": paths.log,
            "source": source,
            "install": builder.install_record,
            "build_torch": build_torch,
            "precompiled": plan.decision.use,
            "precompiled_reason": plan.decision.reason,
            "precompiled_details": plan.decision.details(),
            "wheel_tags": builder.tags,
            "max_jobs": plan.max_jobs,
            "added_env": added,
        }
        write_json_atomic(paths.manifest, manifest)  # last: from now on the release exists
        if paths.release != paths.final:
            _swap_in(paths)
            builder.note(f"swapped the new {plan.name} in place of the incomplete one")
        builder.note(f"release {plan.name} complete")
    except BaseException as exc:
        if paths.release != paths.final:
            shutil.rmtree(paths.release, ignore_errors=True)  # the serving directory stays as it was
        else:
            remove_hidden_first(paths.release)
        shutil.rmtree(paths.build, ignore_errors=True)
        if isinstance(exc, (BuildError, CommandInterrupted, GitError, OSError, ValueError)):
            cause = str(exc)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                cause += _no_space_hint(opts.root, "No space left on device")
            builder.note(f"FAILED: {cause}")
            raise BuildError(_failure_message(builder.status.scrub(cause), paths.log)) from exc
        raise
    shutil.rmtree(paths.build, ignore_errors=True)
    return manifest


def _result(
    opts: BuildOptions,
    resolution: Resolution,
    *,
    name: Optional[str],
    digest: str,
    started: float,
    changed: bool,
    built: bool,
    manifest: Optional[Mapping[str, Any]],
    msg: str,
    pruned: Optional[List[str]] = None,
    decision: Optional[Decision] = None,
) -> Dict[str, Any]:
    wheel = (manifest or {}).get("wheel") or {}
    if manifest is not None:
        precompiled, reason = manifest.get("precompiled"), manifest.get("precompiled_reason")
        max_jobs = (manifest.get("max_jobs") or {}).get("value")
    else:
        precompiled = decision.use if decision is not None and decision.decided else None
        reason, max_jobs = (decision.reason if decision is not None else None), None
    return {
        "changed": changed,
        "built": built,
        "commit": resolution.commit,
        "requested_ref": opts.ref,
        "release_name": name,
        "release": os.path.join(opts.root, "releases", name) if name else None,
        "wheel": wheel.get("path"),
        "wheel_sha256": wheel.get("sha256"),
        "log_path": (manifest or {}).get("log_path"),
        "inputs_hash": digest,
        "precompiled": precompiled,
        "precompiled_reason": reason,
        "max_jobs": max_jobs,
        "duration": round(time.monotonic() - started, 3),
        "stage_seconds": {},
        "status_path": os.path.join(opts.root, STATUS_NAME),
        "pruned": pruned or [],
        "msg": msg,
    }


def _check_expected(opts: BuildOptions, commit: Optional[str], repo: str) -> None:
    expected = opts.expected_commit
    if expected and commit and not commit.startswith(expected):
        raise BuildError(
            f"ref {opts.ref!r} of {redact_url(repo)} resolves to {commit}, not the expected_commit {expected}; "
            "the ref moved: update expected_commit or pin ref to the expected SHA"
        )


def build(opts: BuildOptions, check_mode: bool = False) -> Dict[str, Any]:
    """Resolve `opts.ref`, and build + install it as a release unless that release already exists.

    Returns the vllm_build result dict. Raises BuildError (unreachable repo, unknown ref,
    expected_commit mismatch, failed or timed-out build: the message names the log and its tail).
    Outside check mode, `<root>/build-status.json` follows the run from `resolve` to `done` or `failed`.
    """
    started = time.monotonic()
    validate(opts)
    status = StatusFile(
        opts.root, opts.run_id, opts.label, enabled=not check_mode, secrets=sorted(option_secrets(vars(opts)))
    )
    try:
        status.stage("resolve", f"resolving {opts.label}")
        if opts.version:  # a release from an index: no git (imported here: that core builds on this one)
            from ansible_collections.vllm_ops.dflash.plugins.module_utils._release_install import install_release

            result = install_release(opts, check_mode, started, status)
        else:
            result = _resolve_and_build(opts, check_mode, started, status)
    except BaseException as exc:
        cause = exc
        if isinstance(exc, (BuildError, GitError, PrecompiledError)):
            cause = BuildError(status.scrub(str(exc)))
        elif isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            cause = BuildError(f"{exc}{_no_space_hint(opts.root, str(exc))}")
        status.stage("failed", (str(cause).splitlines() or [type(exc).__name__])[0][:300])
        if cause is not exc:
            raise cause from exc
        raise
    result["stage_seconds"] = status.durations()
    status.stage("done", result["msg"], release_name=result["release_name"], commit=result["commit"])
    return result


def _resolve_and_build(opts: BuildOptions, check_mode: bool, started: float, status: StatusFile) -> Dict[str, Any]:
    deadline = Deadline(opts.build_timeout)
    repo = normalize_repo(opts.repo)
    python = find_python(opts.python)
    installer = find_installer(opts.installer, opts.root)
    # Compiled modules depend on torch's ABI. Without isolation the build compiles against the venv's
    # torch: the interpreter's, which the venv sees through system site packages, else the one the
    # commit's build requirements install (the commit is in the name). With isolation they pin it.
    python_version, torch = probe_python(python, with_torch=not opts.build_isolation and opts.system_site_packages)
    inputs = {
        "python": python,
        "python_version": python_version,
        "installer": installer.name,
        # Recorded without credentials, and hashed so: a rotated token names no new release.
        "build_env": recorded_build_env(opts.build_env),
        "build_isolation": opts.build_isolation,
        "system_site_packages": opts.system_site_packages,
        "pip_args": recorded_pip_args(opts.pip_args),
        "torch": torch,
        # ... and on the GPU architectures compiled for (unset: the build host's GPUs).
        "torch_cuda_arch_list": opts.build_env.get("TORCH_CUDA_ARCH_LIST", os.environ.get("TORCH_CUDA_ARCH_LIST")),
    }
    mirror = mirror_path(opts.root, repo)
    resolution = resolve_remote(repo, opts.ref, min(deadline.remaining(), 120.0))
    _check_expected(opts, resolution.commit, repo)

    if resolution.commit is None:  # short SHA: read an existing mirror (no lock needed to read)
        resolution.commit = resolve_short_sha(mirror, opts.ref, repo)
        _check_expected(opts, resolution.commit, repo)
    if resolution.commit:
        found = _existing(opts, resolution.commit, inputs)
        if found is not None:
            name, digest, manifest = found
            return _exists(opts, resolution, name, digest, started, manifest)
    if check_mode:
        if not resolution.commit:
            msg = f"would fetch {redact_url(repo)} to resolve the short SHA {opts.ref!r}, then build"
            return _result(
                opts, resolution, name=None, digest=inputs_hash(inputs), started=started, changed=True,
                built=False, manifest=None, msg=msg,
            )  # fmt: skip
        decision = predict_decision(opts, repo, mirror, resolution.commit, inputs)
        digest, name = _named(resolution.commit, inputs, decision.use)
        msg = f"would build {name}"
        if _serving(opts.root) == name and os.path.lexists(os.path.join(opts.root, "releases", name)):
            msg += " beside the incomplete release `current` names (no valid manifest.json), then swap it in"
        return _result(
            opts, resolution, name=name, digest=digest, started=started, changed=True, built=False, manifest=None,
            msg=msg, decision=decision,
        )  # fmt: skip

    lock = contextlib.ExitStack()
    try:
        lock.enter_context(host_lock(opts.root, deadline.remaining()))
    except LockTimeout as exc:
        holder = f"process {exc.holder_pid}" if exc.holder_pid else "another process"
        raise BuildError(
            f"{exc.path} is held by {holder} (a build or release swap on this host) for the whole "
            f"build_timeout={opts.build_timeout:.0f}s that vllm_build waits for it. Fix: wait for that run to "
            "finish (its progress: build-status.json), or raise build_timeout"
        ) from exc
    with lock:
        if resolution.commit is None:
            fetch_log = os.path.join(opts.root, "logs", f"fetch-{os.path.basename(mirror)}.log")
            status.stage("fetch", f"fetching {redact_url(repo)} to resolve {opts.ref}", log_path=fetch_log)
            resolution.commit = fetch_short_sha(repo, mirror, opts.ref, deadline.remaining(), fetch_log)
            _check_expected(opts, resolution.commit, repo)
        found = _existing(opts, resolution.commit, inputs)  # built by whoever held the lock before us
        if found is not None:
            name, digest, manifest = found
            return _exists(opts, resolution, name, digest, started, manifest)
        plan = _plan(opts, resolution, repo, mirror, inputs, installer, deadline, status)
        if plan.existing is not None:
            return _exists(opts, resolution, plan.name, plan.digest, started, plan.existing)
        # Never remove or rebuild in place what serves: a release `current` names without a valid
        # manifest is built beside and swapped in.
        beside = _serving(opts.root) == plan.name and os.path.lexists(os.path.join(opts.root, "releases", plan.name))
        paths = _Paths(opts.root, plan.name, status.data.get("log_path"), staging=beside)
        status.update(release_name=plan.name, commit=plan.commit, log_path=paths.log)
        builder = _Builder(opts, paths, deadline, installer, python, status, plan.added_env)
        manifest = _make_release(opts, builder, plan)
        pruned = prune_after_build(opts.root, opts.keep_releases, plan.name)
    return _result(
        opts, resolution, name=plan.name, digest=plan.digest, started=started, changed=True,
        built=manifest["source"] == "build", manifest=manifest, msg=f"built {plan.name}", pruned=pruned,
    )  # fmt: skip


def _exists(
    opts: BuildOptions, resolution: Resolution, name: str, digest: str, started: float, manifest: Mapping[str, Any]
) -> Dict[str, Any]:
    """The result when the release is there already (nothing changed)."""
    return _result(
        opts, resolution, name=name, digest=digest, started=started, changed=False, built=False, manifest=manifest,
        msg=f"{name} exists",
    )  # fmt: skip


def _plan(
    opts: BuildOptions,
    resolution: Resolution,
    repo: str,
    mirror: str,
    inputs: Dict[str, Any],
    installer: Installer,
    deadline: Deadline,
    status: StatusFile,
) -> _Plan:
    """Fetch what the decision and the build need, decide, and name the release (under the host lock).

    The plan's `existing` is the manifest when the decided release turns out to exist already.
    """
    commit = resolution.commit or ""
    decision = wheel_decision(opts)
    need_source = not opts.wheel
    name = None
    if decision is None and not options_need_git(opts):
        decision = decide_options(opts, inputs)  # the wheel must fit the build's python
    if decision is not None:
        name = _named(commit, inputs, decision.use)[1]
        need_source = need_source and _single_wheel(os.path.join(opts.root, "wheels", name)) is None
    log = None
    if need_source or decision is None:
        log = _log_path(opts.root, name or f"{commit[:12]}-pending")
        status.stage("fetch", f"fetching {redact_url(repo)}", commit=commit, log_path=log)
        _note(log, f"vllm_build: fetching {redact_url(repo)} for {opts.ref} -> {commit}")
        try:
            _fetch_commit(repo, mirror, resolution, deadline, log)
            if decision is None:
                decision = _fetch_base_and_decide(opts, repo, mirror, commit, inputs, deadline, log)
        except (BuildError, GitError, PrecompiledError) as exc:
            _note(log, f"FAILED: {exc}")
            raise BuildError(_failure_message(str(exc), log)) from exc
    added_env, jobs = _added_env(opts, installer, decision)
    plan = _Plan(resolution, repo, mirror, inputs, decision, jobs, added_env)
    if log is not None and name is None:
        manifest = _read_manifest(os.path.join(opts.root, "releases", plan.name))
        if manifest is not None:  # e.g. made by `always` and found again by auto's own decision
            os.unlink(log)
            plan.existing = manifest
            return plan
        final = _log_path(opts.root, plan.name)
        os.replace(log, final)  # the fetch's output opens the release's build log
        status.data["log_path"] = final
    return plan
