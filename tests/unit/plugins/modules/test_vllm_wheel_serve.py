# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_wheel_serve run as Ansible runs it: the server outlives the module, the stop ends it."""

from __future__ import annotations

import hashlib
import os
import urllib.request

from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_serve import MARK
from ansible_collections.vllm_ops.dflash.tests.helpers import module_runner


def run_module(tmp_path, check_mode=False, **args):
    return module_runner.run_module("vllm_wheel_serve", tmp_path, args, check_mode=check_mode)[0]


def _servers_of(path) -> int:
    """Processes on this host that serve `path` (the server's argv names the mark and the file)."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                args = handle.read().split(b"\0")
        except OSError:
            continue
        count += MARK.encode() in args and str(path).encode() in args
    return count


def test_started_serves_after_the_module_returned_and_stopped_ends_it(tmp_path):
    wheel = tmp_path / "vllm-1.0-py3-none-any.whl"
    wheel.write_bytes(os.urandom(1024 * 1024))
    started = run_module(tmp_path, path=str(wheel), address="127.0.0.1", timeout=120)
    assert started.get("failed") is not True, started.get("msg")
    assert started["changed"] is True
    with urllib.request.urlopen(started["url"], timeout=30) as response:
        assert hashlib.sha256(response.read()).hexdigest() == hashlib.sha256(wheel.read_bytes()).hexdigest()
    # check mode stops nothing, but says that a stop would
    predicted = run_module(tmp_path, check_mode=True, state="stopped", pid=started["pid"], token=started["token"])
    assert (predicted["changed"], predicted["stopped"]) == (True, True)
    with urllib.request.urlopen(started["url"], timeout=30) as response:
        assert response.status == 200
    stopped = run_module(tmp_path, state="stopped", pid=started["pid"], token=started["token"])
    assert stopped == {**stopped, "changed": True, "stopped": True}
    again = run_module(tmp_path, state="stopped", pid=started["pid"], token=started["token"])
    assert (again["changed"], again["stopped"]) == (False, False)
    predicted = run_module(tmp_path, check_mode=True, state="stopped", pid=started["pid"], token=started["token"])
    assert (predicted["changed"], predicted["stopped"]) == (False, False)


def test_check_mode_starts_nothing_and_says_what_it_would_serve(tmp_path):
    wheel = tmp_path / "vllm-1.0-py3-none-any.whl"
    wheel.write_bytes(b"w" * 4096)
    result = run_module(tmp_path, check_mode=True, path=str(wheel), address="127.0.0.1", timeout=120)
    assert result.get("failed") is not True, result.get("msg")
    assert result["changed"] is True
    assert (result["path"], result["address"], result["size"], result["timeout"]) == (
        str(wheel),
        "127.0.0.1",
        4096,
        120,
    )
    assert not {"url", "port", "pid", "token"} & set(result)
    assert result["msg"].startswith(f"check mode: would serve {wheel} (4096 bytes) on 127.0.0.1")
    assert _servers_of(wheel) == 0
    # an address a start would fail on fails in check mode too (TEST-NET-1 is never local)
    refused = run_module(tmp_path, check_mode=True, path=str(wheel), address="192.0.2.1")
    assert refused["failed"] is True and "set the address to one this host owns" in refused["msg"]


def test_a_missing_wheel_fails_naming_the_fix(tmp_path):
    result = run_module(tmp_path, path=str(tmp_path / "absent.whl"), address="127.0.0.1")
    assert result["failed"] is True
    assert "is not a file on this host" in result["msg"] and "wheel" in result["msg"]


def test_stopped_needs_the_pid_and_the_token(tmp_path):
    result = run_module(tmp_path, state="stopped", pid=1)
    assert result["failed"] is True and "token" in result["msg"]
