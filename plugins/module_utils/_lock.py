# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One build or release swap at a time per host: an flock on `<root>/.lock`.

flock is released by the kernel when the holder dies, so a killed play never leaves a stale lock.
The holder writes its pid into the file so that a waiter that gives up can say who holds it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from typing import Iterator, Optional

__all__ = ["LockTimeout", "host_lock"]

LOCK_NAME = ".lock"
_POLL_SECONDS = 0.2


class LockTimeout(Exception):
    """The host lock stayed held by another process for longer than the timeout."""

    def __init__(self, path: str, timeout: float, holder_pid: Optional[int]) -> None:
        self.path = path
        self.timeout = timeout
        self.holder_pid = holder_pid
        holder = f"process {holder_pid}" if holder_pid else "another process"
        super().__init__(
            f"{path} is held by {holder} (a build or release swap is running on this host); "
            f"gave up after {timeout:g}s. Wait for it to finish or raise the lock timeout"
        )


def _read_holder(fd: int) -> Optional[int]:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@contextlib.contextmanager
def host_lock(root: str, timeout: float = 600.0, shared: bool = False) -> Iterator[str]:
    """Hold the host lock on `<root>/.lock` for the duration of the block.

    Exclusive by default; `shared=True` is for readers (status, the deploy's look): it waits for a writer
    but opens the existing file read-only and writes nothing, so it works on a full disk or a read-only
    root. Waits up to `timeout` seconds (0 = try once), then raises LockTimeout naming the holder's pid.
    Yields the lock file path. An exclusive lock creates `root` if missing.
    """
    path = os.path.join(root, LOCK_NAME)
    if shared:
        fd = os.open(path, os.O_RDONLY)
    else:
        os.makedirs(root, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            if time.monotonic() >= deadline:
                raise LockTimeout(path, timeout, _read_holder(fd))
            time.sleep(_POLL_SECONDS)
        if not shared:
            # The pid only helps a waiter that gives up say who holds the lock: a full disk must not fail
            # the action for it.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        try:
            yield path
        finally:
            # Leave the file (deleting it would race with a waiter that already opened it).
            if not shared:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
