# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One release attempt: what it builds (Plan, its name), the builder's steps in order, the manifest, the swap in.

A release is `<root>/releases/<sha12>-<inputs8>/` (venv/ + manifest.json). The name is a function of the
commit and the build inputs. The manifest is written last: a directory without it is debris from an
interrupted run and is removed. On any failure the half release and the checkout go, the log stays, and
`current` is never touched. A release `current` names without a valid manifest is built beside it
(releases/.building-<name>) and swapped in with two renames.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_names import named
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    BuildError,
    BuildOptions,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_paths import STAGING_PREFIX, Paths, relocate_venv
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import (
    redact_url,
    remove_tree_within,
    sha256_file,
    utc_now,
    write_json_atomic,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import CommandInterrupted, Deadline, tail
from ansible_collections.vllm_ops.dflash.plugins.module_utils._dependency_plan import DependencyPlan
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import GitError, Resolution
from ansible_collections.vllm_ops.dflash.plugins.module_utils._lock import LockTimeout, host_lock
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import Decision
from ansible_collections.vllm_ops.dflash.plugins.module_utils._python_only import Refused, build_from_earlier
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import (
    RELEASES_DIR,
    manifest_path,
    release_path,
    remove_hidden_first,
    run_action_unlocked,
)

__all__ = [
    "MANIFEST_SCHEMA",
    "Plan",
    "discard_attempt",
    "failure_message",
    "host_locked",
    "make_release",
    "prune_after_build",
    "remove_debris",
    "swap_in",
]

MANIFEST_SCHEMA = 1

# The builder (and the build backends, wheel overlay and tags it imports) only where a release is made: vllm_drift's
# look runs this in check mode on every host and never builds (issue 30: its imports were most of its host CPU).
if TYPE_CHECKING:
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._builder import Builder


def host_locked(opts: BuildOptions, deadline: Deadline) -> contextlib.ExitStack:
    """The host lock a release attempt runs under (held for the caller's `with`), taken within the deadline;
    else a BuildError naming who holds it."""
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
    return lock


def prune_after_build(root: str, keep: int, made: str) -> List[str]:
    """vllm_release's prune, run by the build that holds the host lock, never removing the release it made.

    keep < 1 disables pruning after a build (the module's keep_releases=0), where vllm_release's own
    prune with 0 keeps only the current and previous releases. Returns the names removed.
    """
    if keep < 1:
        return []
    return list(run_action_unlocked(root, "prune", keep_releases=keep, protect=[made])["pruned"])


def _check_wheel_sha256(wheel: str, expected: Optional[str]) -> None:
    """A wheel given from elsewhere is installed only with the sha256 its build gave it (issue 28 case 2): the
    copy taken into wheels/<name>/ is what is hashed, and removed on a mismatch (a later run would reuse it)."""
    if not expected:
        return
    found = sha256_file(wheel)
    if found != expected.strip().lower():
        os.unlink(wheel)
        raise BuildError(
            f"the wheel {os.path.basename(wheel)} has sha256 {found}, not {expected.strip().lower()} (wheel_sha256, "
            "the build's): it was altered after its build or on the way. Nothing was installed and every release "
            "is as it was. Fix: rebuild or copy the wheel again from the building host"
        )


def _wheel_version(path: str) -> str:
    parts = os.path.basename(path).split("-")
    return parts[1] if len(parts) >= 5 else ""


def failure_message(cause: str, log_path: str) -> str:
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._builder import TAIL_LINES

    return (
        f"{cause}. The release was not created and `current` is unchanged. "
        f"Full log: {log_path}\n--- last lines of the log ---\n{tail(log_path, TAIL_LINES)}"
    )


class Plan:
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
        self.digest, self.name = named(self.commit, inputs, decision.use)
        self.max_jobs = dict(max_jobs)
        self.added_env = dict(added_env)
        self.existing: Optional[Dict[str, Any]] = None  # the manifest, when the release exists already


def remove_debris(root: str) -> None:
    """Checkouts and staged releases of builds that were killed outright (we hold the host lock: no other
    build runs). Their TMPDIR, with pip's build environments, is inside the checkout's directory."""
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(os.path.join(root, "build")):
            remove_tree_within(root, os.path.join(root, "build", name))
    releases = os.path.join(root, RELEASES_DIR)
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(releases)):
            staged = os.path.join(releases, name)
            final = os.path.join(releases, name[len(STAGING_PREFIX) :])
            if not name.startswith(STAGING_PREFIX):
                continue
            if not os.path.lexists(final) and os.path.isfile(manifest_path(staged)):
                os.rename(staged, final)  # killed between the two renames of a swap: finish it
            else:
                remove_tree_within(root, staged)


