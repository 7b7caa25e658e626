#!/usr/bin/python
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_release
short_description: Activate, roll back, prune and judge vLLM releases on a host
description:
  - Manages the releases that M(vllm_ops.dflash.vllm_build) leaves under O(root)C(/releases/) - the
    C(current) symlink that the service runs and the release history in O(root)C(/state.json).
  - C(current) is a relative symlink C(releases/<name>), swapped atomically (a temporary link renamed over
    the old one), so there is no moment without a C(current).
  - A complete release directory (one with C(manifest.json)) that C(state.json) does not know yet, for example
    one just built, is adopted with status C(built); its creation time is the manifest's C(built_at).
  - Every action holds the host lock O(root)C(/.lock) (the one builds take), so a swap never races a build.
    A read-only run (O(action=status) or check mode) waits for the lock only when the lock file exists,
    and creates nothing.
  - When C(state.json) and the C(current) link disagree (an interrupted swap), the link wins, with a warning.
  - With O(keep_files), the same run copies what the release served with (config, env file, unit) to their
    last good copies, which a rollback restores; the gate's bookkeeping after a pass is then one call.
version_added: 0.1.0
author: vllm_ops maintainers (@vllm-ops)
extends_documentation_fragment:
  - vllm_ops.dflash.attributes
  - vllm_ops.dflash.common
  - vllm_ops.dflash.common.keep_releases
  - vllm_ops.dflash.common.disk_budget
attributes:
  check_mode:
    support: full
    details:
      - Reports what would change (C(changed), C(current), C(previous), C(releases), C(pruned), C(kept),
        C(diff)) and changes nothing.
  diff_mode:
    support: full
    details:
      - Before and after of the current and previous release and of each release's status, as text; with
        O(keep_files), of each last good copy (whether it equals its file, and its mode; never the content).
  idempotent:
    support: full
    details:
      - Activating the current release, rolling back explicitly to it, marking a release with the status,
        reason and details it already has, pruning an already pruned root, and keeping copies that already
        have their file's content, mode and owner report no change.
      - O(action=rollback) without O(release) moves to another release every time it is run.
options:
  root:
    description: The vLLM root holding C(releases/), C(current), C(wheels/) and C(state.json).
  action:
    description:
      - V(activate) points C(current) at O(release) and records it (status C(active), C(previous) = the old current).
      - V(rollback) points C(current) at O(release), or without it at the newest release activated before the
        current one that is not C(failed) and still exists. A C(good) release stays C(good). It marks nothing
        failed by itself; run O(action=mark_failed) first to keep a bad release out of later rollbacks.
      - V(prune) deletes all but the O(keep_releases) newest releases (by creation order in C(state.json),
        never file times) with their C(wheels/<name>) directories. The current and previous releases are
        always kept, on top of O(keep_releases). Directories without C(manifest.json) are debris of
        interrupted builds (no build runs while the host lock is held) and are removed too. Entries of
        releases whose directory is already gone are dropped from C(state.json).
      - V(mark_good) and V(mark_failed) set the status of O(release) (default the current release),
        store O(reason), and store O(details) as the release's C(gate) record. Marking the current
        release failed does not move C(current); use O(action=rollback) for that.
      - V(keep) only keeps the O(keep_files) copies (for a rollout whose gate did not run, disabled or in check
        mode); it marks nothing and leaves C(state.json) as it is.
      - V(status) changes nothing and returns the releases and history. Deprecated (removed in 1.0.0); use
        M(vllm_ops.dflash.vllm_release_info).
    type: str
    choices: [activate, rollback, prune, mark_good, mark_failed, keep, status]
    default: status
  release:
    description:
      - The release to act on, given as its directory (for example C(/opt/vllm/releases/3cfc8f8b7a1b-1a2b3c4d),
        or C(/opt/vllm/current)), its name, or a unique prefix (at least 4 hex digits) of its commit or name.
      - Required for O(action=activate).
    type: str
  keep_releases:
    description: How many of the newest releases O(action=prune) keeps, besides the current and previous ones.
  disk_budget_gb:
    description:
      - With O(action=prune) only (refused with the other actions) - after the releases beyond O(keep_releases),
        the oldest parts of the root go while it holds more than this.
  reason:
    description:
      - Why; stored with the release for O(action=mark_good) / O(action=mark_failed) (a mark without
        O(reason) clears an earlier one), and in the history entry for every action that changes something.
    type: str
  details:
    description:
      - A record to keep as the release's C(gate) entry with O(action=mark_good) or O(action=mark_failed),
        for example the result of M(vllm_ops.dflash.acceptance_gate). The other actions ignore it.
    type: dict
  keep_files:
    description:
      - Files to copy to their last good copies, with O(action=mark_good) (after the mark is written) or
        O(action=keep); required for O(action=keep), refused with the other actions.
      - Every file is read before anything is written; a missing one that is not O(keep_files[].optional)
        fails the run with nothing changed.
      - A copy is replaced atomically (a temporary file in its directory, renamed over it) and has its
        O(keep_files[].mode) from its creation, so a copy of secrets is never readable by others. It is owned by
        the user the module runs as (root in the roles).
    type: list
    elements: dict
    suboptions:
      path:
        description: The file that the release serves with.
        type: path
        required: true
      last_good:
        description: Its last good copy.
        type: path
        required: true
      mode:
        description: The copy's mode, in octal (V('0644'), V('0600') for secrets).
        type: str
        required: true
      optional:
        description: A missing O(keep_files[].path) is not kept (an earlier copy stays) instead of failing.
        type: bool
        default: false
  lock_timeout:
    description: Seconds to wait for the host lock held by a build or another swap before failing.
    type: float
    default: 600
