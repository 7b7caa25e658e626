# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A short-lived HTTP server for one file: the build host hands the fleet's wheel to the other hosts.

`start_server` runs `SERVER_SCRIPT` in a new session of its own (it outlives the module, whose payload is
deleted when it returns): bound to one address, on a port the kernel picks, it answers GET and HEAD for
exactly `/<token>/<file name>` (a random token per start; any other path is 404) with the file, sent by
`sendfile` (no copy through Python), and exits after `timeout` seconds or on SIGTERM (`stop_server`).
The token reaches the server on its stdin, never its argv (which every local user reads in `ps`); the argv
names the server by a digest of the token instead. A connection idle for CONNECTION_TIMEOUT seconds (a
client that sends no request, or stops reading) is closed, so no client holds a thread for the server's life.
Integrity is the client's to check (get_url's `checksum` with the build's sha256): the server only sends
bytes. Check mode starts nothing: `plan_server` runs the checks a start does first (the file, the timeout,
a bind of the address) and says what would be served; `server_running` says whether a stop would stop one.
Standard library only: this runs on the target host's system Python (3.8+).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, Optional

__all__ = [
    "SERVER_SCRIPT",
    "WheelServeError",
    "plan_server",
    "server_running",
    "server_url",
    "start_server",
    "stop_server",
]

# The first argument marks the process, and the second (a digest of the token) names it, so that stop_server
# kills only a server it started (a pid alone may have been reused).
MARK = "vllm-ops-wheel-serve"
STARTUP_SECONDS = 30.0
CONNECTION_TIMEOUT = 60.0

SERVER_SCRIPT = r"""
import http.server, os, socket, sys, threading
mark, name, path, address = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
timeout, idle = float(sys.argv[5]), float(sys.argv[6])
token = sys.stdin.readline().strip()  # never on the argv
route = "/" + token + "/" + os.path.basename(path)
size = os.path.getsize(path)
open(path, "rb").close()  # unreadable: fail now, while the caller reads stderr


class Handler(http.server.BaseHTTPRequestHandler):
    timeout = idle  # a socket timeout per connection: a silent or stalled client is dropped

    def _headers(self):
        if self.path != route:
            self.send_error(404)
            return False
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        return True

    def do_HEAD(self):
        self._headers()

    def do_GET(self):
        if self._headers():
            with open(path, "rb") as handle:
                self.connection.sendfile(handle)

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that went away mid-transfer; its checksum check fails, not the server


server = Server((address, 0), Handler)
threading.Timer(timeout, server.shutdown).start()
sys.stdout.write("%d\n" % server.server_address[1])
sys.stdout.flush()
devnull = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(devnull, fd)
server.serve_forever()
"""


class WheelServeError(Exception):
    """The server could not be started; the message names the fix (a stop that finds nothing is no error)."""


def server_url(address: str, port: int, token: str, path: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/{token}/{os.path.basename(path)}"


def _name(token: str) -> str:
    """The server's name on its argv: a digest of its token (the token itself is a secret)."""
    return "id-" + hashlib.sha256(token.encode()).hexdigest()[:24]


def _check_file_and_timeout(path: str, timeout: float) -> None:
    if not os.path.isfile(path):
        raise WheelServeError(f"{path} is not a file on this host; serve the wheel the build left (its `wheel` result)")
    if timeout <= 0:
        raise WheelServeError(f"timeout must be positive, got {timeout}")


def _address_error(path: str, address: str, reason: str) -> WheelServeError:
    return WheelServeError(
        f"could not serve {path} on {address}: {reason}; set the address to one this host owns and the "
        "other hosts reach"
    )


def plan_server(path: str, address: str, timeout: float) -> Dict[str, Any]:
    """What start_server would serve, starting nothing (check mode): {path, address, size, timeout}.

    Runs the checks a start does: the file, the timeout, and a bind of `address` on a port the kernel picks,
    closed at once (the server binds the same way), so an address this host does not own fails here too.
    """
    _check_file_and_timeout(path, timeout)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except (OSError, OverflowError) as exc:
        raise _address_error(path, address, str(exc)) from exc
    return {"path": path, "address": address, "size": os.path.getsize(path), "timeout": timeout}


def start_server(
    path: str,
    address: str,
    timeout: float,
    python: str = sys.executable,
    startup: float = STARTUP_SECONDS,
    connection_timeout: float = CONNECTION_TIMEOUT,
) -> Dict[str, Any]:
    """Start serving `path` on `address` for `timeout` seconds: {url, port, pid, token}."""
    _check_file_and_timeout(path, timeout)
    token = secrets.token_urlsafe(18)
    argv = [python, "-c", SERVER_SCRIPT, MARK, _name(token), path, address, str(timeout), str(connection_timeout)]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr
    if stdin is None or stdout is None or stderr is None:  # not with PIPE; for the type checker
        raise WheelServeError("the server's pipes are missing")
    try:
        stdin.write(token.encode() + b"\n")
        stdin.close()
    except OSError:
        pass  # it died at once: its stderr says why, below
    line = b""
    deadline = time.monotonic() + startup
    while not line.endswith(b"\n") and time.monotonic() < deadline:
        if not select.select([stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            break
        chunk = os.read(stdout.fileno(), 64)
        if not chunk:
            break
        line += chunk
    stdout.close()
    if not line.strip().isdigit():
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        error = stderr.read().decode("utf-8", "replace").strip().splitlines()
        stderr.close()
        raise _address_error(path, address, error[-1] if error else f"no port reported within {startup:.0f}s")
    stderr.close()
    port = int(line)
    return {"url": server_url(address, port, token, path), "port": port, "pid": proc.pid, "token": token}


def _cmdline(pid: int) -> Optional[list]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [arg.decode("utf-8", "replace") for arg in handle.read().split(b"\0")]
    except OSError:
        return None


def server_running(pid: int, token: str) -> bool:
    """Whether `pid` is still the server start_server returned with `token` (what a stop would end)."""
    args = _cmdline(pid)
    return args is not None and MARK in args and _name(token) in args


def stop_server(pid: int, token: str) -> bool:
    """Stop the server `start_server` returned (pid and token); False when it is gone already."""
    if not server_running(pid, token):
        return False  # exited (timeout), or the pid now belongs to another process: leave that alone
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True
