# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kill the engine core of a real `vllm serve` started as the unit's ExecStart=, and record how vLLM exits.

    python3 engine_death.py UNIT --log F --health-url URL [--model NAME] [--api-key-env VAR]
                            [--timeout S] [--exit-timeout S] [--state-root DIR]

Starts the rendered vllm-<instance>.service the way unit_exec.py does (ExecStart=, Environment=,
EnvironmentFile=, WorkingDirectory=, own session) and waits for /health. With --model it streams one
completion as long as the model allows and, at its first chunk (so it is in flight), SIGKILLs the engine
core: the API server's child named `VLLM::EngineCore` (setproctitle; the kernel keeps `VLLM::EngineCor`),
or else its one multiprocessing child that is not the resource tracker. It then records /health as it
changes, what the streamed request got, the exit status of the API server and how long it took, the
processes of the group left behind (then SIGKILLed), and what systemd would do with that exit under
Restart=on-failure and Restart=always, and under the unit's own Restart=. The claim it checks: on engine
death vLLM's API server exits with status 0 (its watchdog, vllm#48966), which on-failure takes for a
clean stop.

Prints one JSON object. Exit status 0 when the engine core was found, killed, and the API server exited
within --exit-timeout; 1 otherwise (the JSON says why). Test equipment of the collection (tests/gpu),
standard library only, Linux only (/proc).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import unit_exec

ENGINE_TITLE = "VLLM::EngineCor"
# systemd's Restart=on-failure does not restart a clean exit: status 0, or death by one of these signals
CLEAN_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE}


def process_table() -> Dict[int, Dict[str, Any]]:
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                stat = handle.read()
            fields = stat[stat.rindex(")") + 2 :].split()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            table[int(entry)] = {"ppid": int(fields[1]), "state": fields[0], "pgrp": int(fields[2]), "comm": comm,
                                 "cmdline": cmdline[:300]}  # fmt: skip
    return table


def engine_core(main: int, table: Dict[int, Dict[str, Any]]) -> Optional[int]:
    children = {pid: p for pid, p in table.items() if p["ppid"] == main and p["state"] != "Z"}
    for pid, proc in children.items():
        if proc["comm"] == ENGINE_TITLE or "EngineCore" in proc["cmdline"]:
            return pid
    spawned = [pid for pid, p in children.items()
               if "multiprocessing" in p["cmdline"] and "resource_tracker" not in p["cmdline"]]  # fmt: skip
    return spawned[0] if len(spawned) == 1 else None


