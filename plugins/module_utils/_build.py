# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build a pinned ref of vLLM into a release that is complete or absent, never half there.

A release is `<root>/releases/<sha12>-<inputs8>/` (venv/ + manifest.json). The name is a function of
the commit and the build inputs, so "is it built?" is one path lookup and re-runs do nothing. The
manifest is written last: a directory without it is debris from an interrupted run and is removed.
Fetch, checkout, venv, wheel build and install share one deadline; on any failure the half release
and the checkout go, the log stays, and `current` is never touched (activation is vllm_release's job).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence

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
    fetch_short_sha,
    git_env,
    mirror_path,
    normalize_repo,
    resolve_remote,
    resolve_short_sha,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._lock import LockTimeout, host_lock

__all__ = [
    "MANIFEST_SCHEMA",
    "BuildError",
    "BuildOptions",
    "build",
    "inputs_hash",
    "prune_releases",
    "release_name",
]

MANIFEST_SCHEMA = 1
INSTALLERS = ("auto", "uv", "pip")
TAIL_LINES = 20
KILL_GRACE = 10.0


class BuildError(Exception):
    """The release could not be built; the message names the cause, the fix and the log."""


class BuildOptions:
    """The options of vllm_build (see the module's DOCUMENTATION)."""

    def __init__(
        self,
        repo: str,
        ref: str,
        root: str = "/opt/vllm",
        python: str = "python3",
        installer: str = "auto",
        build_env: Optional[Mapping[str, Any]] = None,
        build_timeout: float = 3600,
        keep_releases: int = 3,
        build_isolation: bool = True,
        system_site_packages: bool = False,
        pip_args: Optional[Sequence[str]] = None,
        wheel: Optional[str] = None,
        expected_commit: Optional[str] = None,
    ) -> None:
        self.repo = repo
        self.ref = ref
        self.root = os.path.abspath(root)
        self.python = python
        self.installer = installer
        self.build_env = {str(k): str(v) for k, v in (build_env or {}).items()}
        self.build_timeout = float(build_timeout)
        self.keep_releases = int(keep_releases)
        self.build_isolation = bool(build_isolation)
        self.system_site_packages = bool(system_site_packages)
        self.pip_args = [str(a) for a in (pip_args or [])]
        self.wheel = wheel
        self.expected_commit = expected_commit.strip().lower() if expected_commit else None


def inputs_hash(inputs: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the build inputs."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def release_name(commit: str, digest: str) -> str:
    return f"{commit[:12]}-{digest[:8]}"


class _Paths:
    def __init__(self, root: str, name: str) -> None:
        self.release = os.path.join(root, "releases", name)
        self.venv = os.path.join(self.release, "venv")
        self.manifest = os.path.join(self.release, "manifest.json")
        self.wheels = os.path.join(root, "wheels", name)
        self.build = os.path.join(root, "build", name)
        self.src = os.path.join(self.build, "src")
        self.dist = os.path.join(self.build, "dist")
        self.log = os.path.join(root, "logs", f"build-{name}-{utc_now().replace('-', '').replace(':', '')}.log")


def _find_python(python: str) -> str:
    found = shutil.which(python)
    if not found:
        raise BuildError(f"python {python!r} not found on the host; install it or set `python` to an interpreter path")
    return os.path.abspath(found)


def _python_version(python: str) -> str:
    result = run_command([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"], 60, watchdog=False)
    if not result.ok:
        raise BuildError(
            f"{python} does not run ({result.log_tail or result.rc}); set `python` to a working interpreter"
        )
    return result.stdout.strip()


def _find_installer(installer: str) -> str:
    if installer not in INSTALLERS:
        raise BuildError(f"installer {installer!r} is not one of {', '.join(INSTALLERS)}")
    if installer == "pip":
        return "pip"
    if shutil.which("uv"):
        return "uv"
    if installer == "uv":
        raise BuildError("installer 'uv' requested but `uv` is not on PATH; install uv or use installer: pip")
    return "pip"


def _current_and_previous(root: str) -> List[str]:
    state = read_json(os.path.join(root, "state.json"), {}) or {}
    names = [state.get("current"), state.get("previous")]
    link = os.path.join(root, "current")
    if os.path.islink(link):  # trust the link too: it is what the service runs
        names.append(os.path.basename(os.readlink(link).rstrip("/")))
    return [n for n in names if n]


def prune_releases(root: str, keep: int, protect: Sequence[str] = ()) -> List[str]:
    """Delete releases (and their wheels) beyond the `keep` newest; never `current`, `previous`, `protect`.

    Newest by state.json's created_at, then the manifest's built_at. Directories without a manifest are
    debris of interrupted builds (call this under the host lock) and go too. keep < 1 disables pruning.
    Returns the names removed. state.json is left to vllm_release, which forgets vanished releases.
    """
    releases_dir = os.path.join(root, "releases")
    if keep < 1 or not os.path.isdir(releases_dir):
        return []
    state = read_json(os.path.join(root, "state.json"), {}) or {}
    recorded = state.get("releases") or {}
    created: Dict[str, str] = {}
    debris = []
    for name in os.listdir(releases_dir):
        path = os.path.join(releases_dir, name)
        if name.startswith(".") or not os.path.isdir(path) or os.path.islink(path):
            continue
        manifest = read_json(os.path.join(path, "manifest.json"), None)
        if manifest is None:
            debris.append(name)
            continue
        created[name] = (recorded.get(name) or {}).get("created_at") or manifest.get("built_at") or ""
    newest_first = sorted(created, key=lambda name: (created[name], name), reverse=True)
    keep_names = set(newest_first[:keep]) | set(_current_and_previous(root)) | set(protect)
    doomed = [name for name in newest_first + debris if name not in keep_names]
    for name in doomed:
        _hide_and_remove(os.path.join(releases_dir, name))
        _hide_and_remove(os.path.join(root, "wheels", name))
    return sorted(doomed)


def _hide_and_remove(path: str) -> None:
    """Rename first (atomic), then delete: an interrupted delete never leaves a release that looks whole.

    The `.prune-` prefix is the one vllm_release cleans up after an interrupted run.
    """
    if not os.path.lexists(path):
        return
    hidden = os.path.join(os.path.dirname(path), f".prune-{os.path.basename(path)}.{uuid.uuid4().hex}")
    os.rename(path, hidden)
    shutil.rmtree(hidden, ignore_errors=True)


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


class _Builder:
    """One build attempt: every step appends to the log and shares the deadline."""

    def __init__(self, opts: BuildOptions, paths: _Paths, deadline: Deadline, installer: str, python: str) -> None:
        self.opts = opts
        self.paths = paths
        self.deadline = deadline
        self.installer = installer
        self.python = python
        env = git_env()
        env.update(opts.build_env)
        env.update({"LC_ALL": "C", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"})
        self.env = env

    @property
    def venv_python(self) -> str:
        return os.path.join(self.paths.venv, "bin", "python")

    def note(self, text: str) -> None:
        os.makedirs(os.path.dirname(self.paths.log), exist_ok=True)
        with open(self.paths.log, "a", encoding="utf-8") as handle:
            handle.write(f"[{utc_now()}] {text}\n")

    def step(self, what: str, argv: List[str], cwd: Optional[str] = None) -> CommandResult:
        result = run_command(
            argv,
            self.deadline.remaining(),
            log_path=self.paths.log,
            env=self.env,
            cwd=cwd,
            grace=KILL_GRACE,
            tail_lines=TAIL_LINES,
        )
        if result.timed_out:
            survivors = f"; processes that would not die: {result.survivors}" if result.survivors else ""
            raise BuildError(
                f"{what} timed out: build_timeout={self.opts.build_timeout:.0f}s (fetch + build + install) "
                f"ran out; its process group was killed{survivors}. Raise build_timeout, or lower the build's "
                "cost (e.g. build_env MAX_JOBS / TORCH_CUDA_ARCH_LIST)"
            )
        if result.rc != 0:
            raise BuildError(f"{what} failed with exit code {result.rc}")
        return result

    def create_venv(self) -> None:
        site = ["--system-site-packages"] if self.opts.system_site_packages else []
        if self.installer == "uv":
            argv = ["uv", "venv", "--python", self.python, *site, self.paths.venv]
        else:
            argv = [self.python, "-m", "venv", *site, self.paths.venv]
        self.step("creating the venv", argv)

    def build_wheel(self, src: str) -> str:
        isolation = [] if self.opts.build_isolation else ["--no-build-isolation"]
        if self.installer == "uv":
            argv = ["uv", "build", "--wheel", "--python", self.venv_python, "--out-dir", self.paths.dist]
        else:
            argv = [self.venv_python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", self.paths.dist]
        self.step("building the wheel", argv + isolation + self.opts.pip_args + [src], cwd=src)
        built = _single_wheel(self.paths.dist)
        if not built:
            raise BuildError(f"the build produced no wheel in {self.paths.dist}")
        os.makedirs(self.paths.wheels, exist_ok=True)
        final = os.path.join(self.paths.wheels, os.path.basename(built))
        os.replace(built, final)  # a wheel in wheels/<name>/ is complete by construction
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

    def install(self, wheel: str) -> None:
        if self.installer == "uv":
            argv = ["uv", "pip", "install", "--python", self.venv_python]
        else:
            argv = [self.venv_python, "-m", "pip", "install"]
        self.step("installing the wheel", argv + self.opts.pip_args + [wheel])

    def fetch_source(self, resolution: Resolution, repo: str, mirror: str) -> None:
        commit = resolution.commit or ""
        extra = [resolution.full_ref] if resolution.kind == "ref" and resolution.full_ref else []
        try:
            ensure_mirror(repo, mirror, self.deadline.remaining(), self.paths.log, extra)
            if not commit_exists(mirror, commit):  # a SHA reachable from no branch or tag: ask for it
                with contextlib.suppress(GitError):  # a server that refuses says so in the log
                    ensure_mirror(repo, mirror, self.deadline.remaining(), self.paths.log, [commit])
            if not commit_exists(mirror, commit):
                raise BuildError(
                    f"commit {commit} does not exist in {redact_url(repo)} (or the server does not serve it by SHA);"
                    " check `ref`, or name it by a branch, tag or refs/pull/N/head"
                )
            checkout(mirror, commit, self.paths.src, self.deadline.remaining(), self.paths.log)
        except GitError as exc:
            raise BuildError(str(exc)) from exc


def _failure_message(cause: str, log_path: str) -> str:
    return (
        f"{cause}. The release was not created and `current` is unchanged. "
        f"Full log: {log_path}\n--- last lines of the log ---\n{tail(log_path, TAIL_LINES)}"
    )


def _make_release(
    opts: BuildOptions,
    builder: _Builder,
    resolution: Resolution,
    repo: str,
    mirror: str,
    inputs: Dict[str, Any],
    digest: str,
    name: str,
) -> Dict[str, Any]:
    paths = builder.paths
    commit = resolution.commit or ""
    started = time.monotonic()
    _hide_and_remove(paths.release)  # debris of a run that was killed outright (no manifest: we hold the lock)
    shutil.rmtree(paths.build, ignore_errors=True)
    builder.note(f"vllm_build {name}: {redact_url(repo)} {opts.ref} -> {commit}")
    builder.note("inputs: " + json.dumps(inputs, sort_keys=True))
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
                builder.fetch_source(resolution, repo, mirror)
        builder.create_venv()
        if not wheel:
            wheel = builder.build_wheel(paths.src)
        builder.install(wheel)
        wheel_sha = sha256_file(wheel)
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "name": name,
            "commit": commit,
            "requested_ref": opts.ref,
            "resolved_ref": resolution.full_ref,
            "repo": redact_url(repo),
            "inputs": inputs,
            "inputs_hash": digest,
            "wheel": {"path": wheel, "sha256": wheel_sha},
            "version": _wheel_version(wheel),
            "built_at": utc_now(),
            "build_seconds": round(time.monotonic() - started, 3),
            "log_path": paths.log,
            "source": source,
        }
        write_json_atomic(paths.manifest, manifest)  # last: from now on the release exists
        builder.note(f"release {name} complete")
    except BaseException as exc:
        _hide_and_remove(paths.release)
        shutil.rmtree(paths.build, ignore_errors=True)
        if isinstance(exc, (BuildError, CommandInterrupted, GitError, OSError, ValueError)):
            builder.note(f"FAILED: {exc}")
            raise BuildError(_failure_message(str(exc), paths.log)) from exc
        raise
    shutil.rmtree(paths.build, ignore_errors=True)
    return manifest


def _result(
    opts: BuildOptions,
    resolution: Resolution,
    name: Optional[str],
    digest: str,
    started: float,
    changed: bool,
    built: bool,
    manifest: Optional[Mapping[str, Any]],
    msg: str,
    pruned: Optional[List[str]] = None,
) -> Dict[str, Any]:
    wheel = (manifest or {}).get("wheel") or {}
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
        "duration": round(time.monotonic() - started, 3),
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
    """
    started = time.monotonic()
    deadline = Deadline(opts.build_timeout)
    if opts.wheel and not (opts.wheel.endswith(".whl") and os.path.isfile(opts.wheel)):
        raise BuildError(f"wheel {opts.wheel!r} is not a .whl file on this host; give the path of a wheel")
    try:
        repo = normalize_repo(opts.repo)
        python = _find_python(opts.python)
        installer = _find_installer(opts.installer)
        inputs = {
            "python": python,
            "python_version": _python_version(python),
            "installer": installer,
            "build_env": opts.build_env,
            "build_isolation": opts.build_isolation,
            "system_site_packages": opts.system_site_packages,
            "pip_args": opts.pip_args,
        }
        digest = inputs_hash(inputs)
        mirror = mirror_path(opts.root, repo)
        resolution = resolve_remote(repo, opts.ref, min(deadline.remaining(), 120.0))
        _check_expected(opts, resolution.commit, repo)

        if resolution.commit is None:  # short SHA: read an existing mirror (no lock needed to read)
            resolution.commit = resolve_short_sha(mirror, opts.ref, repo)
            _check_expected(opts, resolution.commit, repo)
        if resolution.commit:
            name = release_name(resolution.commit, digest)
            manifest = read_json(os.path.join(opts.root, "releases", name, "manifest.json"), None)
            if manifest is not None:
                return _result(opts, resolution, name, digest, started, False, False, manifest, f"{name} exists")
        if check_mode:
            if not resolution.commit:
                msg = f"would fetch {redact_url(repo)} to resolve the short SHA {opts.ref!r}, then build"
                return _result(opts, resolution, None, digest, started, True, False, None, msg)
            return _result(opts, resolution, name, digest, started, True, False, None, f"would build {name}")

        with host_lock(opts.root, deadline.remaining()):
            commit = resolution.commit
            if commit is None:
                fetch_log = os.path.join(opts.root, "logs", f"fetch-{os.path.basename(mirror)}.log")
                commit = fetch_short_sha(repo, mirror, opts.ref, deadline.remaining(), fetch_log)
                resolution.commit = commit
                _check_expected(opts, commit, repo)
            name = release_name(commit, digest)
            paths = _Paths(opts.root, name)
            manifest = read_json(paths.manifest, None)  # built by whoever held the lock before us
            if manifest is not None:
                return _result(opts, resolution, name, digest, started, False, False, manifest, f"{name} exists")
            builder = _Builder(opts, paths, deadline, installer, python)
            manifest = _make_release(opts, builder, resolution, repo, mirror, inputs, digest, name)
            pruned = prune_releases(opts.root, opts.keep_releases, protect=[name])
        built = manifest["source"] == "build"
        return _result(opts, resolution, name, digest, started, True, built, manifest, f"built {name}", pruned)
    except GitError as exc:
        raise BuildError(str(exc)) from exc
    except LockTimeout as exc:
        raise BuildError(str(exc)) from exc
