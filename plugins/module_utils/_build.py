# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build a pinned ref of vLLM into a release that is complete or absent, never half there: the run.

The run resolves the ref, names the release from the commit and the build inputs (so "is it built?" is
one path lookup and re-runs do nothing: _build_lookup, all vllm_drift's look runs), takes the host lock,
plans (fetch what the precompiled decision needs, decide, name), hands one release attempt to
_build_release, prunes and returns the result (_build_result). Outside check mode build-status.json
follows it (_build_status).

The layers under this one (as kubernetes.core's k8s/ core): the options (_build_options), the host
environment (_build_host), the precompiled decision of the options (_build_decision over _precompiled),
where a build writes (_build_paths), one release attempt (_build_release) and its steps (_builder).
A release from an index (`version`) is _release_plan's (found or predicted) and _release_install's (made).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_budget import fit_after_build, fit_before_build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_decision import (
    decide_for,
    fetch_base_and_decide,
    needs_mirror,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_host import cache_env, derive_max_jobs, max_jobs
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_lookup import Resolved, check_expected, existing
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_names import inputs_hash, named, release_name
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    BUILD_ARGUMENT_SPEC,
    VLLM_BUILD_ARGUMENT_SPEC,
    BuildError,
    BuildOptions,
    build_options,
    option_secrets,
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
    host_locked,
    make_release,
    prune_after_build,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_result import exists, result
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_run import Make, run
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import STATUS_NAME, StatusFile
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import redact_url
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import Deadline
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import (
    GitError,
    Resolution,
    commit_exists,
    ensure_mirror,
    fetch_short_sha,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._installer import Installer
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import Decision
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled_data import PrecompiledError
from ansible_collections.vllm_ops.dflash.plugins.module_utils._release_install import install_release
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import release_path

# The names other files import from here (vllm_build, the tests) stay importable from here.
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
]


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


def build(opts: BuildOptions, check_mode: bool = False) -> Dict[str, Any]:
    """Resolve `opts.ref`, and build + install it as a release unless that release already exists.

    Returns the vllm_build result dict. Raises BuildError (unreachable repo, unknown ref,
    expected_commit mismatch, failed or timed-out build: the message names the log and its tail).
    Outside check mode, `<root>/build-status.json` follows the run from `resolve` to `done` or `failed`.
    """
    return run(opts, check_mode, _MAKE)


def _make_git(opts: BuildOptions, found: Resolved, status: StatusFile) -> Dict[str, Any]:
    """The build of a git ref's release that the run did not find: under the host lock."""
    repo, python, installer, inputs, mirror, resolution, deadline, started = found
    with host_locked(opts, deadline):
        if resolution.commit is None:
            fetch_log = os.path.join(opts.root, "logs", f"fetch-{os.path.basename(mirror)}.log")
            status.stage("fetch", f"fetching {redact_url(repo)} to resolve {opts.ref}", log_path=fetch_log)
            resolution.commit = fetch_short_sha(repo, mirror, opts.ref, deadline.remaining(), fetch_log)
            check_expected(opts, resolution.commit, repo)
        built = existing(opts, resolution.commit, inputs)  # built by whoever held the lock before us
        if built is not None:
            return exists(opts, resolution, built.name, built.digest, started, built.manifest)
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


_MAKE = Make(_make_git, install_release)
