# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Would a deploy change this host? The read-only look the deploy playbook takes of every host first.

One call answers everything a no-op re-run needs: the release the build options name (vllm_build's own
lookup: ls-remote, interpreter probe, manifest path), which release serves and whether it passed its gate,
whether the files the roles would write are byte-for-byte and mode-for-mode what is on disk, whether the
unit is enabled and the server answers /health, and whether a host file the last deploy recorded (the drafter
config.json its preflight passed) changed since. Nothing is written, no lock is taken for long.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import subprocess
import urllib.error
import urllib.request
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_lookup import lookup
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import BuildOptions
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import (
    NoRedirectHandler,
    read_json,
    sha256_file,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import (
    ReleaseError,
    current_path,
    release_path,
    run_action,
)

__all__ = ["LOCK_TIMEOUT", "DriftError", "FileExpectation", "detect_drift"]

HEALTH_TIMEOUT = 5.0
# Seconds to wait for the host lock: a look never waits behind a build for long.
LOCK_TIMEOUT = 10.0


class DriftError(Exception):
    """The look itself could not be taken (bad input); the message names the fix."""


class FileExpectation:
    """A file a role would write: its content's sha256 and, where given, mode, owner and group.

    `input_sha256` / `input_record`: the file also counts as unchanged when the record (JSON written by the
    role on the host: {"input_sha256", "sha256"}) says its current content was written from that input.
    """

    def __init__(
        self,
        path: str,
        sha256: str,
        mode: Optional[str] = None,
        owner: Optional[str] = None,
        group: Optional[str] = None,
        input_sha256: Optional[str] = None,
        input_record: Optional[str] = None,
    ) -> None:
        if not os.path.isabs(path):
            raise DriftError(f"files: path {path!r} is not absolute")
        for name, digest in (("sha256", sha256), ("input_sha256", input_sha256)):
            if digest is not None and (len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest.lower())):
                raise DriftError(f"files: {name} of {path} is not 64 hex digits: {digest!r}")
        if mode is not None and (not mode.isdigit() or any(c > "7" for c in mode)):
            raise DriftError(f"files: mode of {path} must be octal digits such as '0644', got {mode!r}")
        if (input_sha256 is None) != (input_record is None):
            raise DriftError(f"files: {path} needs both input_sha256 and input_record, or neither")
        if input_record is not None and not os.path.isabs(input_record):
            raise DriftError(f"files: input_record {input_record!r} of {path} is not absolute")
        self.path = path
        self.sha256 = sha256.lower()
        self.mode = int(mode, 8) if mode is not None else None
        self.owner = owner
        self.group = group
        self.input_sha256 = input_sha256.lower() if input_sha256 else None
        self.input_record = input_record

    @classmethod
    def from_dict(cls, item: Mapping[str, Any]) -> FileExpectation:
        mode = item.get("mode")
        optional = {key: None if item.get(key) is None else str(item[key]) for key in ("input_sha256", "input_record")}
        return cls(
            str(item["path"]),
            str(item["sha256"]),
            None if mode is None else str(mode),
            item.get("owner"),
            item.get("group"),
            **optional,
        )

    def _written_from_the_same_input(self, content_sha256: str) -> bool:
        """Whether the host's render record says this content was written from the input the controller rendered.

        The controller cannot render what the role writes when the role transforms its input on the host (the
        preflight's normalised speculative config); the role records which input gave which content.
        """
        if not self.input_sha256 or not self.input_record:
            return False
        try:
            record = read_json(self.input_record, None)
        except (OSError, ValueError):
            return False
        return (
            isinstance(record, dict)
            and record.get("input_sha256") == self.input_sha256
            and record.get("sha256") == content_sha256
        )

    def difference(self) -> Optional[str]:
        """Why the file on disk is not this one, or None when it is."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return f"{self.path} does not exist"
        except OSError as exc:
            return f"{self.path} cannot be read: {exc.strerror}"
        if not stat.S_ISREG(info.st_mode):
            return f"{self.path} is not a regular file"
        try:
            content = sha256_file(self.path)
        except OSError as exc:
            return f"{self.path} cannot be read: {exc.strerror}"
        if content != self.sha256 and not self._written_from_the_same_input(content):
            return f"{self.path} has other content"
        if self.mode is not None and stat.S_IMODE(info.st_mode) != self.mode:
            return f"{self.path} has mode {stat.S_IMODE(info.st_mode):04o}, not {self.mode:04o}"
        if self.owner is not None and _user_name(info.st_uid) != self.owner:
            return f"{self.path} is owned by {_user_name(info.st_uid)}, not {self.owner}"
        if self.group is not None and _group_name(info.st_gid) != self.group:
            return f"{self.path} has group {_group_name(info.st_gid)}, not {self.group}"
        return None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def unit_difference(unit: str, enabled: bool = True) -> Optional[str]:
    """Why `unit` is not (enabled=False: is) enabled, or None when `systemctl is-enabled` agrees."""
    try:
        proc = subprocess.run(
            ["systemctl", "is-enabled", unit], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemctl is-enabled {unit} did not answer: {exc}"
    state = (proc.stdout.strip() or proc.stderr.strip() or f"rc={proc.returncode}").splitlines()[0]
    if (state == "enabled") == enabled:
        return None
    return f"{unit} is {state}, not {'enabled' if enabled else 'disabled'}"


def running_release(unit: str, root: str) -> Optional[Tuple[int, str]]:
    """The release `unit`'s main process was started from, as the process itself shows it: its command line
    names <root>/releases/<name>/venv/bin/vllm (ExecStart resolves `current` once, at the start). None when
    the unit runs no process or its command line names no release of `root` (the health check says the rest).
    """
    try:
        proc = subprocess.run(
            ["systemctl", "show", "-p", "MainPID", "--value", unit],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    pid_text = proc.stdout.strip()
    if proc.returncode != 0 or not pid_text.isdigit() or int(pid_text) == 0:
        return None
    try:
        with open(f"/proc/{int(pid_text)}/cmdline", "rb") as handle:
            argv = [os.fsdecode(arg) for arg in handle.read().split(b"\0")]
    except OSError:
        return None
    releases = release_path(os.path.realpath(root), "")  # `<root>/releases/`, with its separator
    launcher = os.sep + os.path.join("venv", "bin", "vllm")
    for arg in argv:
        if arg.startswith(releases) and arg.endswith(launcher):
            return int(pid_text), arg[len(releases) :].split(os.sep, 1)[0]
    return None


def health(url: str, timeout: float = HEALTH_TIMEOUT) -> Optional[str]:
    """Why `url` does not answer 200, or None when it does."""
    try:
        # Stdlib opener, as the gate's core: the cores import no Ansible (unit tests drive them without it).
        # No redirect followed: a /health that sends the look elsewhere is not this server's health.
        with urllib.request.build_opener(NoRedirectHandler()).open(url, timeout=timeout) as response:
            code = response.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{url} does not answer: {reason}"
    return None if code == 200 else f"{url} answered {code}"


def recorded_differences(record_path: str) -> List[str]:
    """Why files recorded in `record_path` ({"files": {path: sha256}}, written by a deploy) changed since.

    No record is no difference: nothing was recorded yet (the next full deploy writes it).
    """
    try:
        record = read_json(record_path, None)
    except (OSError, ValueError) as exc:
        return [f"{record_path} cannot be read: {exc}"]
    if record is None:
        return []
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict):
        return [f"{record_path} does not hold a files map; the next deploy rewrites it"]
    reasons = []
    for path, digest in sorted(files.items()):
        try:
            now = sha256_file(path)
        except FileNotFoundError:
            reasons.append(f"{path} (recorded in {record_path}) is gone")
            continue
        except OSError as exc:
            reasons.append(f"{path} (recorded in {record_path}) cannot be read: {exc.strerror}")
            continue
        if now != digest:
            reasons.append(f"{path} changed since it was recorded in {record_path}")
    return reasons


def detect_drift(
    options: BuildOptions,
    files: Sequence[FileExpectation] = (),
    health_url: Optional[str] = None,
    unit: Optional[str] = None,
    unit_enabled: bool = True,
    recorded_inputs: Sequence[str] = (),
    good_statuses: Sequence[str] = ("good",),
    lock_timeout: float = LOCK_TIMEOUT,
) -> Dict[str, Any]:
    """The drift result: `unchanged` is True only when a deploy with these options would change nothing.

    Raises BuildError when the ref cannot be resolved (what the deploy itself would fail on) and DriftError
    on bad input. Every other difference is a reason, not an error.
    """
    reasons: List[str] = []
    found = lookup(options)
    wanted, exists = found.release_name, found.built
    try:
        state = run_action(options.root, "status", check_mode=True, lock_timeout=lock_timeout)
    except ReleaseError as exc:  # a build or swap holds the lock: the deploy must wait for it, not skip
        state = {"current": None, "releases": [], "warnings": []}
        reasons.append(f"the release state cannot be read now: {exc}")
    current = state["current"]
    statuses = {entry["name"]: entry["status"] for entry in state["releases"]}
    current_status = statuses.get(current) if current else None
    if not exists:
        reasons.append(f"{wanted or 'the release of ' + options.label} is not built here: {found.msg}")
    elif current != wanted:
        reasons.append(f"{wanted} is built but {current or 'no release'} serves")
    elif current_status not in good_statuses:
        reasons.append(f"{current} serves but is {current_status}, not {' or '.join(good_statuses)}")
    # What `current` names is not what serves until the next start (issue 28 case 12): ask the process.
    running = running_release(unit, options.root) if unit and current else None
    if running and running[1] != current:
        reasons.append(
            f"the server ({unit}, pid {running[0]}) runs {running[1]}, not {current} that "
            f"{current_path(options.root)} names: it was started before the last swap"
        )
    file_results = []
    for expected in files:
        difference = expected.difference()
        file_results.append({"path": expected.path, "changed": difference is not None, "reason": difference})
        if difference:
            reasons.append(difference)
    for record_path in recorded_inputs:
        reasons.extend(recorded_differences(record_path))
    unit_reason = unit_difference(unit, unit_enabled) if unit else None
    if unit_reason:
        reasons.append(unit_reason)
    health_reason = health(health_url) if health_url else None
    if health_reason:
        reasons.append(health_reason)
    unchanged = not reasons
    return {
        "changed": False,
        "unchanged": unchanged,
        "reasons": reasons,
        "msg": "nothing would change" if unchanged else "a deploy would change this host: " + "; ".join(reasons),
        "commit": found.commit,
        "release_name": wanted,
        "release_exists": exists,
        "current": current,
        "current_status": current_status,
        "files": file_results,
        "unit_as_expected": bool(unit) and unit_reason is None,
        "healthy": bool(health_url) and health_reason is None,
        "warnings": list(state.get("warnings", [])),
    }
