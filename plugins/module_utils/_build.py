# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build a pinned ref of vLLM into a release that is complete or absent, never half there: the run.

The run resolves the ref, names the release from the commit and the build inputs (so "is it built?" is
one path lookup and re-runs do nothing), takes the host lock, plans (fetch what the precompiled
decision needs, decide, name), hands one release attempt to _build_release, prunes and returns the
result (_build_result). Outside check mode build-status.json follows it (_build_status).

The layers under this one (as kubernetes.core's k8s/ core): the options (_build_options), the host
environment (_build_host), the precompiled decision of the options (_build_decision over _precompiled),
where a build writes (_build_paths), one release attempt (_build_release) and its steps (_builder).
A release from an index (`version`) is _release_install's run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_decision import (
    decide_for,
    fetch_base_and_decide,
    needs_mirror,
    predict_decision,
    wheel_decision,
)
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
    VLLM_BUILD_ARGUMENT_SPEC,
    BuildError,
    BuildOptions,
    OptionError,
    build_options,
    option_secrets,
    recorded_build_env,
    recorded_pip_args,
    validate,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_paths import (
    Paths,
    builds_beside,
    log_path,
    read_manifest,
    wheels_path,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_release import (
    MANIFEST_SCHEMA,
    Plan,
    failure_message,
    fit_after_build,
    fit_before_build,
    host_locked,
    inputs_hash,
    make_release,
    named,
    prune_after_build,
    release_name,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_result import exists, result
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import STATUS_NAME, StatusFile
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import linked_out, redact_url
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import Deadline
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import (
    GitError,
    Resolution,
    commit_exists,
    ensure_mirror,
    fetch_short_sha,
    mirror_path,
    normalize_repo,
    resolve_remote,
    resolve_short_sha,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._installer import Installer
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import (
    Decision,
    PrecompiledError,
    compiled_from_its_sources,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._release_install import install_release
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import RELEASES_DIR, WHEELS_DIR, release_path

# The names other files import from here (the modules, _drift, the tests) stay importable from here.
__all__ = [
    "BUILD_ARGUMENT_SPEC",
    "MANIFEST_SCHEMA",
    "STATUS_NAME",
    "VLLM_BUILD_ARGUMENT_SPEC",
    "BuildError",
    "BuildOptions",
    "Lookup",
    "StatusFile",
    "build",
    "build_options",
    "cache_env",
    "derive_max_jobs",
    "inputs_hash",
    "lookup",
    "option_secrets",
    "prune_after_build",
    "release_name",
    "url_secrets",
]

# vllm_drift imports the old name.
url_secrets = option_secrets


def _existing(opts: BuildOptions, commit: str, inputs: Mapping[str, Any]) -> Optional[Tuple[str, str, Dict]]:
    """An already built release of `commit` that this run accepts: (name, digest, manifest).

    auto accepts a full build, and a precompiled one only if auto decided it (from the diff): one forced
    with `always` may hold compiled modules that do not match the commit's sources.
    """
    choices = {"never": [False], "always": [True]}.get(opts.precompiled, [False, True])
    if wheel_decision(opts) is not None:  # the wheel's own variant, not an earlier build of the other
        choices = [bool(opts.wheel_precompiled)]
    for use in choices:
        digest, name = named(commit, inputs, use)
        manifest = read_manifest(release_path(opts.root, name))
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
        if opts.version:  # a release from an index: no git
            done = install_release(opts, check_mode, started, status)
        else:
            done = _resolve_and_build(opts, check_mode, started, status)
    except BaseException as exc:
        cause = exc
        if isinstance(exc, (BuildError, GitError, PrecompiledError)):
            cause = BuildError(status.scrub(str(exc)))
        elif isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            from ansible_collections.vllm_ops.dflash.plugins.module_utils._builder import no_space_hint

            cause = BuildError(f"{exc}{no_space_hint(opts.root, str(exc))}")
        status.stage("failed", (str(cause).splitlines() or [type(exc).__name__])[0][:300])
        if cause is not exc:
            raise cause from exc
        raise
    done["stage_seconds"] = status.durations()
    status.stage("done", done["msg"], release_name=done["release_name"], commit=done["commit"])
    return done


class Lookup(NamedTuple):
    """What the build options name on this host, read only (the check-mode run): vllm_drift's question."""

    release_name: Optional[str]  # None: a short SHA the mirror cannot resolve yet
    commit: Optional[str]
    built: bool  # the release is there, complete: a run would change nothing
    msg: str  # "<name> exists", or what a run would do


def lookup(opts: BuildOptions) -> Lookup:
    """Whether the release the options name is built here, changing nothing (build in check mode)."""
    found = build(opts, check_mode=True)
    return Lookup(found["release_name"], found["commit"], not found["changed"], found["msg"])


# The directories of `root` a build deletes in (src/: a half mirror): a link that leads out of `root` would
# make it delete there.
_OWN_DIRS = ("build", RELEASES_DIR, WHEELS_DIR, "src")


def _refuse_linked_dirs(root: str) -> None:
    """Refuse a root whose build/, releases/, wheels/ or src/ lies outside it (a symlink to a scratch disk): every
    build deletes debris and half releases in them, which would then be whatever else lives there."""
    for name in _OWN_DIRS:
        path = os.path.join(root, name)
        if os.path.lexists(path) and linked_out(root, path):
            raise OptionError(
                f"{path} leads out of {root} (to {os.path.realpath(path)}); vllm_build deletes the debris of "
                f"earlier builds in it, so it would delete what else lives there. Nothing was changed. Fix: make "
                f"{path} a directory of its own (mount the disk there, or bind-mount a directory of it), or "
                "point root at the disk"
            )


def _resolve_and_build(opts: BuildOptions, check_mode: bool, started: float, status: StatusFile) -> Dict[str, Any]:
    _refuse_linked_dirs(opts.root)
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
            return exists(opts, resolution, name, digest, started, manifest)
    if check_mode:
        if not resolution.commit:
            msg = f"would fetch {redact_url(repo)} to resolve the short SHA {opts.ref!r}, then build"
            return result(
                opts, resolution, name=None, digest=inputs_hash(inputs), started=started, changed=True,
                built=False, manifest=None, msg=msg,
            )  # fmt: skip
        decision = predict_decision(opts, repo, mirror, resolution.commit, inputs)
        digest, name = named(resolution.commit, inputs, decision.use)
        msg = f"would build {name}"
        if builds_beside(opts.root, name):
            msg += " beside the incomplete release `current` names (no valid manifest.json), then swap it in"
        disk = fit_before_build(opts, name, check_mode=True, keep=[mirror])
        return result(
            opts, resolution, name=name, digest=digest, started=started, changed=True, built=False, manifest=None,
            msg=msg, decision=decision, disk=disk,
        )  # fmt: skip

    with host_locked(opts, deadline):
        if resolution.commit is None:
            fetch_log = os.path.join(opts.root, "logs", f"fetch-{os.path.basename(mirror)}.log")
            status.stage("fetch", f"fetching {redact_url(repo)} to resolve {opts.ref}", log_path=fetch_log)
            resolution.commit = fetch_short_sha(repo, mirror, opts.ref, deadline.remaining(), fetch_log)
            _check_expected(opts, resolution.commit, repo)
        found = _existing(opts, resolution.commit, inputs)  # built by whoever held the lock before us
        if found is not None:
            name, digest, manifest = found
            return exists(opts, resolution, name, digest, started, manifest)
        plan = _plan(opts, resolution, repo, mirror, inputs, installer, deadline, status)
        if plan.existing is not None:
            return exists(opts, resolution, plan.name, plan.digest, started, plan.existing)
        # Never remove or rebuild in place what serves: a release `current` names without a valid
        # manifest is built beside and swapped in.
        paths = Paths(opts.root, plan.name, status.data.get("log_path"), staging=builds_beside(opts.root, plan.name))
        status.update(release_name=plan.name, commit=plan.commit, log_path=paths.log)
        from ansible_collections.vllm_ops.dflash.plugins.module_utils._builder import Builder, BuilderOptions

        disk = fit_before_build(opts, plan.name, check_mode=False, keep=[mirror])  # fails before the attempt
        builder = Builder(BuilderOptions.of(opts), paths, deadline, installer, python, status, plan.added_env)
        manifest = make_release(opts, builder, plan)
        pruned = prune_after_build(opts.root, opts.keep_releases, plan.name)
        disk = fit_after_build(opts, plan.name, disk, keep=[mirror])
    return result(
        opts, resolution, name=plan.name, digest=plan.digest, started=started, changed=True,
        built=manifest["source"] == "build", manifest=manifest, msg=f"built {plan.name}", pruned=pruned, disk=disk,
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
) -> Plan:
    """Fetch what the decision and the build need, decide, and name the release (under the host lock).

    The plan's `existing` is the manifest when the decided release turns out to exist already.
    """
    # The builder only here, under the lock of a real build: never in vllm_drift's check-mode look.
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._builder import note, single_wheel

    commit = resolution.commit or ""
    decision = None if needs_mirror(opts) else decide_for(opts, inputs)
    need_source = not opts.wheel
    name = None
    if decision is not None:
        name = named(commit, inputs, decision.use)[1]
        need_source = need_source and single_wheel(wheels_path(opts.root, name)) is None
    log = None
    if need_source or decision is None:
        log = log_path(opts.root, name or f"{commit[:12]}-pending")
        status.stage("fetch", f"fetching {redact_url(repo)}", commit=commit, log_path=log)
        note(log, f"vllm_build: fetching {redact_url(repo)} for {opts.ref} -> {commit}")
        try:
            _fetch_commit(repo, mirror, resolution, deadline, log)
            if decision is None:
                decision = fetch_base_and_decide(opts, repo, mirror, commit, inputs, deadline, log)
        except (BuildError, GitError, PrecompiledError) as exc:
            note(log, f"FAILED: {exc}")
            raise BuildError(failure_message(str(exc), log)) from exc
    added_env, jobs = _added_env(opts, installer, decision)
    plan = Plan(resolution, repo, mirror, inputs, decision, jobs, added_env)
    if log is not None and name is None:
        manifest = read_manifest(release_path(opts.root, plan.name))
        if manifest is not None:  # e.g. made by `always` and found again by auto's own decision
            os.unlink(log)
            plan.existing = manifest
            return plan
        final = log_path(opts.root, plan.name)
        os.replace(log, final)  # the fetch's output opens the release's build log
        status.data["log_path"] = final
    return plan


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
