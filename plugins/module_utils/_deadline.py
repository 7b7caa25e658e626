# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run a command under a hard deadline and leave no process of it behind.

A vLLM build is a tree of processes (pip -> setup.py -> cmake -> ninja -> nvcc ...). Killing only the
direct child leaves compilers running and holding the host. So every command starts in its own
session (= its own process group), and on expiry the whole group gets SIGTERM, a grace period, then
SIGKILL, and we check that no member survives.

The module itself can die too: Ansible's `async` timeout SIGKILLs the module's process group, which
does not include the build's (new session) group and cannot be caught. A small watchdog process in
yet another session holds the read end of a pipe whose write end only this module holds; when the
module dies the pipe hits EOF and the watchdog kills the build group. SIGTERM/SIGINT/SIGHUP sent to
the module are caught while a command runs, kill the group, and surface as CommandInterrupted.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import open_private_append, redact_url, utc_now

__all__ = ["CommandInterrupted", "CommandResult", "Deadline", "group_members", "run", "tail"]

DEFAULT_GRACE = 10.0
DEFAULT_PROGRESS_EVERY = 3.0
_POLL = 0.2
_TAIL_BYTES = 64 * 1024

# Runs in its own session: blocks on stdin until the module says "done" or dies (EOF).
_WATCHDOG = r"""
import os, signal, sys, time
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(sig, signal.SIG_IGN)
try:
    said = os.read(0, 1)
except OSError:
    said = b""
if said:
    sys.exit(0)
def alive():
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False
if alive():
    os.killpg(pgid, signal.SIGTERM)
    end = time.monotonic() + grace
    while alive() and time.monotonic() < end:
        time.sleep(0.2)
    if alive():
        os.killpg(pgid, signal.SIGKILL)
"""


class CommandInterrupted(Exception):
    """The module received a termination signal while a command ran; the command's group was killed."""

    def __init__(self, signum: int, result: CommandResult) -> None:
        self.signum = signum
        self.result = result
        super().__init__(
            f"interrupted by {signal.Signals(signum).name} while running {result.command}; its process group was killed"
        )


class Deadline:
    """One wall-clock budget shared by several commands (fetch + build + install)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return max(0.0, self.seconds - self.elapsed())

    def expired(self) -> bool:
        return self.remaining() <= 0.0


class CommandResult:
    """What happened to one command. `rc` is negative (-signal) when it was killed."""

    def __init__(
        self,
        argv: Sequence[str],
        rc: Optional[int],
        elapsed: float,
        timed_out: bool,
        stdout: str = "",
        stderr: str = "",
        log_tail: str = "",
        survivors: Optional[List[int]] = None,
    ) -> None:
        self.argv = list(argv)
        self.rc = rc
        self.elapsed = elapsed
        self.timed_out = timed_out
        self.stdout = stdout
        self.stderr = stderr
        self.log_tail = log_tail
        self.survivors = survivors or []

    @property
    def command(self) -> str:
        return display_command(self.argv)

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out

    def as_dict(self) -> Dict[str, Any]:
        return {
            "command": self.command,
            "rc": self.rc,
            "elapsed": round(self.elapsed, 3),
            "timed_out": self.timed_out,
            "log_tail": self.log_tail,
            "survivors": self.survivors,
        }


def display_command(argv: Sequence[str]) -> str:
    """The command as a shell line, with credentials in URLs removed (it goes to logs and messages)."""
    return " ".join(shlex.quote(redact_url(str(arg))) for arg in argv)


def tail(path: str, lines: int = 20) -> str:
    """The last `lines` lines of a (possibly huge) text file, credentials redacted."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - _TAIL_BYTES))
            data = handle.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    return redact_url("\n".join(text.splitlines()[-lines:]))


def group_members(pgid: int) -> List[int]:
    """Live (non-zombie) processes whose process group is `pgid`.

    Reads /proc so that zombies waiting for a reaper are not counted as survivors; without /proc,
    falls back to signal 0 (which cannot tell zombies apart).
    """
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except OSError:
            return []
        return [pgid]
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode("ascii", "replace")
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signum)


def _kill_group(proc: subprocess.Popen, grace: float) -> List[int]:
    """SIGTERM the group, wait up to `grace`, SIGKILL what is left; return the pids that survived."""
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end:
        proc.poll()  # reap our direct child so it does not linger as a zombie member
        if not group_members(pgid):
            return []
        time.sleep(_POLL)
    _signal_group(pgid, signal.SIGKILL)
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        proc.poll()
        survivors = group_members(pgid)
        if not survivors:
            return []
        time.sleep(_POLL)
    return group_members(pgid)


