# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Trace a vLLM server started from the rendered unit and hold it against the unit's sandbox (issue 26).

    # where systemd-analyze is (the unit's own view of its filter), once per rendered unit:
    python3 sandbox_trace.py sandbox UNIT --out sandbox.json
    # on the GPU host: ExecStart= under strace -f -ff, a few completions, a stop as KillMode= does it
    python3 sandbox_trace.py run UNIT --sandbox sandbox.json --strace /path/to/strace --work DIR --out summary.json
    # the comparison alone, on a trace folder that `run` left (also what the unit test drives)
    python3 sandbox_trace.py analyze --trace DIR/trace --samples DIR/samples.jsonl --sandbox sandbox.json

`sandbox` reads SystemCallFilter=, RestrictAddressFamilies=, DevicePolicy= and DeviceAllow= from the unit
and expands the filter with `systemd-analyze syscall-filter` into the set of system calls the unit allows.
`run` starts ExecStart= as tests/gpu/unit_exec.py does (same environment, directories and stop), but under
`strace -f -ff -qq -e trace=all`, samples /proc/<pid>/{comm,cmdline,fd,maps} of every process of the
server while it starts and serves, sends completions, stops it and writes the `analyze` summary:
  (a) the system calls seen per process name, and those the filter does not allow;
  (b) the socket families that socket() and socketpair() asked for, against RestrictAddressFamilies=;
  (c) the device nodes opened (openat in the trace) and held (fd and maps samples), against DeviceAllow=
      and the pseudo devices DevicePolicy=closed adds.
