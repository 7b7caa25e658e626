# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sandbox_trace.py's parsing and comparison, on a small recorded trace (fixtures/sandbox-trace/).

The trace is `strace -f -ff -qq -s 48 -e trace=all -o trace /usr/bin/python3 -S -I prog.py` (strace 6.1,
Debian 12), recorded on 2026-12-02: prog.py names a thread and itself (prctl PR_SET_NAME), opens AF_INET6,
AF_UNIX and AF_PACKET sockets, opens /dev/null and a missing /dev/nvidia-caps/nvidia-cap1, calls fchown (in
@privileged, so refused by the unit's filter) and runs /bin/true. syscall-filter.txt is systemd 252's
`systemd-analyze syscall-filter`; vllm-sbx-eager.service is the role's unit as sandbox_render.yml renders it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sandbox_trace  # noqa: E402

FIXTURES = os.path.join(HERE, "fixtures", "sandbox-trace")
PREFIX = os.path.join(FIXTURES, "trace")
MAIN, THREAD, CHILD = 6545, 6546, 6547
PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
236 nvidia-caps
508 nvidia-uvm

Block devices:
259 blkext
"""
# The H200's nodes (as `ls -la /dev/nvidia*` shows them there): the test does not need them to exist here.
NODES = {
    "/dev/null": {"kind": "char", "major": 1, "minor": 3, "driver": "mem"},
    "/dev/nvidiactl": {"kind": "char", "major": 195, "minor": 255, "driver": "nvidia-frontend"},
    "/dev/nvidia0": {"kind": "char", "major": 195, "minor": 0, "driver": "nvidia-frontend"},
    "/dev/nvidia-uvm": {"kind": "char", "major": 508, "minor": 0, "driver": "nvidia-uvm"},
    "/dev/nvidia-caps/nvidia-cap1": {"kind": "char", "major": 236, "minor": 1, "driver": "nvidia-caps"},
    "/dev/shm/torch_1": {"kind": "not-a-device"},
}


def node(path: str) -> Dict[str, Any]:
    return NODES.get(path, {"kind": "absent"})


@pytest.fixture(name="sandbox")
def fixture_sandbox() -> Dict[str, Any]:
    with open(os.path.join(FIXTURES, "vllm-sbx-eager.service"), encoding="utf-8") as handle:
        unit = handle.read()
    with open(os.path.join(FIXTURES, "syscall-filter.txt"), encoding="utf-8") as handle:
        groups = handle.read()
    return sandbox_trace.sandbox_from_unit(unit, groups, "systemd 252")


def test_the_filter_is_system_service_less_privileged_and_obsolete(sandbox):
    allowed = set(sandbox["allowed"])
    assert sandbox["allow_list"] is True
    assert sandbox["system_call_filter"] == ["@system-service", "~@privileged @obsolete"]
    # in @system-service (through @default, @file-system, @process, ...) and not taken away
    assert {"read", "openat", "ioctl", "mmap", "clone3", "execve", "prctl", "socket"} <= allowed
    # @system-service has @chown and @setuid; ~@privileged takes them away again
    assert {"fchown", "chown", "setuid", "setgroups", "capset"} & allowed == set()
    # never in @system-service
    assert {"ptrace", "mount", "perf_event_open", "bpf", "init_module"} <= set(sandbox["denied"])
    assert not set(sandbox["denied"]) & allowed
    assert sandbox["restrict_address_families"] == ["AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"]
    assert sandbox["device_policy"] == "closed"
    assert "char-nvidia-frontend" in sandbox["device_allow"] and "/dev/nvidiactl" in sandbox["device_allow"]


def test_filter_lines_follow_systemds_rules():
    groups = {"default": ["exit"], "a": ["x", "y", "@b"], "b": ["z"], "known": ["exit", "x", "y", "z", "w"]}
    assert sandbox_trace.filter_sets(["@a", "~y"], groups) == (True, {"exit", "x", "z"})
    assert sandbox_trace.filter_sets(["~@a", "z"], groups) == (False, {"x", "y"})  # a deny list, z let back
    assert sandbox_trace.filter_sets(["@a", "", "w"], groups) == (True, {"exit", "w"})  # "" resets
    with pytest.raises(ValueError, match="@nope"):
        sandbox_trace.filter_sets(["@nope"], groups)


def test_groups_are_read_with_their_nested_groups():
    with open(os.path.join(FIXTURES, "syscall-filter.txt"), encoding="utf-8") as handle:
        groups = sandbox_trace.parse_syscall_groups(handle.read())
    assert "@default" in groups["system-service"] and "ioctl" in groups["system-service"]
    assert "fchown" in sandbox_trace.expand("@privileged", groups)
    assert "Ungrouped" not in " ".join(groups["known"])  # the closing comment lines are no members


def test_threads_join_their_process_and_children_are_their_own():
    threads = sandbox_trace.read_trace(PREFIX)
    assert set(threads) == {MAIN, THREAD, CHILD}
    assert sandbox_trace.thread_groups(threads) == {MAIN: MAIN, THREAD: MAIN, CHILD: CHILD}
    assert threads[MAIN]["names"] == ["sbx-main"] and threads[THREAD]["names"] == ["sbx-worker"]
    assert threads[CHILD]["execs"] == ["/bin/true"]
    families = [(item["call"], item["family"]) for item in threads[MAIN]["sockets"]]
    assert ("socket", "AF_UNIX") in families and ("socket", "AF_PACKET") in families
    assert [(item["call"], item["family"]) for item in threads[THREAD]["sockets"]] == [("socket", "AF_INET6")]
    opens = {item["path"]: item["result"] for item in threads[MAIN]["dev_opens"]}
    assert opens["/dev/null"] == "fd" and opens["/dev/nvidia-caps/nvidia-cap1"] == "ENOENT"


def test_the_comparison_finds_the_refused_call_family_and_device(sandbox, tmp_path):
    # While it "served", the main process held the caps node and a /dev/shm file (a sample as run() writes it).
    samples = tmp_path / "samples.jsonl"
    held = {"pid": MAIN, "comm": "sbx-main", "cmdline": "python3 prog.py", "maps": ["/dev/nvidia0"],
            "fds": ["/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap1", "/dev/shm/torch_1"]}  # fmt: skip
    samples.write_text(json.dumps(held) + "\n")
    result = sandbox_trace.analyze(PREFIX, str(samples), sandbox, PROC_DEVICES, node=node)
    checks = result["checks"]
    assert result["processes"] == 2 and result["threads"] == 3

    main = result["by_process"]["sbx-main"]
    assert main["pids"] == [MAIN] and main["threads"] == 2  # the worker thread's calls count for its process
    assert set(main["denied"]) == {"fchown"} and main["denied"]["fchown"]["examples"][0].startswith("fchown(")
    assert main["syscalls"]["socket"] == 3
    assert "true" in result["by_process"] and not result["by_process"]["true"]["denied"]
    assert checks["syscalls"]["ok"] is False
    assert checks["syscalls"]["denied_seen"] == {"fchown": {"count": 1, "processes": ["sbx-main"]}}

    families = checks["socket_families"]
    assert families["ok"] is False and families["denied_seen"] == ["AF_PACKET"]
    assert families["seen"]["AF_INET6"]["denied"] is False and families["seen"]["AF_INET6"]["processes"] == ["sbx-main"]

    devices = checks["devices"]
    assert devices["ok"] is False and list(devices["denied_held"]) == ["/dev/nvidia-caps/nvidia-cap1"]
    seen = devices["seen"]
    assert seen["/dev/nvidia-caps/nvidia-cap1"]["how"] == {"sbx-main": ["opened:ENOENT", "fd"]}
    assert seen["/dev/nvidiactl"]["allowed_by"] == "/dev/nvidiactl"
    assert seen["/dev/nvidia0"]["allowed_by"] == "char-nvidia-frontend"
    assert seen["/dev/null"]["allowed_by"] == "/dev/null"  # DevicePolicy=closed's own pseudo devices
    assert seen["/dev/shm/torch_1"]["allowed_by"] == "not a device"


def test_a_failed_open_of_a_missing_node_is_no_finding(sandbox):
    # Without the sample, the caps node was only asked for (ENOENT): listed, not held.
    result = sandbox_trace.analyze(PREFIX, None, sandbox, PROC_DEVICES, node=node)
    devices = result["checks"]["devices"]
    assert devices["ok"] is True and devices["denied_held"] == {}
    assert devices["seen"]["/dev/nvidia-caps/nvidia-cap1"]["allowed_by"] is None


def test_allowing_the_caps_nodes_clears_the_device_finding(sandbox, tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"pid": MAIN, "comm": "sbx-main", "fds": ["/dev/nvidia-caps/nvidia-cap1"]}) + "\n")
    sandbox["device_allow"].append("char-nvidia-caps")
    result = sandbox_trace.analyze(PREFIX, str(samples), sandbox, PROC_DEVICES, node=node)
    assert result["checks"]["devices"]["ok"] is True
    assert result["checks"]["devices"]["seen"]["/dev/nvidia-caps/nvidia-cap1"]["allowed_by"] == "char-nvidia-caps"


def test_the_cli_writes_the_same_summary(sandbox, tmp_path):
    box = tmp_path / "sandbox.json"
    box.write_text(json.dumps(sandbox))
    proc_devices = tmp_path / "devices"
    proc_devices.write_text(PROC_DEVICES)
    out = tmp_path / "summary.json"
    argv = ["analyze", "--trace", PREFIX, "--sandbox", str(box), "--proc-devices", str(proc_devices), "--out", str(out)]
    assert sandbox_trace.main(argv) == 0
    summary = json.loads(out.read_text())
    assert summary["checks"]["syscalls"]["denied_seen"]["fchown"]["count"] == 1
    assert summary["checks"]["socket_families"]["denied_seen"] == ["AF_PACKET"]
