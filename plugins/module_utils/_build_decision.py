# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The precompiled decision of one vllm_build run, from its options: _precompiled.decide() fed by BuildOptions.

_precompiled decides from plain values and knows nothing of the options (they import _precompiled_data's MODES);
this file reads the options, fetches precompiled_base into the mirror when the decision needs it, and
predicts the decision in check mode from the mirror as it is.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_lookup import wheel_decided
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import BuildOptions
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import redact_url
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import Deadline
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import (
    GitError,
    commit_exists,
    ensure_mirror,
    fetch_ref,
    is_full_sha,
    normalize_repo,
    resolve_remote,
    rev_parse,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import (
    Decision,
    base_dest_ref,
    base_label,
    decide,
    local_base_wheels,
    needs_git,
    same_repo,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled_data import PrecompiledError, parse_base

__all__ = ["decide_for", "fetch_base", "fetch_base_and_decide", "needs_mirror", "predict_decision", "wheel_decision"]


def _base_unusable(opts: BuildOptions, label: str, problem: Exception) -> Decision:
    """The decision when precompiled_base cannot be had: auto builds in full; other modes re-raise."""
    if opts.precompiled != "auto":
        raise problem
    return Decision(False, opts.precompiled, f"precompiled_base {label} is unusable ({problem}): full build")


def needs_mirror(opts: BuildOptions) -> bool:
    """Whether the decision needs the commit and precompiled_base in the mirror; else decide_for(opts, inputs)."""
    return wheel_decision(opts) is None and needs_git(
        opts.precompiled, opts.precompiled_wheel, opts.precompiled_wheel_commit
    )


def decide_for(
    opts: BuildOptions,
    inputs: Mapping[str, Any],
    commit: Optional[str] = None,
    mirror: Optional[str] = None,
    base_commit: Optional[str] = None,
    label: str = "main",
    check_index: bool = True,
) -> Decision:
    """The decision of vllm_build's options, the one way the build gets it: the building host's (a wheel built
    elsewhere, wheel_decision), else decide() fed by the options, the wheel fitting the build's python
    (inputs) and this host. With the mirror (needs_mirror) it diffs the commit against the base and this
    host's base wheels."""
    taken = wheel_decision(opts)
    if taken is not None:
        return taken
    return decide(
        opts.precompiled,
        opts.precompiled_wheel,
        commit,
        mirror,
        base_commit,
        label,
        local_base_wheels(opts.root, inputs) if mirror else (),
        wheel_commit=opts.precompiled_wheel_commit,
        python_version=inputs.get("python_version"),
        variant=opts.build_env.get("VLLM_PRECOMPILED_WHEEL_VARIANT"),
        check_index=check_index,
    )


def wheel_decision(opts: BuildOptions) -> Optional[Decision]:
    """auto with a wheel built elsewhere: the building host's decision, taken as made (no repository needed).

    The release then carries mode `auto`, so a later auto lookup on this host accepts it as its own.
    """
    if not wheel_decided(opts):
        return None
    how = "the precompiled path" if opts.wheel_precompiled else "a full build"
    # The building host's reason travels with its wheel: a stale base wheel shows on every serving host.
    why = f": {opts.wheel_precompiled_reason}" if opts.wheel_precompiled_reason else ""
    reason = f"precompiled: auto, decided where the wheel was built ({how}){why}"
    return Decision(bool(opts.wheel_precompiled), "auto", reason)


def predict_decision(opts: BuildOptions, repo: str, mirror: str, commit: str, inputs: Mapping[str, Any]) -> Decision:
    """The decision in check mode: from the mirror as it is (read only), when it holds what is needed."""
    if not needs_mirror(opts):
        return decide_for(opts, inputs, check_index=False)
    base_url, base_ref = parse_base(opts.precompiled_base)
    label = base_label(base_url, base_ref)
    base_commit = None
    if os.path.isdir(mirror) and commit_exists(mirror, commit):
        base_commit = rev_parse(mirror, base_ref if same_repo(base_url, repo) else base_dest_ref(base_url or ""))
    if base_commit is None:
        if opts.precompiled == "always":  # precompiled for sure; only the commit to pin needs the mirror
            reason = (
                f"precompiled: always (the commit to pin is not known in check mode: the mirror does not hold "
                f"{commit[:12]} and {label} yet)"
            )
            return Decision(True, "always", reason, commit=commit)
        reason = (
            f"not decided in check mode: the mirror does not hold {commit[:12]} and {label} yet "
            "(the release name assumes a full build)"
        )
        return Decision(False, opts.precompiled, reason, decided=False)
    return decide_for(opts, inputs, commit, mirror, base_commit, label, check_index=False)


def fetch_base(repo: str, mirror: str, base: str, deadline: Deadline, log: str) -> str:
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


def fetch_base_and_decide(
    opts: BuildOptions, repo: str, mirror: str, commit: str, inputs: Mapping[str, Any], deadline: Deadline, log: str
) -> Decision:
    """The build's decision: fetch precompiled_base into the mirror, then decide (_precompiled)."""
    label = base_label(*parse_base(opts.precompiled_base))
    try:
        base_commit = fetch_base(repo, mirror, opts.precompiled_base, deadline, log)
    except (GitError, PrecompiledError) as exc:
        return _base_unusable(opts, label, exc)
    return decide_for(opts, inputs, commit, mirror, base_commit, label)
