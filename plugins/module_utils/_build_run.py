# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run of vllm_build up to the host lock: the release found, predicted in check mode, or handed to the build.

A run validates the options and looks for the release they name (_build_lookup, all vllm_drift's look runs).
Found, the run is done; in check mode it predicts what a build would do (the precompiled decision, the disk).
Only then does it need the build itself: `run` takes that part as `make` (_build's, under the host lock).
"""

from __future__ import annotations

import errno
import time
from typing import Any, Callable, Dict, NamedTuple, Optional, Union

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_budget import fit_before_build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_decision import predict_decision
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_host import no_space_hint
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_lookup import (
    ReleasePlan,
    Resolved,
    resolve,
    short_sha_msg,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_names import inputs_hash, named
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    BuildError,
    BuildOptions,
    option_secrets,
    validate,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_paths import builds_beside
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_result import exists, result
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import StatusFile
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import GitError
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled_data import PrecompiledError
from ansible_collections.vllm_ops.dflash.plugins.module_utils._release_plan import plan_release

__all__ = ["Make", "run"]


class Make(NamedTuple):
    """The build itself (_build's): a git ref's release, and a release from an index, each under the host lock."""

    git: Callable[[BuildOptions, Resolved, StatusFile], Dict[str, Any]]
    release: Callable[[BuildOptions, ReleasePlan, StatusFile], Dict[str, Any]]


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


def _resolve(opts: BuildOptions, check_mode: bool, started: float) -> Union[Dict[str, Any], Resolved]:
    """A git ref's release found (its result), predicted in check mode (the result), else what a build needs."""
    resolved, found = resolve(opts, started)
    resolution, inputs, mirror = resolved.resolution, resolved.inputs, resolved.mirror
    if found is not None:
        return exists(opts, resolution, found.name, found.digest, started, found.manifest)
    if not check_mode:
        return resolved
    if not resolution.commit:
        msg = short_sha_msg(resolved.repo, opts.ref)
        return result(
            opts, resolution, name=None, digest=inputs_hash(inputs), started=started, changed=True,
            built=False, manifest=None, msg=msg,
        )  # fmt: skip
    decision = predict_decision(opts, resolved.repo, mirror, resolution.commit, inputs)
    digest, name = named(resolution.commit, inputs, decision.use)
    msg = f"would build {name}"
    if builds_beside(opts.root, name):
        msg += " beside the incomplete release `current` names (no valid manifest.json), then swap it in"
    disk = fit_before_build(opts, name, check_mode=True, keep=[mirror])
    return result(
        opts, resolution, name=name, digest=digest, started=started, changed=True, built=False, manifest=None,
        msg=msg, decision=decision, disk=disk,
    )  # fmt: skip
