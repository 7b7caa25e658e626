# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A build's disk budget (`disk_budget_gb`): room made before the attempt (predicted in check mode) and after it.

Apart from the release attempt (_build_release) so that the look's check-mode run predicts it without importing
what builds a release.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Sequence

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import BuildOptions, OptionError
from ansible_collections.vllm_ops.dflash.plugins.module_utils._disk_budget import BudgetError, apply, plan

__all__ = ["fit_after_build", "fit_before_build"]


def fit_before_build(
    opts: BuildOptions, name: str, check_mode: bool, keep: Sequence[str] = ()
) -> Optional[Dict[str, Any]]:
    """With disk_budget_gb, before the attempt: an OptionError (nothing freed) when the root cannot hold the build
    (_disk_budget's estimate) even with every part that may go freed, else the oldest parts freed until it can (in
    check mode only predicted). `keep`: paths the build reads (its mirror). The result's `disk`; None unbounded."""
    if opts.disk_budget_gb is None:
        return None
    try:
        budget = plan(opts.root, opts.disk_budget_gb, paths=keep)
        # No keep rule here: what goes beyond the budget's picks is the prune's after the build.
        return apply(budget, sys.maxsize, f"the build of {name}", check_mode)
    except BudgetError as exc:
        raise OptionError(str(exc)) from exc


def fit_after_build(
    opts: BuildOptions, made: str, before: Optional[Dict[str, Any]], keep: Sequence[str] = ()
) -> Optional[Dict[str, Any]]:
    """After the attempt and its prune: the oldest parts freed while the root is over the budget, never the release
    made (a root that still does not fit says so in `fits`: the release is there). `before` and this, as one."""
    if opts.disk_budget_gb is None or before is None:
        return None
    budget = plan(opts.root, opts.disk_budget_gb, need=0, releases=[made], paths=keep)
    after = apply(budget, sys.maxsize, f"{opts.root} after the build of {made}", False, strict=False)
    return dict(before, used_bytes_after=after["used_bytes_after"], freed=before["freed"] + after["freed"],
                fits=after["fits"], kept=after["kept"])  # fmt: skip
