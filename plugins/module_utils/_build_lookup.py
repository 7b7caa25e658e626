# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run of vllm_build up to the host lock: which release the options name here and whether it is built.

A run validates the options, resolves the ref (or, for `version`, probes what names a release from an index:
_release_plan), names the release from the commit and the build inputs and looks for it. Found, the run is
done; in check mode it predicts what a build would do. Only then does it need the build itself: `run` takes
that part as `make` (_build's, under the host lock), and vllm_drift's look is `lookup`, the run in check mode.

Apart from the build (_build, _build_release, _builder and what they import) so that the look's module, which
AnsiballZ ships to every host with every core it imports, carries only this part (issue 30: the scan of
vllm_drift's imports was most of a no-op's fixed controller CPU).
"""

from __future__ import annotations

import errno
import os
import time
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple, Union

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_budget import fit_before_build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_decision import predict_decision, wheel_decision
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_host import (
    find_installer,
    find_python,
    no_space_hint,
    probe_python,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_names import inputs_hash, named
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    BuildError,
    BuildOptions,
    OptionError,
    option_secrets,
    recorded_build_env,
    recorded_pip_args,
    validate,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_paths import builds_beside, read_manifest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_result import exists, result
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import StatusFile
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import linked_out, redact_url
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import Deadline
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import (
    GitError,
    Resolution,
    mirror_path,
    normalize_repo,
    resolve_remote,
    resolve_short_sha,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._installer import Installer
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import (
    PrecompiledError,
    compiled_from_its_sources,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._release_plan import ReleasePlan, plan_release
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import RELEASES_DIR, WHEELS_DIR, release_path

__all__ = ["Lookup", "Make", "Resolved", "check_expected", "existing", "lookup", "run"]


class Resolved(NamedTuple):
    """What the run of a git ref knows when the release is not there yet: all a build starts from."""

    repo: str
    python: str
    installer: Installer
    inputs: Dict[str, Any]
    mirror: str
    resolution: Resolution
    deadline: Deadline
    started: float


class Make(NamedTuple):
    """The build itself (_build's): a git ref's release, and a release from an index, each under the host lock."""

    git: Callable[[BuildOptions, Resolved, StatusFile], Dict[str, Any]]
    release: Callable[[BuildOptions, ReleasePlan, StatusFile], Dict[str, Any]]


def existing(opts: BuildOptions, commit: str, inputs: Mapping[str, Any]) -> Optional[Tuple[str, str, Dict]]:
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


def check_expected(opts: BuildOptions, commit: Optional[str], repo: str) -> None:
    expected = opts.expected_commit
    if expected and commit and not commit.startswith(expected):
        raise BuildError(
            f"ref {opts.ref!r} of {redact_url(repo)} resolves to {commit}, not the expected_commit {expected}; "
            "the ref moved: update expected_commit or pin ref to the expected SHA"
        )


def run(opts: BuildOptions, check_mode: bool, make: Optional[Make]) -> Dict[str, Any]:
    """vllm_build's run: the release found, predicted (check mode) or made by `make` (None: check mode only).

    Raises BuildError (unreachable repo, unknown ref, expected_commit mismatch, failed or timed-out build: the
    message names the log and its tail). Outside check mode, `<root>/build-status.json` follows the run from
    `resolve` to `done` or `failed`.
    """
    started = time.monotonic()
    validate(opts)
    status = StatusFile(
        opts.root, opts.run_id, opts.label, enabled=not check_mode, secrets=sorted(option_secrets(vars(opts)))
    )
    try:
        status.stage("resolve", f"resolving {opts.label}")
        # a release from an index (`version`): no git
        found = plan_release(opts, check_mode, started) if opts.version else _resolve(opts, check_mode, started)
        if isinstance(found, dict):  # found, or predicted in check mode
            done = found
        elif make is None:
            raise ValueError("a run outside check mode needs the build (make)")
        elif isinstance(found, ReleasePlan):
            done = make.release(opts, found, status)
        else:
            done = make.git(opts, found, status)
    except BaseException as exc:
        cause = exc
        if isinstance(exc, (BuildError, GitError, PrecompiledError)):
            cause = BuildError(status.scrub(str(exc)))
        elif isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
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
    """Whether the release the options name is built here, changing nothing (the run in check mode)."""
    found = run(opts, check_mode=True, make=None)
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


def _resolve(opts: BuildOptions, check_mode: bool, started: float) -> Union[Dict[str, Any], Resolved]:
    """A git ref's release found (its result), predicted in check mode (the result), else what a build needs."""
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
    check_expected(opts, resolution.commit, repo)

    if resolution.commit is None:  # short SHA: read an existing mirror (no lock needed to read)
        resolution.commit = resolve_short_sha(mirror, opts.ref, repo)
        check_expected(opts, resolution.commit, repo)
    if resolution.commit:
        found = existing(opts, resolution.commit, inputs)
        if found is not None:
            name, digest, manifest = found
            return exists(opts, resolution, name, digest, started, manifest)
    if not check_mode:
        return Resolved(repo, python, installer, inputs, mirror, resolution, deadline, started)
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
