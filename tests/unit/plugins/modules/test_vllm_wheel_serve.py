# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_wheel_serve run as Ansible runs it: the server outlives the module, the stop ends it."""

from __future__ import annotations

import hashlib
import os
import urllib.request

from ansible_collections.vllm_ops.dflash.tests.helpers import module_runner


def run_module(tmp_path, check_mode=False, **args):
    return module_runner.run_module("vllm_wheel_serve", tmp_path, args, check_mode=check_mode)[0]


def test_started_serves_after_the_module_returned_and_stopped_ends_it(tmp_path):
    wheel = tmp_path / "vllm-1.0-py3-none-any.whl"
    wheel.write_bytes(os.urandom(1024 * 1024))
    started = run_module(tmp_path, check_mode=True, path=str(wheel), address="127.0.0.1", timeout=120)
    assert started.get("failed") is not True, started.get("msg")
    assert started["changed"] is False
    with urllib.request.urlopen(started["url"], timeout=30) as response:
        assert hashlib.sha256(response.read()).hexdigest() == hashlib.sha256(wheel.read_bytes()).hexdigest()
    stopped = run_module(tmp_path, state="stopped", pid=started["pid"], token=started["token"])
    assert stopped == {**stopped, "changed": False, "stopped": True}
    again = run_module(tmp_path, state="stopped", pid=started["pid"], token=started["token"])
    assert again["stopped"] is False


def test_a_missing_wheel_fails_naming_the_fix(tmp_path):
    result = run_module(tmp_path, path=str(tmp_path / "absent.whl"), address="127.0.0.1")
    assert result["failed"] is True
    assert "is not a file on this host" in result["msg"] and "wheel" in result["msg"]


def test_stopped_needs_the_pid_and_the_token(tmp_path):
    result = run_module(tmp_path, state="stopped", pid=1)
    assert result["failed"] is True and "token" in result["msg"]