notes:
  - Runs on the target with its system Python and the standard library only.
seealso:
  - module: vllm_ops.dflash.vllm_build
  - module: vllm_ops.dflash.vllm_facts
"""

EXAMPLES = r"""
- name: Make the new build the running release
  vllm_ops.dflash.vllm_release:
    action: activate
    release: "{{ build.release }}"
  register: activation
  notify: Restart vllm

- name: Record a passed gate
  vllm_ops.dflash.vllm_release:
    action: mark_good
    details: "{{ gate }}"

- name: Record a passed gate and keep the config and env file it passed with, in one call
  vllm_ops.dflash.vllm_release:
    action: mark_good
    details: "{{ gate }}"
    keep_files:
      - {path: /etc/vllm/default.yaml, last_good: /etc/vllm/default.yaml.last-good, mode: "0644"}
      - {path: /etc/vllm/default.env, last_good: /etc/vllm/default.env.last-good, mode: "0600"}

- name: Record a failed gate and go back to the last release that was not failed
  block:
    - name: Mark the current release failed
      vllm_ops.dflash.vllm_release:
        action: mark_failed
        reason: "{{ gate.msg }}"
        details: "{{ gate }}"
    - name: Roll back
      vllm_ops.dflash.vllm_release:
        action: rollback
        reason: "gate failed"

- name: Activate by commit prefix
  vllm_ops.dflash.vllm_release:
    action: activate
    release: 3cfc8f8b7

- name: Keep the three newest releases (and the current and previous ones)
  vllm_ops.dflash.vllm_release:
    action: prune
    keep_releases: 3

- name: Which release runs, and which passed their gate (deprecated; vllm_ops.dflash.vllm_release_info)
  vllm_ops.dflash.vllm_release:
    action: status
  register: releases
"""

RETURN = r"""
current:
  description: Name of the current release after the action (predicted in check mode); V(null) when none.
  returned: always
  type: str
  sample: 3cfc8f8b7a1b-1a2b3c4d
previous:
  description: Name of the release that was current before the last switch; V(null) when none.
  returned: always
  type: str
  sample: b0b2f27da0c4-9f8e7d6c
last_good:
  description:
    - The release that served last with a passed gate (status C(good)) and is still complete, after the
      action; what a failed or unfinished rollout goes back to. A current release that is not C(good) is
      never it. V(null) when there is none.
  returned: always
  type: str
  sample: b0b2f27da0c4-9f8e7d6c
release:
  description: Name of the release the action resolved O(release) to (or the current one for C(mark_*)).
  returned: always
  type: str
  sample: 3cfc8f8b7a1b-1a2b3c4d
releases:
  description:
    - Every known release, newest first. C(path) is V(null) when its directory no longer exists.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Release name, C(<sha12>-<inputs8>).
      type: str
    commit:
      description: Full commit the release was built from (from its manifest).
      type: str
    status:
      description: One of C(built), C(active), C(good), C(failed).
      type: str
    path:
      description: The release directory.
      type: str
    created_at:
      description: The manifest's C(built_at) (UTC, ISO 8601).
      type: str
    activated_at:
      description: Last time it was made current.
      type: str
    reason:
      description: The O(reason) of its last mark.
      type: str
    gate:
      description: The O(details) of its last mark.
      type: dict
  sample:
    - name: 3cfc8f8b7a1b-1a2b3c4d
      commit: 3cfc8f8b7a1b2c3d4e5f60718293a4b5c6d7e8f9
      status: good
      path: /opt/vllm/releases/3cfc8f8b7a1b-1a2b3c4d
      created_at: "2026-11-29T20:00:00Z"
      activated_at: "2026-11-29T20:05:00Z"
      reason: null
      gate: {passed: true, mean_acceptance_length: 6.1}
history:
  description:
    - The history of C(state.json), oldest first.
    - Items have C(at), C(action), C(release), and C(from) / C(reason) where known.
  returned: always
  type: list
  elements: dict
  sample:
    - {at: "2026-11-29T20:05:00Z", action: activate, release: 3cfc8f8b7a1b-1a2b3c4d, from: b0b2f27da0c4-9f8e7d6c}
pruned:
  description:
    - Releases whose directory (and wheels) O(action=prune) removed, or would remove in check mode,
      unfinished builds included.
  returned: always
  type: list
  elements: str
