# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run a command under a hard deadline and leave no process of it behind.

A vLLM build is a tree of processes (pip -> setup.py -> cmake -> ninja -> nvcc ...). Killing only the
direct child leaves compilers running and holding the host. So every command starts in its own
session (= its own process group), and on expiry the whole group gets SIGTERM, a grace period, then
SIGKILL, and we check that no member survives. A member that left the group (`setsid()`, a daemon)
is still found: every command's environment carries a mark of its own (MARK_ENV=<random>) that its
descendants inherit, and a kill reaches every live process whose /proc/<pid>/environ holds it, with all
their descendants (by ppid) besides.

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
import uuid
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import open_private_append, redact_url, utc_now

__all__ = ["MARK_ENV", "CommandInterrupted", "CommandResult", "Deadline", "group_members", "marked", "run", "tail"]

DEFAULT_GRACE = 10.0
DEFAULT_PROGRESS_EVERY = 3.0
_POLL = 0.2
_TAIL_BYTES = 64 * 1024
# The variable that marks every process of one command, those that left its process group included.
MARK_ENV = "VLLM_OPS_DFLASH_RUN"

# Runs in its own session: blocks on stdin until the module says "done" or dies (EOF). Standalone (no
# imports of this collection), so it repeats the search of `marked` for the processes that left the group.
_WATCHDOG = r"""
import os, signal, sys, time
pgid, grace, mark = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3].encode()
for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(sig, signal.SIG_IGN)
try:
    said = os.read(0, 1)
except OSError:
    said = b""
if said:
    sys.exit(0)
def escaped():
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as handle:
                if mark in handle.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            pass
    return found
def signal_all(signum):
    try:
        os.killpg(pgid, signum)
    except OSError:
        pass
    for pid in escaped():
        try:
            os.kill(pid, signum)
        except OSError:
            pass
def alive():
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return bool(escaped())
if alive():
    signal_all(signal.SIGTERM)
    end = time.monotonic() + grace
    while alive() and time.monotonic() < end:
        time.sleep(0.2)
    signal_all(signal.SIGKILL)
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
    return [pid for pid, fields in _proc_stats() if len(fields) >= 3 and int(fields[2]) == pgid]


def _proc_stats() -> List[Tuple[int, List[str]]]:
    """(pid, the fields after comm: state ppid pgrp ...) of every live (non-zombie) process; empty without /proc."""
    found: List[Tuple[int, List[str]]] = []
    with contextlib.suppress(OSError):
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
            if len(fields) >= 2 and fields[0] != "Z":
                found.append((int(entry), fields))
    return found


def _live_processes() -> Dict[int, int]:
    """pid -> ppid of every live (non-zombie) process, from /proc; empty without /proc."""
    return {pid: int(fields[1]) for pid, fields in _proc_stats()}


def marked(mark: str) -> List[int]:
    """Live processes of the command marked `mark`, those that left its process group (`setsid()`) included:
    the ones whose environment holds MARK_ENV=`mark`, and all their descendants (a child may clear its env)."""
    live = _live_processes()
    needle = f"{MARK_ENV}={mark}".encode()
    found = set()
    for pid in live:
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.add(pid)
        except OSError:  # gone, or another user's (we can neither read nor signal it)
            continue
    children: Dict[int, List[int]] = {}
    for pid, ppid in live.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child != os.getpid():
                found.add(child)
                todo.append(child)
    return sorted(found)


def _members(pgid: int, mark: Optional[str]) -> List[int]:
    """The command's live processes: its process group, and those that left it (found by `mark`)."""
    members = set(group_members(pgid))
    if mark:
        members.update(marked(mark))
    return sorted(members)


def _signal_group(pgid: int, signum: int, mark: Optional[str] = None) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signum)
    for pid in marked(mark) if mark else []:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def _kill_group(proc: subprocess.Popen, grace: float, mark: Optional[str] = None) -> List[int]:
    """SIGTERM the group (and the processes that left it), wait up to `grace`, SIGKILL what is left; return
    the pids that survived."""
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM, mark)
    end = time.monotonic() + grace
    while time.monotonic() < end:
        proc.poll()  # reap our direct child so it does not linger as a zombie member
        if not _members(pgid, mark):
            return []
        time.sleep(_POLL)
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        _signal_group(pgid, signal.SIGKILL, mark)  # again each round: a process may fork while it is killed
        proc.poll()
        if not _members(pgid, mark):
            return []
        time.sleep(_POLL)
    return _members(pgid, mark)


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


def _start_watchdog(pgid: int, grace: float, mark: str) -> Tuple[subprocess.Popen, int]:
    read_end, write_end = os.pipe()
    try:
        watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(pgid), str(grace), f"{MARK_ENV}={mark}"],
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
    mark = uuid.uuid4().hex  # this command's own: its processes that leave the group keep it in their env
    child_env = dict(env if env is not None else os.environ, **{MARK_ENV: mark})
    with _signals_interrupt():
        try:
            started = time.monotonic()
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err if err is not None else subprocess.STDOUT,
                env=child_env,
                cwd=cwd,
                start_new_session=True,
            )
            if watchdog:
                guard = _start_watchdog(proc.pid, grace, mark)
            reported = started
            while True:
                now = time.monotonic()
                left = timeout - (now - started)
                if left <= 0:
                    timed_out = True
                    survivors = _kill_group(proc, grace, mark)
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
                survivors = _kill_group(proc, min(grace, 5.0), mark)
        finally:
            if guard is not None:
                _stop_watchdog(*guard)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
    return (proc.returncode if proc is not None else None), timed_out, interrupted, survivors