Standard library only; runs as root on the GPU host (strace attaches to the server's children).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import pwd
import re
import shlex
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import unit_exec  # tests/gpu's stand-in for systemd, next to this file

# What DevicePolicy=closed allows besides DeviceAllow= (systemd's src/core/cgroup.c: its auto devices, and
# char-pts rw). DevicePolicy=strict allows none of these.
CLOSED_POLICY_PATHS = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx")
CLOSED_POLICY_CLASSES = ("char-pts",)
# `systemd-analyze syscall-filter` prints a group as "@name", its description as "    # ...", then one
# member (a system call or a nested "@group") per indented line; "# Ungrouped ..." lines close the output.
_GROUP_LINE = re.compile(r"^@([\w-]+)\s*$")
_MEMBER_LINE = re.compile(r"^\s+(@?[\w-]+)\s*$")
# One strace line: "name(args) = result", also with a "[pid N] " or "N " prefix (strace -f without -ff),
# "<... name resumed> ..." for the end of a call that another line began, and "syscall_0x1c3(" for a
# call this strace does not know by name.
_CALL = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?(?P<name>[a-z_][a-z0-9_]*)\((?P<rest>.*)$")
_RESULT = re.compile(r"\)\s+=\s+(?P<result>-?\d+|\?|0x[0-9a-f]+)(?:\s+(?P<errno>E[A-Z0-9]+))?")
_PATH_CALLS = {"open": 0, "openat": 1, "openat2": 1, "creat": 0}
_CLONE_CALLS = ("clone", "clone3", "fork", "vfork")
_STRING = r'"((?:[^"\\]|\\.)*)"'
# Calls the filter allows but other directives of the unit restrict (RestrictRealtime=, RestrictNamespaces=,
# LockPersonality=, the device ACL's mknod): their first lines are kept per process, to read the arguments.
WATCHED = ("sched_setscheduler", "sched_setattr", "unshare", "setns", "personality", "mknod", "mknodat")


# ---------------------------------------------------------------------------------------------------------
# (0) The sandbox as the unit writes it


def parse_syscall_groups(text: str) -> Dict[str, List[str]]:
    """`systemd-analyze syscall-filter` output -> {group: [members]} (members may be "@group")."""
    groups: Dict[str, List[str]] = {}
    current: Optional[str] = None
    for line in text.splitlines():
        group = _GROUP_LINE.match(line)
        if group:
            current = group.group(1)
            groups[current] = []
        elif not line.strip() or not line[0].isspace():
            current = None  # the blank line after a group, or the closing "# Ungrouped ..." lines
        elif current is not None and not line.lstrip().startswith("#"):
            member = _MEMBER_LINE.match(line)
            if member:
                groups[current].append(member.group(1))
    return groups


def expand(item: str, groups: Dict[str, List[str]], seen: Optional[Set[str]] = None) -> Set[str]:
    """One filter item ("@group" or a system call) as the set of system calls it names."""
    if not item.startswith("@"):
        return {item}
    name = item[1:]
    if name not in groups:
        raise ValueError(f"system call group {item} is unknown to this systemd-analyze: check the unit's filter")
    seen = set() if seen is None else seen
    if name in seen:
        return set()
    seen.add(name)
    out: Set[str] = set()
    for member in groups[name]:
        out |= expand(member, groups, seen)
    return out


def filter_sets(values: List[str], groups: Dict[str, List[str]]) -> Tuple[bool, Set[str]]:
    """SystemCallFilter= lines in order -> (allow_list, syscalls). systemd's rules: the first line decides
    the kind; on an allow list `@default` is added, later lines add (plain) or remove (~) names."""
    allow_list: Optional[bool] = None
    names: Set[str] = set()
    for value in values:
        value = value.strip()
        if not value:
            allow_list, names = None, set()  # an empty assignment resets the filter
            continue
        invert = value.startswith("~")
        items = value.lstrip("~").split()
        if allow_list is None:
            allow_list = not invert
            if allow_list:
                names |= expand("@default", groups)
        listed: Set[str] = set()
        for item in items:
            listed |= expand(item, groups)
        if allow_list == (not invert):
            names |= listed
        else:
            names -= listed
    return bool(allow_list), names


def sandbox_from_unit(unit_text: str, filter_text: str, systemd_version: str = "") -> Dict[str, Any]:
    """What the rendered unit allows, with its filter expanded by that systemd-analyze output."""
    settings = unit_exec.parse_unit(unit_text)
    groups = parse_syscall_groups(filter_text)
    filters = settings.get("SystemCallFilter", [])
    allow_list, names = filter_sets(filters, groups)
    known = expand("@known", groups) if "known" in groups else set().union(*[expand("@" + g, groups) for g in groups])
    families: List[str] = []
    for value in settings.get("RestrictAddressFamilies", []):
        families = [] if not value.strip() else families + value.split()
    device_allow = [value.split()[0] for value in settings.get("DeviceAllow", []) if value.split()]
    return {
        "systemd_version": systemd_version,
        "system_call_filter": filters,
        "allow_list": allow_list,
        # allow list: everything else is refused (SIGSYS without SystemCallErrorNumber=), also calls this
        # systemd does not know; deny list: exactly these are refused
        "allowed": sorted(names) if allow_list else [],
        "denied": sorted(known - names) if allow_list else sorted(names),
        "system_call_error_number": unit_exec.last(settings, "SystemCallErrorNumber", "") or "",
        "restrict_address_families": families,
        "device_policy": unit_exec.last(settings, "DevicePolicy", "auto") or "auto",
        "device_allow": device_allow,
    }


def syscall_denied(name: str, sandbox: Dict[str, Any]) -> bool:
    if sandbox["allow_list"]:
        return name not in set(sandbox["allowed"])
    return name in set(sandbox["denied"])


def family_denied(family: str, sandbox: Dict[str, Any]) -> bool:
    listed = sandbox["restrict_address_families"]
    if not listed or listed == ["none"]:
        return bool(listed)  # unset: all allowed; "none": all refused
    if listed[0].startswith("~"):
        return family in {listed[0][1:]} | set(listed[1:])
    return family not in listed


# ---------------------------------------------------------------------------------------------------------
# (1) The trace


def parse_trace_file(path: str) -> Dict[str, Any]:
    """One strace -ff file (one thread) -> its calls, children, names, socket families and /dev opens."""
    calls: Dict[str, int] = {}
    examples: Dict[str, List[str]] = {}
    children: List[Tuple[int, bool]] = []  # (tid, same thread group)
    names: List[str] = []
    execs: List[str] = []
    sockets: List[Dict[str, Any]] = []
    dev_opens: List[Dict[str, Any]] = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for raw in handle:
            line = raw.rstrip("\n")
            match = _CALL.match(line)
            if not match:
                continue  # "--- SIG... ---", "+++ exited ... +++", "<... x resumed>" (counted at its start)
            name, rest = match.group("name"), match.group("rest")
            calls[name] = calls.get(name, 0) + 1
            if len(examples.setdefault(name, [])) < 3:
                examples[name].append(line[:300])
            result = _RESULT.search(rest)
            value = result.group("result") if result else None
            errno = result.group("errno") if result else None
            if name in _CLONE_CALLS and value and value.isdigit() and int(value) > 0:
                children.append((int(value), "CLONE_THREAD" in rest))
            elif name == "prctl" and rest.startswith("PR_SET_NAME"):
                found = re.search(_STRING, rest)
                if found:
                    names.append(found.group(1))
            elif name == "execve" and value == "0":
                found = re.match(_STRING, rest)
                if found:
                    execs.append(found.group(1))
            elif name in ("socket", "socketpair"):
                family = rest.split(",", 1)[0].strip()
                sockets.append({"call": name, "family": family, "ok": errno is None and value not in (None, "?")})
            elif name in _PATH_CALLS:
                strings = re.findall(_STRING, rest)
                if strings and strings[0].startswith("/dev/"):
                    dev_opens.append({"path": strings[0], "result": errno or ("fd" if value else "?")})
    return {
        "calls": calls,
        "examples": examples,
        "children": children,
        "names": names,
        "execs": execs,
        "sockets": sockets,
        "dev_opens": dev_opens,
    }


def read_trace(prefix: str) -> Dict[int, Dict[str, Any]]:
    """strace -ff -o PREFIX writes PREFIX.<tid> per thread: {tid: parse_trace_file(...)}."""
    folder, base = os.path.split(prefix)
    threads = {}
    for entry in sorted(os.listdir(folder or ".")):
        if entry.startswith(base + ".") and entry[len(base) + 1 :].isdigit():
            threads[int(entry[len(base) + 1 :])] = parse_trace_file(os.path.join(folder, entry))
    return threads


def thread_groups(threads: Dict[int, Dict[str, Any]]) -> Dict[int, int]:
    """tid -> tgid from the clone() calls: a CLONE_THREAD child joins its parent's group; any other is new."""
    parent: Dict[int, Tuple[int, bool]] = {}
    for tid, data in threads.items():
        for child, same_group in data["children"]:
            parent[child] = (tid, same_group)
    tgid: Dict[int, int] = {}

    def resolve(tid: int) -> int:
        if tid in tgid:
            return tgid[tid]
        up = parent.get(tid)
        tgid[tid] = resolve(up[0]) if up and up[1] else tid
        return tgid[tid]

    for tid in threads:
        resolve(tid)
    return tgid


# ---------------------------------------------------------------------------------------------------------
# (2) The samples of /proc taken while the server runs


def read_samples(path: Optional[str]) -> Dict[int, Dict[str, Any]]:
    """samples.jsonl (one process a line, many times) -> {pid: comm, cmdline, fds and maps under /dev}."""
    merged: Dict[int, Dict[str, Any]] = {}
    if not path or not os.path.exists(path):
        return merged
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            sample = json.loads(line)
            entry = merged.setdefault(int(sample["pid"]), {"comm": "", "cmdline": "", "fds": set(), "maps": set()})
            entry["comm"] = sample.get("comm") or entry["comm"]
            entry["cmdline"] = sample.get("cmdline") or entry["cmdline"]
            entry["fds"].update(sample.get("fds", []))
            entry["maps"].update(sample.get("maps", []))
    return merged


def sample_process(pid: int) -> Optional[Dict[str, Any]]:
    """comm, cmdline and the /dev paths a process holds open (fd) or has mapped (maps), now."""
    base = f"/proc/{pid}"
    try:
        with open(f"{base}/comm", encoding="utf-8") as handle:
            comm = handle.read().strip()
        with open(f"{base}/cmdline", "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    except OSError:
        return None
    fds: Set[str] = set()
    try:
        for fd in os.listdir(f"{base}/fd"):
            try:
                target = os.readlink(f"{base}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/dev/"):
                fds.add(target)
    except OSError:
        pass
    maps: Set[str] = set()
    try:
        with open(f"{base}/maps", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/dev/"):
                    maps.add(parts[5].strip())
    except OSError:
        pass
    return {"pid": pid, "comm": comm, "cmdline": cmdline, "fds": sorted(fds), "maps": sorted(maps)}


def session_members(sid: int) -> List[int]:
    """Every live process of the session that the tracer leads, the tracer excluded: a child whose parent
    died (reparented away) stays in it, as it stays in the unit's cgroup."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == sid:
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                data = handle.read()
        except OSError:
            continue
        fields = data[data.rindex(")") + 2 :].split()  # state ppid pgrp session ...
        if fields[0] != "Z" and int(fields[3]) == sid:
            members.append(int(entry))
    return sorted(members)


# ---------------------------------------------------------------------------------------------------------
# (3) Device nodes against DeviceAllow=


def char_majors(proc_devices: str) -> Dict[str, Dict[int, List[str]]]:
    """/proc/devices -> {"char": {major: [names]}, "block": {...}}: a major can have several lines (the
    NVIDIA driver's 195 is both "nvidia" and "nvidiactl"), and systemd matches each line on its own."""
    out: Dict[str, Dict[int, List[str]]] = {"char": {}, "block": {}}
    kind = ""
    for line in proc_devices.splitlines():
        if line.startswith("Character devices"):
            kind = "char"
        elif line.startswith("Block devices"):
            kind = "block"
        else:
            parts = line.split()
            if kind and len(parts) == 2 and parts[0].isdigit():
                out[kind].setdefault(int(parts[0]), []).append(parts[1])
    return out


def node_info(path: str, majors: Dict[str, Dict[int, List[str]]]) -> Dict[str, Any]:
    """What a /dev path is: a char or block device (major, minor, drivers) or something the ACL ignores."""
    if path.endswith(" (deleted)"):
        return {"kind": "deleted"}  # a shared anonymous or unlinked mapping ("/dev/zero (deleted)"): no node
    try:
        st = os.stat(path)
    except OSError as exc:
        return {"kind": "absent", "error": exc.strerror}
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        kind = "char" if stat.S_ISCHR(st.st_mode) else "block"
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        return {"kind": kind, "major": major, "minor": minor, "drivers": majors[kind].get(major, [])}
    return {"kind": "not-a-device"}  # /dev/shm files, sockets: the device ACL does not see them


def device_allowed(info: Dict[str, Any], sandbox: Dict[str, Any], resolve: Any) -> Optional[str]:
    """The DeviceAllow= entry (or the closed policy's pseudo device) that lets the unit open this node;
    None when none does. As systemd (src/core/bpf-devices.c) reads them: a path is stat()ed (no globbing:
    a missing path is skipped), "char-NAME" is fnmatch()ed against each /proc/devices line of that kind,
    "char-*" is every char device and "char-N" major N. Anything that is no device node is not filtered."""
    if info["kind"] not in ("char", "block"):
        return "not a device"
    entries = list(sandbox["device_allow"])
    if sandbox["device_policy"] == "closed":
        entries += list(CLOSED_POLICY_PATHS) + list(CLOSED_POLICY_CLASSES)
    elif sandbox["device_policy"] == "auto" and not sandbox["device_allow"]:
        return "DevicePolicy=auto without DeviceAllow= (no device ACL)"
    for entry in entries:
        if entry.startswith("/dev/"):
            other = resolve(entry)
            same = (other.get("major"), other.get("minor")) == (info["major"], info["minor"])
            if other.get("kind") == info["kind"] and same:
                return entry
        elif entry.startswith(f"{info['kind']}-"):
            name = entry.split("-", 1)[1]
            if name == "*" or (name.isdigit() and int(name) == info["major"]):
                return entry
            if any(fnmatch.fnmatchcase(driver, name) for driver in info.get("drivers", [])):
                return entry
    return None


def device_check(devices: Dict[str, Dict[str, Any]], sandbox: Dict[str, Any], resolve: Any) -> Dict[str, Any]:
    """Each node seen, with the entry that allows it; the verdict: no node the unit may not open was had.
    A node matters when a process had it (open succeeded, fd or mapping); a failed open (ENOENT: not on
    this host) is listed but is no finding."""
    for entry in devices.values():
        entry["allowed_by"] = device_allowed(entry, sandbox, resolve)
    refused = {
        path: entry
        for path, entry in sorted(devices.items())
        if entry["allowed_by"] is None
        and any(how in ("fd", "mapped", "opened:fd") for hows in entry["how"].values() for how in hows)
    }
    return {"ok": not refused, "seen": dict(sorted(devices.items())), "denied_held": refused}


def recheck(summary: Dict[str, Any], sandbox: Dict[str, Any]) -> Dict[str, Any]:
    """The devices check of a `run` summary again, for another DeviceAllow= (a proposed fix): from the
    nodes and /proc/devices it recorded on the GPU host, without the host."""
    majors = char_majors(summary.get("proc_devices", ""))
    devices = {path: dict(entry) for path, entry in summary["analysis"]["checks"]["devices"]["seen"].items()}
    for path, entry in devices.items():
        if path.endswith(" (deleted)"):
            entry["kind"] = "deleted"
        if entry.get("kind") in ("char", "block"):
            entry["drivers"] = majors[entry["kind"]].get(entry["major"], [])
            entry.pop("driver", None)
    nodes = dict(devices)
    nodes.update(summary.get("nodes", {}))
    return device_check(devices, sandbox, lambda path: nodes.get(path, {"kind": "absent"}))


# ---------------------------------------------------------------------------------------------------------
# (4) The comparison


def analyze(
    prefix: str,
    samples_path: Optional[str],
    sandbox: Dict[str, Any],
    proc_devices: str = "",
    node: Any = None,
) -> Dict[str, Any]:
    """The three checks over a trace (and /proc samples): per process name and overall, with verdicts."""
    majors = char_majors(proc_devices)
    node = node or (lambda p: node_info(p, majors))
    threads = read_trace(prefix)
    tgids = thread_groups(threads)
    samples = read_samples(samples_path)
    processes: Dict[int, Dict[str, Any]] = {}
    for tid in sorted(threads):
        data = threads[tid]
        tgid = tgids[tid]
        proc = processes.setdefault(
            tgid,
            {"calls": {}, "examples": {}, "threads": 0, "names": [], "execs": [], "sockets": [], "dev_opens": []},
        )
        proc["threads"] += 1
        for name, count in data["calls"].items():
            proc["calls"][name] = proc["calls"].get(name, 0) + count
            proc["examples"].setdefault(name, data["examples"][name])
        if tid == tgid:
            proc["names"] += data["names"]
            proc["execs"] += data["execs"]
        proc["sockets"] += data["sockets"]
        proc["dev_opens"] += data["dev_opens"]

    by_name: Dict[str, Dict[str, Any]] = {}
    denied_total: Dict[str, Dict[str, Any]] = {}
    families: Dict[str, Dict[str, Any]] = {}
    devices: Dict[str, Dict[str, Any]] = {}
    for tgid in sorted(processes):
        proc = processes[tgid]
        sample = samples.get(tgid, {})
        exe = os.path.basename(proc["execs"][-1]) if proc["execs"] else ""
        name = (sample.get("comm") or (proc["names"][-1] if proc["names"] else "") or exe or "?")[:15]
        group = by_name.setdefault(
            name,
            {
                "pids": [],
                "cmdline": sample.get("cmdline", ""),
                "threads": 0,
                "syscalls": {},
                "denied": {},
                "watched": {},
            },
        )
        group["pids"].append(tgid)
        group["threads"] += proc["threads"]
        group["cmdline"] = group["cmdline"] or sample.get("cmdline", "")
        for call, count in proc["calls"].items():
            group["syscalls"][call] = group["syscalls"].get(call, 0) + count
            if call in WATCHED:
                group["watched"][call] = (group["watched"].get(call, []) + proc["examples"][call])[:3]
            if syscall_denied(call, sandbox):
                slot = group["denied"].setdefault(call, {"count": 0, "examples": []})
                slot["count"] += count
                slot["examples"] = (slot["examples"] + proc["examples"][call])[:3]
                total = denied_total.setdefault(call, {"count": 0, "processes": []})
                total["count"] += count
                if name not in total["processes"]:
                    total["processes"].append(name)
        for sock in proc["sockets"]:
            entry = families.setdefault(
                sock["family"],
                {"calls": {}, "processes": [], "denied": family_denied(sock["family"], sandbox)},
            )
            entry["calls"][sock["call"]] = entry["calls"].get(sock["call"], 0) + 1
            if name not in entry["processes"]:
                entry["processes"].append(name)
        held = [(path, "opened:" + item["result"]) for item in proc["dev_opens"] for path in [item["path"]]]
        held += [(path, "fd") for path in sorted(sample.get("fds", ()))]
        held += [(path, "mapped") for path in sorted(sample.get("maps", ()))]
        for path, how in held:
            hows = devices.setdefault(path, {**node(path), "how": {}})["how"].setdefault(name, [])
            if how not in hows:
                hows.append(how)

    for group in by_name.values():
        group["syscalls"] = dict(sorted(group["syscalls"].items()))
    # RestrictAddressFamilies= filters socket() only; socketpair() families are listed, not judged.
    refused_families = sorted(
        family for family, entry in families.items() if entry["calls"].get("socket") and entry["denied"]
    )
    return {
        "threads": len(threads),
        "processes": len(processes),
        "by_process": by_name,
        "checks": {
            "syscalls": {
                "ok": not denied_total,
                "denied_seen": denied_total,
                "seen": sorted({call for group in by_name.values() for call in group["syscalls"]}),
            },
            "socket_families": {"ok": not refused_families, "seen": families, "denied_seen": refused_families},
            "devices": device_check(devices, sandbox, node),
        },
    }


# ---------------------------------------------------------------------------------------------------------
# (5) The run on the GPU host


def _post(url: str, body: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    started = time.time()
    try:
        with unit_exec._OPENER.open(request, timeout=timeout) as response:
            data = json.loads(response.read())
        text = data["choices"][0]["text"]
        tokens = data.get("usage", {}).get("completion_tokens")
        return {"ok": True, "s": round(time.time() - started, 2), "tokens": tokens, "text": text[:40]}
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        return {"ok": False, "s": round(time.time() - started, 2), "error": str(exc)[:200]}


def run(args: argparse.Namespace) -> Dict[str, Any]:
    with open(args.unit, encoding="utf-8") as handle:
        settings = unit_exec.parse_unit(handle.read())
    with open(args.sandbox, encoding="utf-8") as handle:
        sandbox = json.load(handle)
    os.makedirs(args.work, exist_ok=True)
    trace_dir = os.path.join(args.work, "trace")
    os.makedirs(trace_dir, exist_ok=True)
    prefix = os.path.join(trace_dir, "trace")
    samples_path = os.path.join(args.work, "samples.jsonl")
    log = os.path.join(args.work, "server.log")
    argv = [unit_exec.move_in_text(arg, args.state_root) for arg in unit_exec.exec_start(settings)]
    env = unit_exec.service_environment(settings, args.state_root)
    made = unit_exec.create_directories(settings, args.state_root)
    if args.user:
        # User=: systemd hands the unit's State/Cache/LogsDirectory= to that user before the start
        account = pwd.getpwnam(args.user)
        for path in made:
            os.chown(path, account.pw_uid, account.pw_gid)
    cwd = unit_exec.move(unit_exec.last(settings, "WorkingDirectory", "/") or "/", args.state_root)
    os.makedirs(cwd, exist_ok=True)
    as_user = ["-u", args.user] if args.user else []  # strace runs the server as User= (and stays root)
    command = [
        *shlex.split(args.strace),
        *as_user,
        "-f",
        "-ff",
        "-qq",
        "-s",
        "48",
        "-e",
        "trace=all",
        "-o",
        prefix,
        "--",
        *argv,
    ]
    result: Dict[str, Any] = {"command": command, "env": unit_exec.masked(env), "started_at": time.time()}
    started = time.time()
    with open(log, "ab") as out:
        tracer = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    health = f"http://{args.host}:{args.port}/health"
    samples = open(samples_path, "a", encoding="utf-8")  # noqa: SIM115  (closed once the server is down)

    def take_samples() -> int:
        pids = session_members(tracer.pid)
        for pid in pids:
            sample = sample_process(pid)
            if sample:
                sample["t"] = round(time.time() - started, 1)
                samples.write(json.dumps(sample) + "\n")
        samples.flush()
        return len(pids)

    healthy = False
    while time.time() - started < args.timeout and tracer.poll() is None:
        take_samples()
        if unit_exec._healthy(health):
            healthy = True
            break
        time.sleep(2)
    result["healthy"] = healthy
    result["startup_s"] = round(time.time() - started, 1)
    requests = []
    if healthy:
        for index in range(args.requests):
            body = {"model": args.model, "prompt": f"speculative decoding request {index} the model the model",
                    "max_tokens": args.max_tokens, "temperature": 0}  # fmt: skip
            requests.append(_post(f"http://{args.host}:{args.port}/v1/completions", body, 60))
            take_samples()
        result["processes_serving"] = take_samples()
    result["requests"] = requests
    result["requests_ok"] = sum(1 for item in requests if item["ok"])
    # KillMode=mixed: KillSignal= to the main process (the traced server, strace's child), SIGKILL to the
    # rest once it is gone or after TimeoutStopSec=; then strace ends with its last tracee.
    stop_started = time.time()
    main = [pid for pid in session_members(tracer.pid) if _ppid(pid) == tracer.pid]
    name = (unit_exec.last(settings, "KillSignal", "SIGTERM") or "SIGTERM").upper()
    stop_timeout = float(re.sub(r"s$", "", unit_exec.last(settings, "TimeoutStopSec", "90") or "90"))
    for pid in main:
        _kill(pid, getattr(signal, name if name.startswith("SIG") else "SIG" + name))
    while main and any(_alive(pid) for pid in main) and time.time() - stop_started < stop_timeout:
        time.sleep(0.25)
    left = session_members(tracer.pid)
    for pid in left:
        _kill(pid, signal.SIGKILL)
    try:
        tracer.wait(timeout=60)
    except subprocess.TimeoutExpired:
        tracer.kill()
        tracer.wait()
    samples.close()
    result.update(stop_s=round(time.time() - stop_started, 1), killed_after_stop=left, strace_exit=tracer.returncode)
    analyze_started = time.time()
    with open("/proc/devices", encoding="utf-8") as handle:
        proc_devices = handle.read()
    result["analysis"] = analyze(prefix, samples_path, sandbox, proc_devices)
    result["analysis_s"] = round(time.time() - analyze_started, 1)
    result["trace_files"] = len(os.listdir(trace_dir))
    result["trace_bytes"] = sum(os.path.getsize(os.path.join(trace_dir, f)) for f in os.listdir(trace_dir))
    result["proc_devices"] = proc_devices
    # the DeviceAllow= paths as this host has them, so that `recheck` can resolve them without the host
    majors = char_majors(proc_devices)
    paths = [entry for entry in sandbox["device_allow"] if entry.startswith("/dev/")] + list(CLOSED_POLICY_PATHS)
    result["nodes"] = {path: node_info(path, majors) for path in paths}
    result["sandbox"] = {key: value for key, value in sandbox.items() if key not in ("allowed", "denied")}
    result["log_excerpt"] = unit_exec.log_excerpt(log)
    return result


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            data = handle.read()
        return int(data[data.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            data = handle.read()
        return data[data.rindex(")") + 2 :].split()[0] != "Z"
    except OSError:
        return False


def _kill(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _dump(data: Any, path: Optional[str]) -> None:
    text = json.dumps(data, indent=1, sort_keys=True, default=sorted)
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    else:
        print(text)


def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    box = sub.add_parser("sandbox", help="the unit's filter, families and device ACL, expanded (needs systemd-analyze)")
    box.add_argument("unit")
    box.add_argument("--out")
    box.add_argument("--filter-text", help="a saved `systemd-analyze syscall-filter` output instead of running it")
    go = sub.add_parser("run", help="start the unit's ExecStart under strace, serve, stop, analyze")
    go.add_argument("unit")
    go.add_argument("--sandbox", required=True)
    go.add_argument("--strace", default="strace", help="the strace command (split like a shell would)")
    go.add_argument("--work", required=True)
    go.add_argument("--out", required=True)
    go.add_argument("--state-root", default="")
    go.add_argument("--user", default="", help="run the server as this user, as User= would (strace -u)")
    go.add_argument("--host", default="127.0.0.1")
    go.add_argument("--port", type=int, default=8000)
    go.add_argument("--model", default="tiny")
    go.add_argument("--timeout", type=float, default=400.0, help="seconds to wait for /health")
    go.add_argument("--requests", type=int, default=5)
    go.add_argument("--max-tokens", type=int, default=32)
    again = sub.add_parser("recheck", help="a run summary's device check again, for another DeviceAllow=")
    again.add_argument("summary")
    again.add_argument("--sandbox", required=True)
    again.add_argument("--allow", action="append", default=[], help="a DeviceAllow= entry to add (repeatable)")
    again.add_argument("--out")
    look = sub.add_parser("analyze", help="the comparison over a trace folder")
    look.add_argument("--trace", required=True, help="the strace -o prefix (DIR/trace)")
    look.add_argument("--samples")
    look.add_argument("--sandbox", required=True)
    look.add_argument("--proc-devices", default="/proc/devices")
    look.add_argument("--out")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.command == "sandbox":
        with open(args.unit, encoding="utf-8") as handle:
            unit_text = handle.read()
        if args.filter_text:
            with open(args.filter_text, encoding="utf-8") as handle:
                filter_text, version = handle.read(), ""
        else:
            filter_text = subprocess.run(
                ["systemd-analyze", "syscall-filter"], check=True, capture_output=True, text=True
            ).stdout
            version = subprocess.run(
                ["systemd-analyze", "--version"], check=False, capture_output=True, text=True
            ).stdout
            version = version.splitlines()[0] if version else ""
        _dump(sandbox_from_unit(unit_text, filter_text, version), args.out)
        return 0
    if args.command == "run":
        result = run(args)
        _dump(result, args.out)
        checks = result["analysis"]["checks"]
        print(json.dumps({"healthy": result["healthy"], "startup_s": result["startup_s"],
                          "requests_ok": result["requests_ok"], **{k: v["ok"] for k, v in checks.items()},
                          "denied_syscalls": checks["syscalls"]["denied_seen"],
                          "denied_devices": sorted(checks["devices"]["denied_held"])}))  # fmt: skip
        return 0 if result["healthy"] else 1
    with open(args.sandbox, encoding="utf-8") as handle:
        sandbox = json.load(handle)
    if args.command == "recheck":
        with open(args.summary, encoding="utf-8") as handle:
            summary = json.load(handle)
        sandbox["device_allow"] = sandbox["device_allow"] + args.allow
        checked = recheck(summary, sandbox)
        _dump({"device_allow": sandbox["device_allow"], "devices": checked}, args.out)
        return 0 if checked["ok"] else 1
    proc_devices = ""
    if args.proc_devices and os.path.exists(args.proc_devices):
        with open(args.proc_devices, encoding="utf-8") as handle:
            proc_devices = handle.read()
    _dump(analyze(args.trace, args.samples, sandbox, proc_devices), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
