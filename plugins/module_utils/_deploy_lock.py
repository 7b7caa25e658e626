# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One deploy at a time per host and instance: a lease file `<root>/deploy-<instance>.lock` held across tasks.

A deploy spans many tasks and connections, so the host's flock (released with its process, _lock.py) cannot
hold it. The file names its holder (the deploy's id) and when its lease ends; the holder takes it at the start
of the host's rollout and releases it after the gate's record (or the rescue). A controller killed mid-deploy
leaves the file: the next deploy breaks it once its lease has ended, naming whose it was, and an operator who
knows the other deploy is dead removes it by hand. Reads and writes of the file go under the host lock.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any, Dict, Optional

from ansible_collections.vllm_ops.dflash.plugins.module_utils._lock import host_lock

__all__ = ["DEFAULT_LEASE", "DeployLockHeld", "acquire", "lock_path", "release"]

DEFAULT_LEASE = 3600


class DeployLockHeld(Exception):
    """Another deploy holds this host's deploy lock and its lease has not ended."""


def lock_path(root: str, instance: str) -> str:
    return os.path.join(root, f"deploy-{instance}.lock")


def _read(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"holder": "unreadable", "expires_at": 0}  # garbage is no live holder: it is broken like a stale one
    return record if isinstance(record, dict) else {"holder": "unreadable", "expires_at": 0}


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def acquire(
    root: str, instance: str, holder: str, lease: float = DEFAULT_LEASE, check_mode: bool = False
) -> Dict[str, Any]:
    """Take (or renew, for the same holder) the deploy lock; raise DeployLockHeld while another's lease runs."""
    if not holder:
        raise ValueError("holder is empty: give the deploy's id")
    path = lock_path(root, instance)
    with host_lock(root, timeout=60):
        existing = _read(path)
        now = time.time()
        broken = None
        if existing and existing.get("holder") != holder:
            held_until = float(existing.get("expires_at") or 0)
            if held_until > now:
                raise DeployLockHeld(
                    f"another deploy ({existing.get('holder')}, since {_stamp(float(existing.get('taken_at') or 0))}) "
                    f"holds {path} until {_stamp(held_until)}: one deploy at a time per host and instance. Fix: wait "
                    f"for it; if its controller was killed, remove {path} (or wait until the lease ends) and re-run"
                )
            broken = existing
        taken_at = existing.get("taken_at") if existing and not broken else now
        expires_at = now + lease
        record = {"holder": holder, "taken_at": taken_at, "expires_at": expires_at}
        if not check_mode:
            temporary = f"{path}.{uuid.uuid4().hex}.tmp"
            with open(temporary, "w", encoding="utf-8") as handle:
                json.dump(record, handle)
            os.replace(temporary, path)
    return {"changed": True, "path": path, "holder": holder, "expires_at": _stamp(expires_at), "broken": broken}


def release(root: str, instance: str, holder: str, check_mode: bool = False) -> Dict[str, Any]:
    """Remove the deploy lock if `holder` holds it; another's lock is left alone (and named)."""
    path = lock_path(root, instance)
    if not os.path.isdir(root):
        return {"changed": False, "path": path, "released": False, "held_by": None}
    with host_lock(root, timeout=60):
        existing = _read(path)
        if not existing or existing.get("holder") != holder:
            return {"changed": False, "path": path, "released": False, "held_by": (existing or {}).get("holder")}
        if not check_mode:
            os.unlink(path)
    return {"changed": True, "path": path, "released": True, "held_by": holder}
