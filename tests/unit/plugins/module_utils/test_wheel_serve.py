# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The build host's short-lived wheel server: a real server process, real HTTP requests on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_serve import (
    MARK,
    WheelServeError,
    plan_server,
    server_running,
    start_server,
    stop_server,
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # An exited child of this test process stays a zombie until reaped: that is not alive.
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] != "Z"


def _gone(pid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _refused(url: str, within: float = 30.0) -> bool:
    """Whether connecting to `url` is refused (nothing listens) within `within` s. A connection the kernel
    queued while the server was closing is reset instead (seen on a busy machine): try again then."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=5).close()
        except urllib.error.URLError as error:
            if isinstance(error.reason, ConnectionRefusedError):
                return True
        except ConnectionResetError:
            pass
        else:
            return False  # it still served the wheel
        time.sleep(0.1)
    return False


@pytest.fixture
def wheel(tmp_path):
    path = tmp_path / "vllm-1.0-py3-none-any.whl"
    path.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    return path


@pytest.fixture
def server(wheel):
    started = start_server(str(wheel), "127.0.0.1", timeout=120)
    yield started
    stop_server(started["pid"], started["token"])


def test_serves_the_file_at_its_url_only(server, wheel):
    assert server["url"] == f"http://127.0.0.1:{server['port']}/{server['token']}/{wheel.name}"
    with urllib.request.urlopen(server["url"], timeout=30) as response:
        assert response.status == 200
        assert int(response.headers["Content-Length"]) == wheel.stat().st_size
        assert response.read() == wheel.read_bytes()
    head = urllib.request.Request(server["url"], method="HEAD")
    with urllib.request.urlopen(head, timeout=30) as response:
        assert response.status == 200 and response.read() == b""
    base = server["url"].rsplit("/", 2)[0]
    for other in (f"{base}/{wheel.name}", f"{base}/wrong-token/{wheel.name}", f"{base}/{server['token']}/"):
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(other, timeout=30)
        assert denied.value.code == 404


def test_each_start_gets_its_own_token_and_port(server, wheel):
    second = start_server(str(wheel), "127.0.0.1", timeout=120)
    try:
        assert second["token"] != server["token"] and second["port"] != server["port"]
    finally:
        stop_server(second["pid"], second["token"])


def test_stop_ends_the_server_and_a_second_stop_is_no_error(wheel):
    started = start_server(str(wheel), "127.0.0.1", timeout=120)
    assert _alive(started["pid"])
    assert stop_server(started["pid"], started["token"]) is True
    assert _gone(started["pid"])
    assert _refused(started["url"])
    assert stop_server(started["pid"], started["token"]) is False


def test_stop_leaves_a_process_without_the_token_alone(server):
    assert stop_server(server["pid"], "another-token") is False
    assert _alive(server["pid"])
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert stop_server(stranger.pid, server["token"]) is False
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_the_token_is_not_on_the_servers_argv(server):
    """Issue 28, also seen: the token (the URL's only secret) was on the server's argv, readable in `ps`."""
    with open(f"/proc/{server['pid']}/cmdline", "rb") as handle:
        argv = handle.read().decode()
    assert server["token"] not in argv and "vllm-ops-wheel-serve" in argv
    with urllib.request.urlopen(server["url"], timeout=30) as response:
        assert response.status == 200


def test_an_idle_connection_is_closed_after_the_connection_timeout(wheel):
    """Issue 28, also seen: a client that connects and sends nothing held a server thread for its whole life."""
    started = start_server(str(wheel), "127.0.0.1", timeout=120, connection_timeout=1)
    try:
        with socket.create_connection(("127.0.0.1", started["port"]), timeout=30) as silent:
            began = time.monotonic()
            assert silent.recv(1) == b""  # the server closed it (before: recv waits out the 30 s, then raises)
            assert time.monotonic() - began < 25
    finally:
        stop_server(started["pid"], started["token"])


def test_the_server_exits_after_its_timeout(wheel):
    started = start_server(str(wheel), "127.0.0.1", timeout=1)
    assert _gone(started["pid"])


def test_an_address_this_host_does_not_own_is_refused_with_the_fix(wheel):
    # 192.0.2.0/24 is TEST-NET-1: never a local address.
    with pytest.raises(WheelServeError, match=r"could not serve .* on 192\.0\.2\.1: .*address.*set the address"):
        start_server(str(wheel), "192.0.2.1", timeout=30)


def test_a_missing_file_is_refused_before_any_server_starts(tmp_path):
    with pytest.raises(WheelServeError, match="is not a file on this host"):
        start_server(str(tmp_path / "absent.whl"), "127.0.0.1", timeout=30)
    present = tmp_path / "present.whl"
    present.write_bytes(b"wheel")
    with pytest.raises(WheelServeError, match="timeout must be positive"):
        start_server(str(present), "127.0.0.1", timeout=0)


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


def test_plan_server_checks_what_a_start_checks_and_starts_nothing(wheel, tmp_path):
    plan = plan_server(str(wheel), "127.0.0.1", timeout=30)
    assert plan == {"path": str(wheel), "address": "127.0.0.1", "size": 3 * 1024 * 1024 + 17, "timeout": 30}
    assert _servers_of(wheel) == 0
    with pytest.raises(WheelServeError, match=r"could not serve .* on 192\.0\.2\.1: .*set the address"):
        plan_server(str(wheel), "192.0.2.1", timeout=30)
    with pytest.raises(WheelServeError, match="is not a file on this host"):
        plan_server(str(tmp_path / "absent.whl"), "127.0.0.1", timeout=30)
    with pytest.raises(WheelServeError, match="timeout must be positive"):
        plan_server(str(wheel), "127.0.0.1", timeout=0)


def test_server_running_names_only_the_server_with_its_token(server):
    assert server_running(server["pid"], server["token"]) is True
    assert server_running(server["pid"], "another-token") is False
    assert server_running(os.getpid(), server["token"]) is False
    stop_server(server["pid"], server["token"])
    assert _gone(server["pid"]) and server_running(server["pid"], server["token"]) is False
