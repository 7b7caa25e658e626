# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`<root>/build-status.json`: what the running build is doing, for a person or the role's poll loop."""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Any, Dict, Optional, Sequence

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import MASK
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import redact_url, utc_now, write_json_atomic
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import tail

__all__ = ["STATUS_NAME", "StatusFile", "process_start"]

STATUS_NAME = "build-status.json"


def process_start(pid: int) -> Optional[int]:
    """The start time of process `pid` (clock ticks after boot, /proc/<pid>/stat field 22); None without
    /proc. With the pid it names one process for good: a pid the kernel hands out again starts later."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode("ascii", "replace")
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; starttime is the 20th field after it.
        return int(stat[stat.rfind(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class StatusFile:
    """`<root>/build-status.json`: what the build is doing now, for a person or the role's poll loop.

    Rewritten atomically at each stage and every few seconds while a command runs (the log's last
    line). `run_id` lets a poller tell this run's status from an earlier run's. Best effort: a status
    that cannot be written never fails the build. The file is world-readable: `secrets` (and credentials
    in URLs) never reach it.
    """

    def __init__(
        self, root: str, run_id: Optional[str], ref: str, enabled: bool = True, secrets: Sequence[str] = ()
    ) -> None:
        self.path = os.path.join(root, STATUS_NAME)
        self.enabled = enabled  # check mode writes nothing
        self.secrets = sorted((s for s in secrets if s), key=len, reverse=True)
        self._started = time.monotonic()
        self._stage_started = self._started
        self.stage_seconds: Dict[str, float] = {}
        self.data: Dict[str, Any] = {
            "run_id": run_id,
            "pid": os.getpid(),
            # (pid, pid_start) is the build: the role's poll never takes a reused pid for it.
            "pid_start": process_start(os.getpid()),
            "ref": ref,
            "stage": None,
            "started_at": utc_now(),
            "release_name": None,
            "commit": None,
            "log_path": None,
            "last_line": "",
        }

    def stage(self, name: str, last_line: Optional[str] = None, **fields: Any) -> None:
        now = time.monotonic()
        previous = self.data["stage"]
        if previous is not None:
            self.stage_seconds[previous] = round(self.stage_seconds.get(previous, 0.0) + now - self._stage_started, 3)
        self._stage_started = now
        self.data["stage"] = name
        self.data.update(fields)
        if last_line is not None:
            self.data["last_line"] = last_line
        self.write()

    def tick(self) -> None:
        """Publish the last line of the build log (called by the command runner while it waits)."""
        log = self.data.get("log_path")
        if log:
            lines = [line for line in re.split(r"[\r\n]+", tail(log, 5)) if line.strip()]
            if lines:
                self.data["last_line"] = lines[-1].strip()[:300]
        self.write()

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        self.write()

    def elapsed(self) -> float:
        return round(time.monotonic() - self._started, 3)

    def durations(self) -> Dict[str, float]:
        """Seconds per stage so far, the running stage included."""
        durations = dict(self.stage_seconds)
        stage = self.data["stage"]
        if stage not in (None, "done", "failed"):
            durations[stage] = round(durations.get(stage, 0.0) + time.monotonic() - self._stage_started, 3)
        return durations

    def write(self) -> None:
        if not self.enabled:
            return
        self.data["elapsed"] = self.elapsed()
        self.data["updated_at"] = utc_now()
        self.data["stage_seconds"] = self.stage_seconds
        self.data["last_line"] = self.scrub(str(self.data.get("last_line") or ""))
        with contextlib.suppress(OSError):
            write_json_atomic(self.path, self.data)

    def scrub(self, text: str) -> str:
        """`text` without credentials in URLs and without any of `secrets`."""
        text = redact_url(text)
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return text