def swap_in(paths: Paths) -> None:
    """Put the release built beside its final place there: the old directory (incomplete, named by
    `current`) is renamed away and the new one renamed in, two renames in one directory."""
    relocate_venv(paths.venv, paths.venv, os.path.join(paths.final, "venv"))
    old = os.path.join(os.path.dirname(paths.final), f"{STAGING_PREFIX}{os.path.basename(paths.final)}.old")
    remove_tree_within(paths.root, old)
    os.rename(paths.final, old)
    os.rename(paths.release, paths.final)
    remove_tree_within(paths.root, old)


def make_release(opts: BuildOptions, builder: Builder, plan: Plan) -> Dict[str, Any]:
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._builder import single_wheel

    paths = builder.paths
    status = builder.status
    started = time.monotonic()
    remove_debris(opts.root)
    if not paths.release.startswith(release_path(opts.root, STAGING_PREFIX)):
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
    python_only: Optional[Dict[str, Any]] = None
    try:
        if opts.wheel:
            wheel = builder.adopt_wheel(opts.wheel)
            source = "wheel"
            _check_wheel_sha256(wheel, opts.wheel_sha256)
        else:
            wheel = single_wheel(paths.wheels) or ""
            source = "build" if not wheel else "wheel"
            if wheel:
                builder.note(f"reusing the wheel built earlier: {wheel}")
            else:
                python_only = _python_only(opts, builder, plan)
                wheel = (python_only or {}).pop("wheel", "")
            if not wheel:
                status.stage("fetch", f"checking out {plan.commit[:12]}")
                builder.checkout(plan.mirror, plan.commit)
        if python_only and python_only["used"]:
            wheel_sha = python_only.pop("wheel_sha256")
            builder.install_record = {"how": "python_only", "from": python_only["from"]}
        else:
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
            "python_only": python_only,
        }
        # Last: from now on the release exists. 0600: what the masking rule misses is still no one else's.
        write_json_atomic(paths.manifest, manifest, mode=0o600)
        if paths.release != paths.final:
            swap_in(paths)
            builder.note(f"swapped the new {plan.name} in place of the incomplete one")
        builder.note(f"release {plan.name} complete")
    except BaseException as exc:
        discard_attempt(opts.root, builder, exc)
        raise
    remove_tree_within(opts.root, paths.build)
    return manifest


def _python_only(opts: BuildOptions, builder: Builder, plan: Plan) -> Optional[Dict[str, Any]]:
    """The python-only bump of a precompiled build (_python_only), or its refusal (used: false, the reason);
    None where it is not tried. The release name is the build's: the same files, so the same inputs."""
    if opts.python_only == "never" or not plan.decision.use:
        return None
    builder.status.stage("install", f"python-only bump of {plan.commit[:12]} from an earlier release")
    started = time.monotonic()
    if builder.installer.name != "uv":
        # pip compiles bytecode that its RECORD lists (the bump links no __pycache__) and marks only what was
        # asked for as REQUESTED (the bump's pinned dependencies would differ): the normal build.
        reason = "the installer is pip: the python-only bump is made with uv (installer: uv or auto)"
        builder.note(f"python-only bump not used ({reason}): the normal build")
        return {"used": False, "reason": reason, "files_changed": None, "seconds": 0.0}
    try:
        return build_from_earlier(
            opts.root, plan.digest, plan.commit, plan.mirror, "vllm", builder.paths, builder.note,
            lambda wheel: DependencyPlan(builder, wheel),
        )  # fmt: skip
    except Refused as exc:
        builder.note(f"python-only bump not used ({exc}): the normal build")
        return {
            "used": False,
            "reason": str(exc),
            "files_changed": None,
            "seconds": round(time.monotonic() - started, 2),
        }


def discard_attempt(root: str, builder: Builder, exc: BaseException) -> None:
    """After a failed attempt: remove the half release (never what serves) and the build directory, and raise
    the BuildError that names the log; returns (the caller re-raises) for what is no build failure (an
    interrupt)."""
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_host import no_space_hint

    paths = builder.paths
    if paths.release != paths.final:
        remove_tree_within(root, paths.release)  # the serving directory stays as it was
    else:
        remove_hidden_first(paths.release)
    remove_tree_within(root, paths.build)
    if isinstance(exc, (BuildError, CommandInterrupted, GitError, OSError, ValueError)):
        cause = str(exc)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            cause += no_space_hint(root, "No space left on device")
        builder.note(f"FAILED: {cause}")
        raise BuildError(failure_message(builder.status.scrub(cause), paths.log)) from exc
