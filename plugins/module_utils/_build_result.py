# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_build result of a run (its return keys), a release built, found or predicted in check mode."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import BuildOptions
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import STATUS_NAME
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import Resolution
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import Decision
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import release_path

__all__ = ["exists", "result"]


def result(
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
    disk: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The module's return keys; a prediction (no manifest) takes the precompiled keys from `decision`."""
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
        "release": release_path(opts.root, name) if name else None,
        "wheel": wheel.get("path"),
        "wheel_sha256": wheel.get("sha256"),
        "log_path": (manifest or {}).get("log_path"),
        "inputs_hash": digest,
        "precompiled": precompiled,
        "precompiled_reason": reason,
        "max_jobs": max_jobs,
        "python_only": (manifest or {}).get("python_only"),
        "duration": round(time.monotonic() - started, 3),
        "stage_seconds": {},
        "status_path": os.path.join(opts.root, STATUS_NAME),
        "pruned": pruned or [],
        "disk": disk,
        "msg": msg,
    }


def exists(
    opts: BuildOptions, resolution: Resolution, name: str, digest: str, started: float, manifest: Mapping[str, Any]
) -> Dict[str, Any]:
    """The result when the release is there already (nothing changed)."""
    return result(
        opts, resolution, name=name, digest=digest, started=started, changed=False, built=False, manifest=manifest,
        msg=f"{name} exists",
    )  # fmt: skip