forgotten:
  description: Releases whose directory was already gone and whose C(state.json) entry O(action=prune) dropped.
  returned: always
  type: list
  elements: str
incomplete:
  description:
    - Directories under C(releases/) without C(manifest.json) (unfinished builds) left after the action.
      They are never activated; O(action=prune) removes them.
  returned: always
  type: list
  elements: str
disk:
  description:
    - With O(disk_budget_gb) - the budget and the root's bytes before and after the prune, and what went (or
      would go, in check mode), in the order it went. Null without O(disk_budget_gb).
  returned: always
  type: dict
  contains:
    budget_bytes:
      description: O(disk_budget_gb) in bytes.
      type: int
    need_bytes:
      description: Bytes to keep free besides the root's (0 for a prune).
      type: int
    used_bytes_before:
      description: What the root held before (allocated blocks, each inode once).
      type: int
    used_bytes_after:
      description: What it holds after.
      type: int
    freed:
      description: Each part that went - its C(path), C(kind) (C(release), C(wheels), C(mirror), C(uv_cache),
        C(pip_cache), C(compile_cache), C(overlay)) and the C(bytes) it freed.
      type: list
      elements: dict
    kept:
      description: The releases never freed (current, previous, last good, rollback target).
      type: list
      elements: str
    fits:
      description: Whether the root is within the budget after the prune (always true - else the prune fails).
      type: bool
  sample:
    budget_bytes: 107374182400
    need_bytes: 0
    used_bytes_before: 128849018880
    used_bytes_after: 96636764160
    freed: [{path: /opt/vllm/cache/uv, kind: uv_cache, bytes: 32212254720}]
    kept: [3cfc8f8b7a1b-1a2b3c4d]
    fits: true
kept:
  description:
    - The O(keep_files) copies of the run (an optional file that does not exist is left out), and whether
      each was written (or would be, in check mode).
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The file kept.
      type: str
    last_good:
      description: Its last good copy.
      type: str
    changed:
      description: Whether the copy was written (its content, mode or owner differed, or it did not exist).
      type: bool
  sample:
    - {path: /etc/vllm/default.yaml, last_good: /etc/vllm/default.yaml.last-good, changed: true}
diff:
  description:
    - Before and after of C(current), C(previous), each release's status and each O(keep_files) copy, as text.
  returned: always
  type: dict
  sample:
    before: "current: b0b2f27da0c4-9f8e7d6c\nprevious: -\nreleases:\n  b0b2f27da0c4-9f8e7d6c: good\n"
    after: "current: 3cfc8f8b7a1b-1a2b3c4d\nprevious: b0b2f27da0c4-9f8e7d6c\nreleases:\n  ..."
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._args import (
    DISK_BUDGET_ARGS,
    KEEP_RELEASES_ARGS,
    ROOT_ARGS,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._disk_budget import BudgetError, prune_within
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import (
    ACTIONS,
    LOCK_TIMEOUT,
    ReleaseError,
    run_action,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            **ROOT_ARGS,
            "action": {"type": "str", "choices": list(ACTIONS), "default": "status"},
            "release": {"type": "str"},
            **KEEP_RELEASES_ARGS,
            **DISK_BUDGET_ARGS,
            "reason": {"type": "str"},
            "details": {"type": "dict"},
            "keep_files": {
                "type": "list",
                "elements": "dict",
                "options": {
                    "path": {"type": "path", "required": True},
                    "last_good": {"type": "path", "required": True},
                    "mode": {"type": "str", "required": True},
                    "optional": {"type": "bool", "default": False},
                },
            },
            "lock_timeout": {"type": "float", "default": LOCK_TIMEOUT},
        },
        required_if=[("action", "activate", ["release"]), ("action", "keep", ["keep_files"])],
        supports_check_mode=True,
    )
    params = module.params
    if params["action"] == "status":
        module.deprecate(
            "vllm_release with action=status (the default) is read-only: use vllm_ops.dflash.vllm_release_info",
            version="1.0.0",
            collection_name="vllm_ops.dflash",
        )
    budget = params["disk_budget_gb"]
    if budget is not None and (params["action"] != "prune" or budget <= 0):
        module.fail_json(msg=f"disk_budget_gb={budget:g} goes with action=prune and must be more than 0")
    try:
        if budget is not None:
            result = prune_within(
                params["root"], params["keep_releases"], budget, module.check_mode, params["lock_timeout"]
            )
        else:
            result = run_action(
                params["root"],
                params["action"],
                release=params["release"],
                keep_releases=params["keep_releases"],
                reason=params["reason"],
                details=params["details"],
                check_mode=module.check_mode,
                lock_timeout=params["lock_timeout"],
                keep_files=params["keep_files"],
            )
            result["disk"] = None
    except (BudgetError, ReleaseError) as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(
            msg=f"{params['action']} failed on {params['root']}: {exc}; check that the root is writable by this user"
        )
    for warning in result.pop("warnings"):
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
