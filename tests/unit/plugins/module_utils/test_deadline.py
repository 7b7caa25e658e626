"""Commands under a hard deadline: output, timeout, group kill, and the module itself being killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import (
    Deadline,
    group_members,
    run,
    tail,
)
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import process_alive
from helpers.polling import wait_for

COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 4, ".cache", "ac"))

# A tree like a build: a shell that starts a background grandchild (which ignores SIGTERM, like a
# stubborn compiler) and records both pids, then waits.
TREE = textwrap.dedent(
    """
    echo started
    (trap '' TERM; sleep 300) &
    echo $! > "$1/grandchild.pid"
    echo $$ > "$1/shell.pid"
    wait
    """
)


# A build child that leaves the process group: it forks a process that calls setsid() (its own session,
# as a daemonising tool does), ignores SIGTERM and records its pid; the shell then waits.
ESCAPING = textwrap.dedent(
    """
    import os, signal, sys, time
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:  # a daemon's double fork: its parent exits, it is nobody's child here
            with open(sys.argv[1] + "/escaped.pid", "w") as handle:
                handle.write(str(os.getpid()))
            time.sleep(300)
        os._exit(0)
    time.sleep(300)
    """
)


def wait_for_file(path: str, seconds: float = 10) -> str:
    def text() -> str:
        return Path(path).read_text().strip() if os.path.exists(path) else ""

    return wait_for(text, f"{path} is written", seconds)


def wait_dead(pid: int, seconds: float = 10) -> bool:
    return not process_alive(pid, settle=seconds)


def test_captures_stdout_stderr_and_rc():
    result = run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10, watchdog=False)
    assert (result.rc, result.timed_out, result.ok) == (3, False, False)
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert result.log_tail == "err"


def test_appends_to_log_with_header_and_redacts(tmp_path):
    log = str(tmp_path / "logs" / "build.log")
    run(["echo", "first"], timeout=10, log_path=log)
    result = run(["sh", "-c", "echo second; echo https://u:tok@h/r >&2", "https://u:tok@h/r"], 10, log_path=log)
    assert result.ok
    text = Path(log).read_text()
    assert text.index("$ echo first") < text.index("first\n") < text.index("second")
    assert "exit 0 after" in text
    assert "tok" not in result.log_tail
    assert "https://h/r" in result.log_tail
    assert "tok" not in result.command


@pytest.mark.slow
def test_timeout_kills_the_whole_group(tmp_path):
    log = str(tmp_path / "build.log")
    started = time.monotonic()
    result = run(["sh", "-c", TREE, "sh", str(tmp_path)], timeout=1.5, log_path=log, grace=1.0)
    took = time.monotonic() - started
    assert result.timed_out
    assert result.rc == -signal.SIGTERM  # the shell honours SIGTERM; the grandchild needed SIGKILL
    assert 2.5 <= took < 8
    assert result.survivors == []
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert wait_dead(grandchild, 2), "grandchild that ignores SIGTERM survived"
    assert group_members(int((tmp_path / "shell.pid").read_text())) == []
    assert "TIMEOUT after" in result.log_tail
    assert "started" in tail(log, 5)


@pytest.mark.slow
def test_the_deadline_kill_reaches_a_child_that_called_setsid(tmp_path):
    """Issue 28, case 11: a build child in a session of its own survived the deadline kill of the group."""
    result = run([sys.executable, "-c", ESCAPING, str(tmp_path)], timeout=3, grace=1.0, watchdog=False)
    escaped = int(wait_for_file(str(tmp_path / "escaped.pid")))
    assert result.timed_out and result.survivors == []
    assert wait_dead(escaped, 2), "the child that called setsid() survived the deadline"


@pytest.mark.slow
def test_the_watchdog_reaches_a_child_that_called_setsid(tmp_path):
    """The module SIGKILLed (Ansible's async timeout): the watchdog kills what left the group too."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {COLLECTIONS!r})
        from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import run
        run([sys.executable, "-c", {ESCAPING!r}, {str(tmp_path)!r}], timeout=600, grace=1.0)
        """
    )
    module = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    escaped = int(wait_for_file(str(tmp_path / "escaped.pid"), 30))
    os.killpg(module.pid, signal.SIGKILL)
    module.wait()
    assert wait_dead(escaped, 15), "the child that called setsid() survived the module's SIGKILL"


@pytest.mark.slow
def test_progress_is_reported_while_the_command_runs(tmp_path):
    log = tmp_path / "build.log"
    seen = []

    def progress() -> None:
        seen.append(tail(str(log), 1))
        if len(seen) == 2:
            raise OSError("a status file that cannot be written")  # must not disturb the command

    script = "for i in 1 2 3 4 5 6; do echo step $i; sleep 0.25; done"
    result = run(["sh", "-c", script], timeout=20, log_path=str(log), progress=progress, progress_every=0.3)
    assert result.ok
    assert 3 <= len(seen) <= 7
    assert any(line.startswith("step ") for line in seen)  # the log's latest line, mid-command
    assert run(["true"], timeout=5, progress=lambda: seen.append("x"), progress_every=60).ok  # quick: none


def test_expired_budget_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    result = run(["touch", str(marker)], timeout=0)
    assert result.timed_out and result.rc is None
    assert not marker.exists()


def test_missing_program_raises():
    with pytest.raises(OSError):
        run(["/nonexistent/program"], timeout=5)


def test_deadline_budget():
    # Bounds from the clock read around each step, not a guess at how fast two statements run (xdist, load).
    before = time.monotonic()
    deadline = Deadline(30)
    remaining = deadline.remaining()
    assert 30 - (time.monotonic() - before) <= remaining <= 30
    assert not deadline.expired()
    short = Deadline(0.05)
    wait_for(short.expired, "a 50 ms budget expires")
    assert short.remaining() == 0.0 and short.elapsed() >= 0.05


def _module_running_tree(tmp_path) -> subprocess.Popen:
    """A stand-in for the Ansible module: a python process running TREE under run()."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {COLLECTIONS!r})
        from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import run, CommandInterrupted
        try:
            run(["sh", "-c", {TREE!r}, "sh", {str(tmp_path)!r}], timeout=600, grace=1.0)
        except CommandInterrupted as exc:
            print("interrupted:", exc, flush=True)
            sys.exit(7)
        """
    )
    # Its own group, like async_wrapper's child, so the test can kill "the module's group".
    module = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    wait_for_file(str(tmp_path / "shell.pid"))
    return module


def test_sigkilled_module_still_takes_the_build_down(tmp_path):
    """Ansible's async timeout SIGKILLs the module's process group: the watchdog must act."""
    module = _module_running_tree(tmp_path)
    grandchild = int(wait_for_file(str(tmp_path / "grandchild.pid")))
    os.killpg(module.pid, signal.SIGKILL)
    module.wait()
    assert wait_dead(grandchild, 10), "build group survived the module's SIGKILL"
    assert not process_alive(int((tmp_path / "shell.pid").read_text()))


def test_sigterm_to_module_kills_group_and_raises(tmp_path):
    module = _module_running_tree(tmp_path)
    grandchild = int(wait_for_file(str(tmp_path / "grandchild.pid")))
    module.send_signal(signal.SIGTERM)
    out = module.communicate(timeout=20)[0]
    assert module.returncode == 7
    assert "interrupted: interrupted by SIGTERM" in out
    assert not process_alive(grandchild)
