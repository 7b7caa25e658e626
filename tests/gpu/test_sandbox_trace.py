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
# /proc/devices and the nodes as the lent H200 (driver 580.159.04) has them (host.txt of 2026-12-02): major
# 195 is "nvidia" and "nvidiactl" there, not "nvidia-frontend".
PROC_DEVICES = """Character devices:
  1 mem
136 pts
195 nvidia
195 nvidiactl
238 nvidia-uvm
241 nvidia-caps
242 nvidia-caps-imex-channels

Block devices:
259 blkext
"""
MAJORS = sandbox_trace.char_majors(PROC_DEVICES)["char"]
NODES = {
    "/dev/null": (1, 3),
    "/dev/nvidiactl": (195, 255),
    "/dev/nvidia0": (195, 0),
    "/dev/nvidia-uvm": (238, 0),
    "/dev/nvidia-caps/nvidia-cap1": (241, 1),
}


def node(path: str) -> Dict[str, Any]:
    if path in NODES:
        major, minor = NODES[path]
        return {"kind": "char", "major": major, "minor": minor, "drivers": MAJORS.get(major, [])}
    return {"kind": "not-a-device"} if path.startswith("/dev/shm/") else {"kind": "absent"}


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
    # the GPU node is mapped and the caps node held; on this driver char-nvidia-frontend matches no major
    assert devices["ok"] is False and list(devices["denied_held"]) == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia0"]
    seen = devices["seen"]
    assert seen["/dev/nvidia0"]["allowed_by"] is None and seen["/dev/nvidia0"]["drivers"] == ["nvidia", "nvidiactl"]
    assert seen["/dev/nvidia-caps/nvidia-cap1"]["how"] == {"sbx-main": ["opened:ENOENT", "fd"]}
    assert seen["/dev/nvidiactl"]["allowed_by"] == "/dev/nvidiactl"
    assert seen["/dev/null"]["allowed_by"] == "/dev/null"  # DevicePolicy=closed's own pseudo devices
    assert seen["/dev/shm/torch_1"]["allowed_by"] == "not a device"


def test_a_failed_open_of_a_missing_node_is_no_finding(sandbox):
    # Without the sample, the caps node was only asked for (ENOENT): listed, not held.
    result = sandbox_trace.analyze(PREFIX, None, sandbox, PROC_DEVICES, node=node)
    devices = result["checks"]["devices"]
    assert devices["ok"] is True and devices["denied_held"] == {}
    assert devices["seen"]["/dev/nvidia-caps/nvidia-cap1"]["allowed_by"] is None


def held_sample(tmp_path, *paths: str) -> str:
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"pid": MAIN, "comm": "sbx-main", "fds": list(paths)}) + "\n")
    return str(samples)


def test_the_fix_clears_the_device_findings(sandbox, tmp_path):
    samples = held_sample(tmp_path, "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap1")
    sandbox["device_allow"] += ["char-nvidia", "char-nvidia-caps"]
    devices = sandbox_trace.analyze(PREFIX, samples, sandbox, PROC_DEVICES, node=node)["checks"]["devices"]
    assert devices["ok"] is True
    assert devices["seen"]["/dev/nvidia0"]["allowed_by"] == "char-nvidia"
    assert devices["seen"]["/dev/nvidia-caps/nvidia-cap1"]["allowed_by"] == "char-nvidia-caps"


@pytest.mark.parametrize(
    ("entry", "allowed"),
    [
        ("/dev/nvidia-caps/*", False),  # systemd stat()s a path: no globbing, a missing path is skipped
        ("/dev/nvidia-caps/nvidia-cap1", True),
        ("char-nvidia-caps", True),
        ("char-nvidia-caps-imex-channels", False),  # another line of /proc/devices
        ("char-nvidia*", True),  # fnmatch, as systemd does: also nvidia-caps-imex-channels and the rest
        ("char-241", True),  # a major by number
        ("block-nvidia-caps", False),
    ],
)
def test_device_allow_entries_match_as_systemd_reads_them(sandbox, entry, allowed):
    sandbox["device_allow"] = [entry]
    info = node("/dev/nvidia-caps/nvidia-cap1")
    assert (sandbox_trace.device_allowed(info, sandbox, node) == entry) is allowed


def test_an_older_driver_names_major_195_nvidia_frontend(sandbox):
    info = {"kind": "char", "major": 195, "minor": 0, "drivers": ["nvidia-frontend"]}
    assert sandbox_trace.device_allowed(info, sandbox, node) == "char-nvidia-frontend"


def test_recheck_judges_a_recorded_summary_with_another_device_allow(sandbox, tmp_path):
    samples = held_sample(tmp_path, "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap1")
    analysis = sandbox_trace.analyze(PREFIX, samples, sandbox, PROC_DEVICES, node=node)
    summary = {"analysis": analysis, "proc_devices": PROC_DEVICES}
    assert sandbox_trace.recheck(summary, sandbox)["ok"] is False
    sandbox["device_allow"] += ["char-nvidia", "char-nvidia-caps"]
    assert sandbox_trace.recheck(summary, sandbox)["ok"] is True


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


def test_watched_calls_keep_their_lines_and_stay_allowed(sandbox, tmp_path):
    # A thread of the engine core as strace -ff writes it: the policy argument is what RestrictRealtime= sees.
    (tmp_path / "trace.700").write_text(
        'prctl(PR_SET_NAME, "VLLM::EngineCor") = 0\n'
        "sched_setscheduler(701, SCHED_OTHER, [0]) = 0\n"
        "unshare(CLONE_NEWUSER)                  = -1 EPERM (Operation not permitted)\n"
        "personality(0xffffffff)                 = 0 (PER_LINUX)\n"
    )
    result = sandbox_trace.analyze(str(tmp_path / "trace"), None, sandbox, PROC_DEVICES, node=node)
    core = result["by_process"]["VLLM::EngineCor"]
    assert core["watched"]["sched_setscheduler"] == ["sched_setscheduler(701, SCHED_OTHER, [0]) = 0"]
    assert core["watched"]["unshare"][0].startswith("unshare(CLONE_NEWUSER)")
    assert set(core["watched"]) == {"sched_setscheduler", "unshare", "personality"}
    assert result["checks"]["syscalls"]["ok"] is True  # the filter allows all three; other directives judge them