def status_of(url: str, timeout: float = 2.0) -> Optional[int]:
    try:
        with unit_exec._OPENER.open(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def ask_in_background(base: str, model: str, api_key: str, result: Dict[str, Any]) -> threading.Event:
    """One streamed completion as long as the model allows; the event is set at its first chunk (it is in
    flight). `result` gets what the client saw: the end of the stream, an error event, or a broken connection."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    first_chunk = threading.Event()

    def ask() -> None:
        began = time.monotonic()
        try:
            request = urllib.request.Request(base + "/v1/models", headers=headers)
            with unit_exec._OPENER.open(request, timeout=30) as response:
                max_model_len = int(json.loads(response.read())["data"][0].get("max_model_len") or 1024)
            body = {"model": model, "prompt": "Count slowly from one to one thousand:", "stream": True,
                    "max_tokens": max(max_model_len - 64, 16), "ignore_eos": True}  # fmt: skip
            request = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), headers=headers)
            with unit_exec._OPENER.open(request, timeout=300) as response:
                result["status"] = response.status
                for raw in response:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    first_chunk.set()
                    data = line[5:].strip()
                    if data == "[DONE]":
                        result["done"] = True
                        break
                    event = json.loads(data)
                    if "error" in event:
                        result["error_event"] = event["error"]
                    for choice in event.get("choices") or []:
                        if choice.get("finish_reason"):
                            result["finish_reason"] = choice["finish_reason"]
        except urllib.error.HTTPError as e:
            result.update(status=e.code, body=e.read().decode(errors="replace")[:300])
        except (urllib.error.URLError, OSError, ValueError) as e:
            result["broken"] = repr(e)[:300]
        finally:
            first_chunk.set()
            result["seconds"] = round(time.monotonic() - began, 2)

    threading.Thread(target=ask, daemon=True).start()
    return first_chunk


def restart_verdict(returncode: Optional[int]) -> Dict[str, Any]:
    if returncode is None:
        return {"on-failure": None, "always": None}
    clean = returncode == 0 or (returncode < 0 and -returncode in CLEAN_SIGNALS)
    return {"on-failure": not clean, "always": True}


def run(args: argparse.Namespace) -> Dict[str, Any]:
    with open(args.unit, encoding="utf-8") as handle:
        settings = unit_exec.parse_unit(handle.read())
    base = args.health_url.rsplit("/health", 1)[0]
    process, record = unit_exec.spawn(args.unit, args.log, args.state_root)
    result: Dict[str, Any] = {"start": record, "pid": process.pid, "unit_restart": unit_exec.last(settings, "Restart")}
    try:
        began = time.monotonic()
        while status_of(args.health_url) != 200:
            if process.poll() is not None or time.monotonic() - began > args.timeout:
                result["msg"] = f"not healthy within {args.timeout} s (exit status {process.poll()}); see {args.log}"
                return result
            time.sleep(0.5)
        result["startup_s"] = round(time.monotonic() - began, 2)
        table = process_table()
        engine = engine_core(process.pid, table)
        result["children"] = {pid: p for pid, p in table.items() if p["ppid"] == process.pid}
        if engine is None:
            result["msg"] = "no engine core process found among the API server's children (see children)"
            return result
        result["engine_core"] = {"pid": engine, **table[engine]}
        result["workers"] = {pid: p for pid, p in table.items() if p["ppid"] == engine}
        request: Dict[str, Any] = {}
        if args.model:
            streaming = ask_in_background(base, args.model, os.environ.get(args.api_key_env, ""), request)
            streaming.wait(60)
            request["in_flight_at_kill"] = not request.get("done") and "seconds" not in request
        os.kill(engine, signal.SIGKILL)
        killed = time.monotonic()
        health: List[List[Any]] = []
        while process.poll() is None and time.monotonic() - killed < args.exit_timeout:
            status = status_of(args.health_url, 1.0)
            if not health or health[-1][1] != status:
                health.append([round(time.monotonic() - killed, 2), status])
            time.sleep(0.2)
        result["health_after_kill"] = health  # [seconds after the kill, /health status]; None = refused
        result["exit_status"] = process.poll()
        result["exit_s"] = round(time.monotonic() - killed, 2) if process.returncode is not None else None
        result["request_in_flight"] = request if args.model else None
        time.sleep(2)
        result["left_in_group"] = unit_exec._group_members(process.pid)
        result["restarts_under"] = restart_verdict(process.returncode)
        restart = (result["unit_restart"] or "no").strip()
        result["unit_would_restart"] = result["restarts_under"].get(restart, False) if restart != "no" else False
        if process.returncode is None:
            result["msg"] = f"the API server was still running {args.exit_timeout} s after its engine core was killed"
        return result
    finally:
        unit_exec._signal_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            process.wait(10)
        result["log_excerpt"] = unit_exec.log_excerpt(args.log, limit=12)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("unit", help="the rendered unit file")
    parser.add_argument("--log", required=True, help="file for the server's stdout and stderr")
    parser.add_argument("--health-url", required=True)
    parser.add_argument("--model", default="", help="served model name: one request is in flight at the kill")
    parser.add_argument("--api-key-env", default="VLLM_API_KEY", help="variable of this environment with the key")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for health")
    parser.add_argument("--exit-timeout", type=float, default=120.0, help="seconds to wait for the exit")
    parser.add_argument("--state-root", default="", help="move /var/{lib,cache,log}/ paths under this dir")
    args = parser.parse_args(argv)
    try:
        result = run(args)
    except (unit_exec.UnitError, OSError, ValueError) as exc:
        result = {"msg": str(exc)}
    ok = "msg" not in result
    result["failed"] = not ok
    print(json.dumps(result, sort_keys=True, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
