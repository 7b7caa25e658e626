"""The host lock: exclusive, names its holder on timeout, dies with its holder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._lock import LockTimeout, host_lock

COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 4, ".cache", "ac"))


def _hold_in_child(root: str, seconds: float) -> subprocess.Popen:
    """Start a process that takes the lock, prints 'locked', then sleeps."""
    code = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {COLLECTIONS!r})
        from ansible_collections.vllm_ops.dflash.plugins.module_utils._lock import host_lock
        with host_lock({root!r}, timeout=5):
            print("locked", flush=True)
            time.sleep({seconds})
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "locked"
    return child


def test_lock_creates_root_and_records_holder(tmp_path):
    root = str(tmp_path / "opt" / "vllm")
    with host_lock(root, timeout=1) as path:
        assert path == os.path.join(root, ".lock")
        with open(path) as handle:
            assert handle.read().strip() == str(os.getpid())
    with open(path) as handle:
        assert handle.read() == ""


def test_timeout_names_the_holder_pid(tmp_path):
    root = str(tmp_path)
    child = _hold_in_child(root, 30)
    try:
        started = time.monotonic()
        with pytest.raises(LockTimeout) as info, host_lock(root, timeout=0.5):
            pass
        assert time.monotonic() - started >= 0.5
        assert info.value.holder_pid == child.pid
        assert f"process {child.pid}" in str(info.value)
        assert os.path.join(root, ".lock") in str(info.value)
    finally:
        child.kill()
        child.wait()


def test_lock_is_freed_when_the_holder_dies(tmp_path):
    root = str(tmp_path)
    child = _hold_in_child(root, 30)
    child.kill()
    child.wait()
    with host_lock(root, timeout=2):
        pass


def test_waiter_gets_the_lock_once_released(tmp_path):
    root = str(tmp_path)
    child = _hold_in_child(root, 0.5)
    try:
        with host_lock(root, timeout=10):
            assert child.poll() is not None
    finally:
        child.wait()


def test_lock_is_not_inherited_by_subprocesses(tmp_path):
    """A build started under the lock must not keep holding it after the module exits."""
    root = str(tmp_path)
    with host_lock(root, timeout=1):
        sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with host_lock(root, timeout=0):
            pass
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_shared_lock_writes_nothing_and_waits_for_a_writer(tmp_path):
    root = str(tmp_path)
    with host_lock(root, timeout=0):
        pass
    lock = tmp_path / ".lock"
    os.chmod(lock, 0o444)  # readers need no write access (a full disk, a read-only mount)
    with host_lock(root, timeout=0, shared=True), host_lock(root, timeout=0, shared=True):
        assert lock.read_text() == ""
    os.chmod(lock, 0o644)
    child = _hold_in_child(root, 30)
    try:
        with pytest.raises(LockTimeout, match=f"process {child.pid}"), host_lock(root, timeout=0, shared=True):
            pass
    finally:
        child.kill()
        child.wait()
