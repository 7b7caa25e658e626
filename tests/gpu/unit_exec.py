# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Start and stop the service a rendered vllm-<instance>.service describes, on a host without systemd.

    python3 unit_exec.py start UNIT --pidfile F --log F --health-url URL [--timeout S] [--state-root DIR]
    python3 unit_exec.py stop UNIT --pidfile F [--log F]

`start` runs the unit's ExecStart= argv exactly as written, in WorkingDirectory=, in the environment
systemd would give it: a default PATH, Environment= and then EnvironmentFile= (which overrides).
The process gets its own session (its process group stands in for the unit's control group) and its
stdout and stderr go to --log (the journal). It then polls --health-url until HTTP 200, the process
exits, or --timeout passes. Exit status 0 only when the server is healthy.

`stop` does what `systemctl stop` does: with KillMode=control-group (systemd's default), KillSignal= to
every process of the group and SIGKILL to whatever is left after TimeoutStopSec=; with KillMode=mixed,
KillSignal= to the main process only and SIGKILL to the rest of the group once it exited (or after
TimeoutStopSec=). `$$` and `%%` in ExecStart= are unescaped as systemd does; other `$` and `%` are refused.

Not reproduced: User=/Group= (it runs as the caller), the sandboxing directives and the unit's resource
limits. StateDirectory=/CacheDirectory=/LogsDirectory= are created as systemd would; with --state-root
they and every /var/{lib,cache,log}/ path in Environment= and WorkingDirectory= move under that
directory, for runs that must not write to /var. Values of variables with a TOKEN, KEY, SECRET or
PASSWORD part in their name (HF_TOKEN, VLLM_API_KEY) are masked in the output. Prints one JSON object.

Test equipment of the collection (tests/gpu); standard library only, Linux only (/proc).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

# No proxy: the server is local, whatever http_proxy the caller has.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
MOVABLE_PREFIXES = ("/var/lib/", "/var/cache/", "/var/log/")
DIRECTORY_SETTINGS = {"StateDirectory": "/var/lib", "CacheDirectory": "/var/cache", "LogsDirectory": "/var/log"}
LOG_PATTERNS = {
    "version": re.compile(r"\bversion \d+\.\d+|LLM engine \(v"),
    "args": re.compile(r"non-default args"),
    "runner": re.compile(r"model runner", re.IGNORECASE),
    "attention": re.compile(r"attention backend|FlashAttention version"),
    "drafter": re.compile(r"auxiliary layers|dflash", re.IGNORECASE),
    "startup": re.compile(r"Application startup complete|Starting vLLM|init engine .* took"),
    "spec_decode": re.compile(r"SpecDecoding metrics"),
    "errors": re.compile(r"Traceback|Error|CRITICAL|unrecognized arguments"),
}


class UnitError(Exception):
    """The unit cannot be run as written; the message names the fix."""


def parse_unit(text: str) -> Dict[str, List[str]]:
    """Settings of the [Service] section, each key -> every value in order (continuation lines joined)."""
    settings: Dict[str, List[str]] = {}
    section = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section != "Service" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def last(settings: Dict[str, List[str]], key: str, default: Optional[str] = None) -> Optional[str]:
    values = settings.get(key)
    return values[-1] if values else default


def exec_start(settings: Dict[str, List[str]]) -> List[str]:
    values = [v for v in settings.get("ExecStart", []) if v]
    if len(values) != 1:
        raise UnitError(f"the unit needs exactly one ExecStart= (Type=exec), found {len(values)}")
    command = values[0].lstrip("-@:+!")  # systemd's prefixes change privileges/failure handling, not argv
    unescaped = command.replace("$$", "").replace("%%", "")
    if "$" in unescaped or "%" in unescaped:
        raise UnitError("ExecStart= uses $VAR or %-specifiers, which this runner does not expand")
    # `$$` and `%%` are systemd's escapes for a literal `$` and `%` (the role's /bin/sh -c command line)
    return shlex.split(command.replace("$$", "$").replace("%%", "%"))


def parse_environment(values: List[str]) -> Dict[str, str]:
    env: Dict[str, str] = {}
    for value in values:
        for item in shlex.split(value):
            if "=" in item:
                key, val = item.split("=", 1)
                env[key] = val
    return env


def parse_environment_file(path: str) -> Dict[str, str]:
    optional = path.startswith("-")
    path = path.lstrip("-")
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        if optional:
            return {}
        raise UnitError(f"EnvironmentFile={path} does not exist; template it first (role dflash_config)") from None
    env: Dict[str, str] = {}
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def move(path: str, state_root: str) -> str:
    if state_root and path.startswith(MOVABLE_PREFIXES):
        return os.path.join(state_root, path.lstrip("/"))
    return path


def move_in_text(text: str, state_root: str) -> str:
    """`move` for every /var/{lib,cache,log}/ path inside a command line (the role's sh -c script)."""
    if not state_root:
        return text
    return re.sub(r"(?<![\w/.])/var/(lib|cache|log)/", lambda m: move(m.group(0), state_root), text)


def service_environment(settings: Dict[str, List[str]], state_root: str) -> Dict[str, str]:
    env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}
    env.update(parse_environment(settings.get("Environment", [])))
    for path in settings.get("EnvironmentFile", []):
        env.update(parse_environment_file(path))  # files override Environment=, as in systemd
    return {key: move(value, state_root) for key, value in env.items()}


def is_secret(name: str) -> bool:
    return any(part in SECRET_MARKERS for part in name.upper().split("_"))


def masked(env: Dict[str, str]) -> Dict[str, str]:
    return {key: ("********" if is_secret(key) and value else value) for key, value in env.items()}


def create_directories(settings: Dict[str, List[str]], state_root: str) -> List[str]:
    made = []
    for key, base in DIRECTORY_SETTINGS.items():
        for value in settings.get(key, []):
            for name in value.split():
                path = move(os.path.join(base, name) + "/", state_root).rstrip("/")
                os.makedirs(path, exist_ok=True)
                made.append(path)
    return made


def _healthy(url: str) -> bool:
    try:
        with _OPENER.open(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def log_excerpt(path: str, limit: int = 8) -> Dict[str, List[str]]:
    """First lines of each interesting kind (last ones for spec-decode stats), without access-log noise."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = [line.rstrip("\n") for line in handle if '" 200' not in line and "GET /" not in line]
    except OSError:
        return {}
    excerpt: Dict[str, List[str]] = {}
    for kind, pattern in LOG_PATTERNS.items():
        found = [line[:600] for line in lines if pattern.search(line)]
        excerpt[kind] = found[-limit:] if kind == "spec_decode" else found[:limit]
    excerpt["tail"] = [line[:600] for line in lines[-limit:]]
    return excerpt


def spawn(unit: str, log: str, state_root: str) -> Tuple[subprocess.Popen, Dict[str, Any]]:
    """Run the unit's ExecStart= as systemd would (own session, output to `log`); the process and a record."""
    with open(unit, encoding="utf-8") as handle:
        settings = parse_unit(handle.read())
    argv = [move_in_text(arg, state_root) for arg in exec_start(settings)]
    env = service_environment(settings, state_root)
    directories = create_directories(settings, state_root)
    cwd = move(last(settings, "WorkingDirectory", "/") or "/", state_root)
    os.makedirs(cwd, exist_ok=True)
    result: Dict[str, Any] = {
        "unit": unit,
        "argv": argv,
        "env": masked(env),
        "cwd": cwd,
        "directories": directories,
        "user": last(settings, "User"),
        "runs_as_uid": os.getuid(),
        "log": log,
    }
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    with open(log, "ab") as out:
        process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    return process, result


def start(unit: str, pidfile: str, log: str, health_url: str, timeout: float, state_root: str) -> Dict[str, Any]:
    started = time.time()
    process, result = spawn(unit, log, state_root)
    with open(pidfile, "w", encoding="utf-8") as handle:
        handle.write(f"{process.pid}\n")
    result["pid"] = process.pid
    deadline = started + timeout
    healthy = False
    while time.time() < deadline:
        if _healthy(health_url):
            healthy = True
            break
        if process.poll() is not None:
            break
        time.sleep(0.5)
    result.update(healthy=healthy, startup_s=round(time.time() - started, 2), exit_code=process.poll())
    if not healthy:
        why = f"exited with status {process.returncode}" if process.returncode is not None else "is still starting"
        result["msg"] = f"{health_url} not healthy after {result['startup_s']} s: the server {why}; see {log}"
        result["log_excerpt"] = log_excerpt(log)
    return result


def _group_members(pgid: int) -> List[int]:
    """Live (non-zombie) processes of a process group, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        state, group = fields[0], int(fields[2])  # state, ppid, pgrp
        if group == pgid and state != "Z":
            members.append(int(entry))
    return members


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def stop(unit: str, pidfile: str, log: Optional[str]) -> Dict[str, Any]:
    with open(unit, encoding="utf-8") as handle:
        settings = parse_unit(handle.read())
    name = (last(settings, "KillSignal", "SIGTERM") or "SIGTERM").upper()
    signum = getattr(signal, name if name.startswith("SIG") else "SIG" + name)
    stop_timeout = float(re.sub(r"s$", "", last(settings, "TimeoutStopSec", "90") or "90"))
    try:
        with open(pidfile, encoding="utf-8") as handle:
            pgid = int(handle.read().strip())
    except (OSError, ValueError):
        return {"stopped": True, "msg": f"no pidfile {pidfile}: nothing to stop"}
    kill_mode = last(settings, "KillMode", "control-group") or "control-group"
    started = time.time()
    result: Dict[str, Any] = {"pid": pgid, "signal": name, "timeout_stop_s": stop_timeout, "killed": [],
                              "kill_mode": kill_mode}  # fmt: skip
    if _group_members(pgid):
        if kill_mode == "mixed":
            # KillSignal= to the main process only; SIGKILL to the rest of the unit once it is gone
            with contextlib.suppress(ProcessLookupError):
                os.kill(pgid, signum)
            while pgid in _group_members(pgid) and time.time() - started < stop_timeout:
                time.sleep(0.25)
        else:
            _signal_group(pgid, signum)
            while _group_members(pgid) and time.time() - started < stop_timeout:
                time.sleep(0.25)
        left = _group_members(pgid)
        if left:
            result["killed"] = left
            _signal_group(pgid, signal.SIGKILL)
            time.sleep(0.5)
    result.update(stopped=not _group_members(pgid), stop_s=round(time.time() - started, 2))
    os.unlink(pidfile)
    if log:
        result["log_excerpt"] = log_excerpt(log)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start_parser = sub.add_parser("start", help="start ExecStart= and wait for health")
    stop_parser = sub.add_parser("stop", help="stop the process group as the unit's KillMode= does")
    for each in (start_parser, stop_parser):
        each.add_argument("unit", help="the rendered unit file")
        each.add_argument("--pidfile", required=True)
    start_parser.add_argument("--log", required=True, help="file for the server's stdout and stderr")
    stop_parser.add_argument("--log", help="server log to excerpt after the stop")
    start_parser.add_argument("--health-url", required=True)
    start_parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for health")
    start_parser.add_argument("--state-root", default="", help="move /var/{lib,cache,log}/ paths under this dir")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            result = start(args.unit, args.pidfile, args.log, args.health_url, args.timeout, args.state_root)
            ok = result["healthy"]
        else:
            result = stop(args.unit, args.pidfile, args.log)
            ok = result["stopped"]
    except (UnitError, OSError, ValueError) as exc:
        result, ok = {"msg": str(exc)}, False
    result["failed"] = not ok
    print(json.dumps(result, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