class _Interrupt(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_CAUGHT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _raise_interrupt(signum: int, frame: Any) -> None:
    # Once we are killing the group, a second signal must not abort the cleanup half-way.
    for other in _CAUGHT_SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    raise _Interrupt(signum)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Turn SIGTERM/SIGINT/SIGHUP into an exception while a command runs (main thread only)."""
    previous = {}
    try:
        for signum in _CAUGHT_SIGNALS:
            try:
                previous[signum] = signal.signal(signum, _raise_interrupt)
            except ValueError:  # not the main thread: the watchdog still covers us
                break
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _start_watchdog(pgid: int, grace: float) -> Tuple[subprocess.Popen, int]:
    read_end, write_end = os.pipe()
    try:
        watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(pgid), str(grace)],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return watchdog, write_end


def _stop_watchdog(watchdog: subprocess.Popen, write_end: int) -> None:
    with contextlib.suppress(OSError):
        os.write(write_end, b"d")
    os.close(write_end)
    try:
        watchdog.wait(timeout=10)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


def run(
    argv: Sequence[str],
    timeout: float,
    log_path: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    grace: float = DEFAULT_GRACE,
    tail_lines: int = 20,
    watchdog: bool = True,
    progress: Optional[Callable[[], None]] = None,
    progress_every: float = DEFAULT_PROGRESS_EVERY,
) -> CommandResult:
    """Run `argv` for at most `timeout` seconds; kill its whole process group on expiry.

    With `log_path`, stdout and stderr are appended to that file (after a header line naming the
    command) and `log_tail` holds its last `tail_lines` lines; otherwise they are captured into
    `stdout`/`stderr` and `log_tail` is the tail of stderr. `watchdog` guards against the module being
    SIGKILLed mid-command (worth its ~30 ms for long commands only). `progress` is called about every
    `progress_every` seconds while the command runs (e.g. to publish the log's last line); its OSError or
    ValueError never disturbs the command. Raises CommandInterrupted if the module gets
    SIGTERM/SIGINT/SIGHUP; OSError if the program cannot be started.
    """
    if timeout <= 0:
        return CommandResult(argv, None, 0.0, True, log_tail=tail(log_path, tail_lines) if log_path else "")
    with contextlib.ExitStack() as stack:
        out: IO[bytes]
        err: Optional[IO[bytes]] = None
        if log_path:
            out = stack.enter_context(open_private_append(log_path))  # 0600: a tool may echo a credential
            out.write(f"\n[{utc_now()}] $ {display_command(argv)}\n".encode())
            out.flush()
        else:
            out = stack.enter_context(tempfile.TemporaryFile())
            err = stack.enter_context(tempfile.TemporaryFile())
        started = time.monotonic()
        rc, timed_out, interrupted, survivors = _supervise(
            argv, timeout, out, err, env, cwd, grace, watchdog, progress, progress_every
        )
        elapsed = time.monotonic() - started
        if log_path:
            if timed_out:
                note = f"TIMEOUT after {elapsed:.1f}s (limit {timeout:.0f}s): process group killed"
            elif interrupted:
                note = f"INTERRUPTED by {signal.Signals(interrupted).name}: process group killed"
            else:
                note = f"exit {rc} after {elapsed:.1f}s"
            if survivors:
                note += f"; still alive after SIGKILL: {survivors}"
            out.write(f"[{utc_now()}] {note}\n".encode())
            out.flush()
            result = CommandResult(
                argv, rc, elapsed, timed_out, log_tail=tail(log_path, tail_lines), survivors=survivors
            )
        else:
            stdout, stderr = _read_all(out), _read_all(err)
            stderr_tail = redact_url("\n".join(stderr.splitlines()[-tail_lines:]))
            result = CommandResult(argv, rc, elapsed, timed_out, stdout, stderr, stderr_tail, survivors)
    if interrupted:
        raise CommandInterrupted(interrupted, result)
    return result


def _read_all(handle: Optional[IO[bytes]]) -> str:
    if handle is None:
        return ""
    handle.seek(0)
    return handle.read().decode("utf-8", "replace")


def _supervise(
    argv: Sequence[str],
    timeout: float,
    out: IO[bytes],
    err: Optional[IO[bytes]],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    grace: float,
    watchdog: bool,
    progress: Optional[Callable[[], None]] = None,
    progress_every: float = DEFAULT_PROGRESS_EVERY,
) -> Tuple[Optional[int], bool, int, List[int]]:
    """Start, wait, kill on expiry or on a signal. Returns (rc, timed_out, signal number, survivors)."""
    timed_out = False
    interrupted = 0
    survivors: List[int] = []
    proc: Optional[subprocess.Popen] = None
    guard = None
    with _signals_interrupt():
        try:
            started = time.monotonic()
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err if err is not None else subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
            if watchdog:
                guard = _start_watchdog(proc.pid, grace)
            reported = started
            while True:
                now = time.monotonic()
                left = timeout - (now - started)
                if left <= 0:
                    timed_out = True
                    survivors = _kill_group(proc, grace)
                    break
                if progress is not None and now - reported >= progress_every:
                    reported = now
                    with contextlib.suppress(OSError, ValueError):
                        progress()
                try:
                    proc.wait(timeout=min(left, 1.0, progress_every))
                    break
                except subprocess.TimeoutExpired:
                    continue
        except _Interrupt as exc:
            interrupted = exc.signum
            if proc is not None:
                survivors = _kill_group(proc, min(grace, 5.0))
        finally:
            if guard is not None:
                _stop_watchdog(*guard)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
    return (proc.returncode if proc is not None else None), timed_out, interrupted, survivors
