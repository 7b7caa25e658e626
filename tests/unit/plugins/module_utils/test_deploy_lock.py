"""One deploy at a time per host and instance (issue 28 case 3): the lease file the rollout holds across tasks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deploy_lock import (
    DeployLockHeld,
    acquire,
    lock_path,
    release,
)


def test_a_second_deploy_is_refused_while_the_first_holds_the_lock(tmp_path):
    root = str(tmp_path / "vllm")
    acquire(root, "default", "deploy-x")
    with pytest.raises(DeployLockHeld, match=r"another deploy \(deploy-x, since .*\) holds .*deploy-default.lock"):
        acquire(root, "default", "deploy-y")
    acquire(root, "other", "deploy-y")  # another instance is another lock
    acquire(root, "default", "deploy-x")  # the holder renews
    assert release(root, "default", "deploy-y")["released"] is False  # never another's
    assert release(root, "default", "deploy-x")["released"] is True
    acquire(root, "default", "deploy-y")


def test_a_killed_controllers_lock_is_broken_once_its_lease_ended(tmp_path):
    root = str(tmp_path / "vllm")
    acquire(root, "default", "deploy-x", lease=3600)
    path = Path(lock_path(root, "default"))
    record = json.loads(path.read_text())
    record["expires_at"] = time.time() - 1  # deploy-x's controller died, its lease ended
    path.write_text(json.dumps(record))
    result = acquire(root, "default", "deploy-y")
    assert result["broken"]["holder"] == "deploy-x"
    assert json.loads(path.read_text())["holder"] == "deploy-y"


def test_check_mode_writes_nothing(tmp_path):
    root = str(tmp_path / "vllm")
    acquire(root, "default", "deploy-x", check_mode=True)
    assert not (tmp_path / "vllm" / "deploy-default.lock").exists()
