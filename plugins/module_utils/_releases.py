# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The release state machine over `<root>/releases/`, the `current` link and `state.json`.

`state.json` is the history (activations, gate verdicts); the `current` symlink is what is served.
When they disagree (a crash between the link swap and the state write) the link wins and a warning
says so. A complete release directory that state.json does not know (just built) is adopted with
status `built`; adoption is a view, persisted only with the next change.

Beside a verdict, `keep_files` copies what the release served with (config, env, unit) to its last good
copies in the same run: the gate's bookkeeping after a pass is one remote step, not one per file.

Standard library only: this runs on the target host's system Python (3.8+).

One file over 600 lines on purpose: every action is one _Session (read, plan, apply under the host lock);
its layout helpers are the ones the other cores take release paths from.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
import stat
import uuid
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import read_json, utc_now, write_json_atomic
from ansible_collections.vllm_ops.dflash.plugins.module_utils._lock import LOCK_NAME, LockTimeout, host_lock

__all__ = [
    "ACTIONS",
    "CURRENT_LINK",
    "KEEP_ACTIONS",
    "LOCK_TIMEOUT",
    "MANIFEST_NAME",
    "RELEASES_DIR",
    "RELEASE_NAME",
    "STATE_NAME",
    "STATUSES",
    "WHEELS_DIR",
    "ReleaseError",
    "current_path",
    "load_state",
    "lock_for",
    "manifest_path",
    "needed_releases",
    "release_path",
    "remove_hidden_first",
    "run_action",
    "run_action_unlocked",
]

STATE_SCHEMA = 1
STATE_NAME = "state.json"
CURRENT_LINK = "current"
RELEASES_DIR = "releases"
WHEELS_DIR = "wheels"
MANIFEST_NAME = "manifest.json"
# Seconds to wait for the host lock (the vllm_release and vllm_release_info default).
LOCK_TIMEOUT = 600.0
ACTIONS = ("activate", "rollback", "prune", "mark_good", "mark_failed", "keep", "status")
# The actions that take keep_files: a passed verdict, or keeping alone (a gate that did not run).
KEEP_ACTIONS = ("mark_good", "keep")
STATUSES = ("built", "active", "good", "failed")
_SWITCHING = ("activate", "rollback")
_PRUNING_PREFIX = ".prune-"
_HEX_PREFIX = re.compile(r"^[0-9a-f]{4,40}$")
# The names this collection makes under releases/ and wheels/ (_build.release_name): `<sha12>-<inputs8>` of a
# git commit, `<package>-<version>-<inputs8>` of a release from an index, and the hidden name a prune renames
# one to. Anything else there (lost+found of a mount, an operator's directory) is not ours: never adopted,
# activated or deleted.
_NAME = r"(?:[0-9a-f]{12}|[a-z0-9](?:[a-z0-9-]*[a-z0-9])?-[0-9][0-9a-z.+]*)-[0-9a-f]{8}"
RELEASE_NAME = re.compile(f"^{_NAME}$")
_PRUNING_NAME = re.compile(rf"^\.prune-{_NAME}\.[0-9a-f]{{32}}$")
_MODE = re.compile(r"^0?[0-7]{3}$")


class ReleaseError(Exception):
    """A release action that cannot be carried out; the message names the problem and the fix."""


class _DiskRelease(NamedTuple):
    name: str
    path: str
    complete: bool  # manifest.json exists: the builder writes it last
    manifest: Optional[Dict[str, Any]]
    manifest_error: Optional[str]


class _Keep(NamedTuple):
    """One file to keep as its last good copy, and what the copy is now."""

    path: str
    last_good: str
    mode: int
    content: Optional[bytes]  # None: an optional source that does not exist (nothing is kept)
    before: str  # the copy before the action, as the diff shows it
    changed: bool


def _plan_keep(item: Dict[str, Any]) -> _Keep:
    """Read one keep_files item: its source, and whether its copy already has that content, mode and owner."""
    path, last_good = str(item.get("path") or ""), str(item.get("last_good") or "")
    mode_text = str(item.get("mode") or "")
    if not path or not last_good:
        raise ReleaseError(f"keep_files item {item!r} needs path and last_good (the file and its last good copy)")
    if not _MODE.match(mode_text):
        raise ReleaseError(f"keep_files mode {mode_text!r} of {path} is not an octal mode such as '0644' or '0600'")
    mode = int(mode_text, 8)
    try:
        with open(last_good, "rb") as handle:
            old: Optional[bytes] = handle.read()
        info = os.stat(last_good)
        old_mode = stat.S_IMODE(info.st_mode)
        owned = (info.st_uid, info.st_gid, old_mode) == (os.geteuid(), os.getegid(), mode)
    except FileNotFoundError:
        old, old_mode, owned = None, 0, False
    except OSError as exc:
        raise ReleaseError(f"cannot read {last_good}: {exc.strerror}; check its permissions") from exc
    try:
        with open(path, "rb") as handle:
            content: Optional[bytes] = handle.read()
    except FileNotFoundError as exc:
        if not item.get("optional"):
            raise ReleaseError(
                f"cannot keep {path} as the last good copy: it does not exist; deploy it first (dflash_config, "
                "vllm_service) or mark the item optional"
            ) from exc
        content = None
    except OSError as exc:
        raise ReleaseError(f"cannot read {path} to keep it: {exc.strerror}; check its permissions") from exc
    # The diff names files, never their content: the env file holds secrets.
    before = "absent" if old is None else f"{'same as' if old == content else 'differs from'} {path} ({old_mode:04o})"
    changed = content is not None and not (old == content and owned)
    return _Keep(path, last_good, mode, content, before, changed)


def _render_kept(kept: Sequence[_Keep], after: bool) -> str:
    if not kept:
        return ""
    lines = ["kept:"]
    for keep in kept:
        now = f"same as {keep.path} ({keep.mode:04o})" if after and keep.content is not None else keep.before
        lines.append(f"  {keep.last_good}: {now}")
    return "\n".join(lines) + "\n"


def _write_copy(keep: _Keep) -> None:
    """Replace keep.last_good with keep.content atomically, with its mode from the start (never wider)."""
    if keep.content is None:  # every source is read before anything is written (keep()); never None here
        raise RuntimeError(f"nothing read for {keep.last_good}")
    directory = os.path.dirname(os.path.abspath(keep.last_good))
    temporary = os.path.join(directory, f".{os.path.basename(keep.last_good)}.{uuid.uuid4().hex}.tmp")
    try:
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
            os.fchmod(handle.fileno(), keep.mode)  # the exact mode, whatever the umask
            handle.write(keep.content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, keep.last_good)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise ReleaseError(
            f"cannot keep {keep.path} as {keep.last_good}: {exc.strerror}; check that {directory} exists and is "
            "writable by this user"
        ) from exc


class _Layout:
    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.releases = os.path.join(self.root, RELEASES_DIR)
        self.wheels = os.path.join(self.root, WHEELS_DIR)
        self.state = os.path.join(self.root, STATE_NAME)
        self.current = os.path.join(self.root, CURRENT_LINK)

    def release_path(self, name: str) -> str:
        return os.path.join(self.releases, name)


def _empty_state() -> Dict[str, Any]:
    return {"schema": STATE_SCHEMA, "current": None, "previous": None, "releases": {}, "history": []}


def load_state(root: str) -> Dict[str, Any]:
    """The validated state.json of `root`; an empty state when the file does not exist."""
    path = _Layout(root).state
    try:
        state = read_json(path, None)
    except ValueError as exc:
        raise ReleaseError(
            f"{exc}. state.json holds the release history: restore it from a backup, or move it aside "
            "to start a new history (existing releases are then adopted with status 'built')"
        ) from exc
    except OSError as exc:
        raise ReleaseError(f"cannot read {path}: {exc.strerror}; check its permissions") from exc
    if state is None:
        return _empty_state()
    problem = None
    if not isinstance(state, dict):
        problem = "the top level is not an object"
    elif state.get("schema") != STATE_SCHEMA:
        problem = f"schema {state.get('schema')!r} is not {STATE_SCHEMA} (written by another version of the collection)"
    elif not isinstance(state.get("releases", {}), dict) or not isinstance(state.get("history", []), list):
        problem = "'releases' must be an object and 'history' a list"
    elif not all(isinstance(entry, dict) for entry in state.get("releases", {}).values()):
        problem = "every entry of 'releases' must be an object"
    else:
        problem = _type_problem(state)
    if problem:
        raise ReleaseError(f"{path} is not a schema {STATE_SCHEMA} state file: {problem}; fix it or move it aside")
    merged = _empty_state()
    merged.update(state)
    merged["history"] = [item for item in merged["history"] if isinstance(item, dict)]
    return merged


_TEXT_FIELDS = ("commit", "created_at", "activated_at", "reason")
_HISTORY_FIELDS = ("at", "action", "release", "from", "reason")


def _type_problem(state: Dict[str, Any]) -> Optional[str]:
    """The first value of the wrong type in a state.json, checked before any action uses it: an action
    must not swap `current` and then fail on the state it meant to write."""
    for key in ("current", "previous"):
        if not isinstance(state.get(key), (str, type(None))):
            return f"{key!r} is {state[key]!r}, not a release name or null"
    for name, entry in state.get("releases", {}).items():
        status = entry.get("status")
        if status is not None and status not in STATUSES:
            return f"release {name!r} has status {status!r}, not one of {', '.join(STATUSES)}"
        for field in _TEXT_FIELDS:
            if not isinstance(entry.get(field), (str, type(None))):
                return f"release {name!r} has {field} {entry[field]!r}, not a string or null"
        seq = entry.get("seq")
        if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 1):
            return f"release {name!r} has seq {seq!r}, not a positive integer or null"
        if not isinstance(entry.get("gate"), (dict, type(None))):
            return f"release {name!r} has gate {entry['gate']!r}, not an object or null"
    for index, item in enumerate(state.get("history", [])):
        if not isinstance(item, dict):
            continue  # dropped on load, as before
        for field in _HISTORY_FIELDS:
            if not isinstance(item.get(field), (str, type(None))):
                return f"history[{index}] has {field} {item[field]!r}, not a string or null"
    return None


def _scan(layout: _Layout, foreign: Optional[List[str]] = None) -> Dict[str, _DiskRelease]:
    """Release directories under releases/ (hidden names are work in progress of this module).

    Names the collection does not make are left out (and listed in `foreign`).
    """
    found: Dict[str, _DiskRelease] = {}
    try:
        names = sorted(os.listdir(layout.releases))
    except FileNotFoundError:
        return found
    for name in names:
        path = layout.release_path(name)
        if name.startswith("."):
            continue
        if not RELEASE_NAME.match(name):
            if foreign is not None:
                foreign.append(name)
            continue
        if os.path.islink(path) or not os.path.isdir(path):
            continue
        manifest_path = os.path.join(path, MANIFEST_NAME)
        complete = os.path.isfile(manifest_path)
        manifest, error = None, None
        if complete:
            try:
                manifest = read_json(manifest_path, None)
            except (ValueError, OSError) as exc:
                error = str(exc)
            if manifest is not None and not isinstance(manifest, dict):
                manifest, error = None, f"{manifest_path} is not a JSON object"
        found[name] = _DiskRelease(name, path, complete, manifest, error)
    return found


def _read_current_link(layout: _Layout) -> Optional[str]:
    """Name of the release `current` points to, None when there is no link."""
    if not os.path.lexists(layout.current):
        return None
    if not os.path.islink(layout.current):
        raise ReleaseError(
            f"{layout.current} exists but is not a symlink; move it aside so that it can point to a release"
        )
    target = os.readlink(layout.current)
    absolute = os.path.normpath(os.path.join(layout.root, target))
    parent = os.path.dirname(absolute)
    if parent != layout.releases and os.path.realpath(parent) != os.path.realpath(layout.releases):
        raise ReleaseError(
            f"{layout.current} points to {target}, which is not a directory directly under {layout.releases}; "
            "remove the link and activate a release with action=activate"
        )
    return os.path.basename(absolute)


class _Session:
    """One action over an in-memory copy of the host state; `execute` applies the plan to disk."""

    def __init__(self, root: str) -> None:
        self.layout = _Layout(root)
        self.warnings: List[str] = []
        self.foreign: List[str] = []
        self.disk = _scan(self.layout, self.foreign)
        self.state = load_state(root)
        self.adopted: List[str] = []  # releases first seen by this session (given their `seq`)
        self._adopt()
        self._reconcile_current()
        self.before = copy.deepcopy(self.state)
        self.link_target: Optional[str] = None  # release name to point `current` at
        self.remove: List[str] = []  # release names whose directory and wheels go away
        self.affected: Optional[str] = None
        self.pruned: List[str] = []
        self.forgotten: List[str] = []
        self.kept: List[_Keep] = []
        self.record_order = False  # persist the adopted releases' `seq` although nothing else changes

    # ---- view -------------------------------------------------------------------------------
    def _adopt(self) -> None:
        entries = self.state["releases"]
        adopted = []
        for name, disk in self.disk.items():
            if not disk.complete:
                continue
            manifest = disk.manifest or {}
            built_at = manifest.get("built_at")
            entry = entries.get(name)
            # Same name, different build time: the directory was rebuilt, earlier verdicts do not apply.
            rebuilt = entry is not None and built_at and entry.get("created_at") and entry["created_at"] != built_at
            if entry is None or rebuilt:
                entries[name] = {"commit": manifest.get("commit"), "status": "built", "created_at": built_at}
                adopted.append(name)
            elif not entry.get("commit"):
                entry["commit"] = manifest.get("commit")
        # The order releases came in, recorded once (`seq`): prune goes by it, never by a clock that can jump
        # back. Releases first seen together are ordered by their build times among themselves.
        adopted.sort(key=lambda name: (str(entries[name].get("created_at") or ""), name))
        after = max((entry.get("seq") or 0 for entry in entries.values()), default=0)
        for offset, name in enumerate(adopted, start=1):
            entries[name]["seq"] = after + offset
        self.adopted = adopted

    def _reconcile_current(self) -> None:
        linked = _read_current_link(self.layout)
        recorded = self.state.get("current")
        if linked != recorded:
            if recorded is not None:
                self.warnings.append(
                    f"state.json says the current release is {recorded} but {self.layout.current} "
                    f"{'points to ' + linked if linked else 'does not exist'}; the link is what runs, so it wins"
                )
            self.state["current"] = linked
        if linked is not None and not self.exists(linked):
            self.warnings.append(
                f"{self.layout.current} points to {linked}, which is not a complete release; "
                "activate an existing release with action=activate or action=rollback"
            )
        if linked is not None and linked not in self.state["releases"]:
            self.state["releases"][linked] = {"commit": None, "status": "active", "created_at": None}

    def exists(self, name: Optional[str]) -> bool:
        disk = self.disk.get(name or "")
        return disk is not None and disk.complete

    def ordered_names(self) -> List[str]:
        """Known releases, newest first: by the order state.json recorded them in (`seq`), never by a clock.
        Entries from before `seq` (older state files) come after every recorded one, by creation time."""
        entries = self.state["releases"]

        def recency(name: str) -> Any:
            entry = entries[name]
            return (entry.get("seq") or 0, entry.get("created_at") or "", entry.get("activated_at") or "", name)

        return sorted(entries, key=recency, reverse=True)

    def release_list(self) -> List[Dict[str, Any]]:
        listing = []
        for name in self.ordered_names():
            entry = self.state["releases"][name]
            listing.append(
                {
                    "name": name,
                    "commit": entry.get("commit"),
                    "status": entry.get("status"),
                    "path": self.layout.release_path(name) if self.exists(name) else None,
                    "created_at": entry.get("created_at"),
                    "activated_at": entry.get("activated_at"),
                    "reason": entry.get("reason"),
                    "gate": entry.get("gate"),
                }
            )
        return listing

    # ---- lookup -----------------------------------------------------------------------------
    def resolve(self, spec: str, require_complete: bool) -> str:
        """Release name for a directory path, a name, or a unique prefix of a commit or name."""
        spec = spec.strip()
        if not spec:
            raise ReleaseError("release is empty; give a release directory, name, or commit prefix")
        # Every complete directory is in state["releases"] (adopted); incomplete ones only count where
        # a complete release is required, so that the error can say the build did not finish.
        names = set(self.disk) if require_complete else set(self.state["releases"])
        if "/" in spec:
            real = os.path.realpath(spec)
            if os.path.dirname(real) != os.path.realpath(self.layout.releases):
                raise ReleaseError(
                    f"{spec} is not a release directory directly under {self.layout.releases}; "
                    "give a directory there, a release name, or a commit prefix"
                )
            name = os.path.basename(real)
            if name not in names:
                raise ReleaseError(f"{spec} is not a known release; build it first with vllm_build")
        elif spec in names:
            name = spec
        else:
            prefix = spec.lower()
            if not _HEX_PREFIX.match(prefix):
                raise ReleaseError(
                    f"no release named {spec!r} under {self.layout.releases}; "
                    f"known releases: {', '.join(sorted(names)) or 'none'}"
                )
            matches = sorted(
                name
                for name in names
                if name.startswith(prefix)
                or str(self.state["releases"].get(name, {}).get("commit") or "").lower().startswith(prefix)
            )
            if not matches:
                raise ReleaseError(
                    f"no release matches commit prefix {spec!r}; known releases: {', '.join(sorted(names)) or 'none'}"
                )
            if len(matches) > 1:
                raise ReleaseError(
                    f"commit prefix {spec!r} is ambiguous ({', '.join(matches)}); give more hex digits or the name"
                )
            name = matches[0]
        if require_complete:
            self.require_complete(name)
        return name

    def require_complete(self, name: str) -> None:
        disk = self.disk.get(name)
        if disk is None:
            raise ReleaseError(f"{self.layout.release_path(name)} does not exist; build it first with vllm_build")
        if not disk.complete:
            raise ReleaseError(
                f"{disk.path} has no {MANIFEST_NAME}: its build did not finish; rebuild it with vllm_build"
            )
        if disk.manifest_error:
            raise ReleaseError(f"{disk.manifest_error}; rebuild the release with vllm_build")

    # ---- transitions ------------------------------------------------------------------------
    def record(self, action: str, release: str, **extra: Any) -> None:
        item = {"at": utc_now(), "action": action, "release": release}
        item.update({key: value for key, value in extra.items() if value is not None})
        self.state["history"].append(item)

    def switch_to(self, name: str, action: str, keep_good: bool, reason: Optional[str]) -> None:
        self.affected = name
        old = self.state["current"]
        if name == old:
            return
        if old is not None:
            self.state["previous"] = old
        self.state["current"] = name
        entry = self.state["releases"][name]
        if not (keep_good and entry.get("status") == "good"):
            entry["status"] = "active"
        entry["activated_at"] = utc_now()
        self.link_target = name
        self.record(action, name, reason=reason or None, **{"from": old})

    def activate(self, spec: Optional[str], reason: Optional[str]) -> None:
        if not spec:
            raise ReleaseError("action=activate needs release (a release directory, name, or commit prefix)")
        self.switch_to(self.resolve(spec, require_complete=True), "activate", False, reason)

    def rollback(self, spec: Optional[str], reason: Optional[str]) -> None:
        target = self.resolve(spec, require_complete=True) if spec else self.rollback_target()
        # A release that passed its gate before stays `good`: going back to it is the point.
        self.switch_to(target, "rollback", True, reason)

    def rollback_target(self) -> str:
        current = self.state["current"]
        for item in reversed(self.state["history"]):
            name = item.get("release")
            if item.get("action") not in _SWITCHING or name == current or not self.exists(name):
                continue
            if self.state["releases"].get(name, {}).get("status") == "failed":
                continue
            if self.disk[name].manifest_error:
                continue
            return str(name)
        raise ReleaseError(
            f"nothing to roll back to: no release activated before {current or '(none)'} is still present under "
            f"{self.layout.releases} and not marked failed; activate one explicitly with action=activate release=<name>"
        )

    def last_good(self) -> Optional[str]:
        """The release that served last with a passed gate and is still whole: what a failed or unfinished
        rollout goes back to. A release that is current but not `good` never is (its rollout did not end)."""

        def usable(name: Any) -> bool:
            entry = self.state["releases"].get(name) or {}
            return entry.get("status") == "good" and self.exists(name) and not self.disk[name].manifest_error

        for item in reversed(self.state["history"]):
            if item.get("action") in _SWITCHING and usable(item.get("release")):
                return str(item["release"])
        return next((name for name in self.ordered_names() if usable(name)), None)

    def mark(self, spec: Optional[str], status: str, reason: Optional[str], details: Optional[Dict[str, Any]]) -> None:
        name = self.resolve(spec, require_complete=False) if spec else self.state["current"]
        if name is None:
            raise ReleaseError(f"action=mark_{status} needs release: there is no current release to mark")
        self.affected = name
        entry = self.state["releases"].setdefault(name, {"commit": None, "status": "built", "created_at": None})
        updated = dict(entry, status=status)
        updated.pop("reason", None)
        if reason:
            updated["reason"] = reason
        if details is not None:
            updated["gate"] = details
        if updated != entry:
            self.state["releases"][name] = updated
            self.record(f"mark_{status}", name, reason=reason or None)

    def keep(self, files: Sequence[Dict[str, Any]]) -> None:
        """Plan the last good copies; every source is read (a missing one fails) before anything is written."""
        self.kept = [_plan_keep(item) for item in files]

    def linked_dirs(self) -> List[str]:
        """releases/ or wheels/ when it is a symlink: a prune there would delete whatever it points to."""
        return [path for path in (self.layout.releases, self.layout.wheels) if os.path.islink(path)]

    def prune(self, keep: int, protect: Sequence[str], drop: Sequence[str] = ()) -> None:
        if keep < 0:
            raise ReleaseError(f"keep_releases must be 0 or more, got {keep}")
        linked = self.linked_dirs()
        if linked:
            self.warnings.append(
                f"nothing pruned: {' and '.join(linked)} {'is a symlink' if len(linked) == 1 else 'are symlinks'} "
                f"(to {', '.join(os.readlink(path) for path in linked)}); prune deletes only in directories of "
                f"its own. Fix: make them real directories under {self.layout.root} (or point root at the real "
                "location)"
            )
            return
        # A prune records the order of the releases it sees (the build's own prune: right after the build), so
        # that a later prune goes by the order they came in.
        self.record_order = bool(self.adopted)
        if self.foreign:
            self.warnings.append(
                f"left alone under {self.layout.releases}: {', '.join(self.foreign)} (not a release name of this "
                "collection, <sha12>-<inputs8>); move them elsewhere if they are yours"
            )
        protected = {self.state["current"], self.state["previous"], *protect}
        # The release a rollback would go to survives any prune (a run of failed bumps must not push the
        # last good release out), and failed releases use up no place of `keep`.
        with contextlib.suppress(ReleaseError):
            protected.add(self.rollback_target())
        existing = [name for name in self.ordered_names() if self.exists(name)]
        failed = [name for name in existing if self.state["releases"].get(name, {}).get("status") == "failed"]
        complete = [name for name in existing if name not in failed]
        # Under the host lock no build is running, so a directory without a manifest is the debris of
        # an interrupted one.
        debris = sorted(name for name, disk in self.disk.items() if not disk.complete)
        # `drop`: releases a disk budget frees (_disk_budget), beyond what `keep` removes.
        extra = [name for name in drop if name in self.disk and name not in complete[keep:] + failed + debris]
        for name in complete[keep:] + failed + debris + extra:
            if name in protected:
                continue
            self.remove.append(name)
            self.pruned.append(name)
            if self.state["releases"].pop(name, None) is not None:
                self.record("prune", name)
        for name in list(self.state["releases"]):
            if name not in protected and name not in self.disk:
                self.forgotten.append(name)
                self.remove.append(name)  # its wheels, if any, are of no use either
                del self.state["releases"][name]

    # ---- effects ----------------------------------------------------------------------------
    @property
    def changed(self) -> bool:
        return (
            self.state != self.before
            or bool(self.remove)
            or self.record_order
            or any(keep.changed for keep in self.kept)
        )

    def execute(self) -> None:
        if self.state != self.before or self.remove or self.record_order:
            self._apply_releases()
        # After the verdict: a copy that fails leaves the earlier last good copies and a release marked
        # good, which the deploy's rescue marks failed and rolls back from (never new copies of an unmarked one).
        for keep in self.kept:
            if keep.changed:
                _write_copy(keep)

    def _apply_releases(self) -> None:
        # The state first, then the link: a state that cannot be written (a full disk) moves nothing, and a
        # link that cannot be moved puts the old state back. `current` never names a release that state.json
        # does not record as current (the rescue reads state.json to know what to go back to).
        serving = self.before["current"]
        try:
            write_json_atomic(self.layout.state, self.state)
        except OSError as exc:
            raise ReleaseError(
                f"cannot write {self.layout.state}: {exc.strerror or exc}. Nothing was changed: "
                f"{self.layout.current} still points to {serving or '(nothing)'}. Fix: free space on the file "
                f"system of {self.layout.root} (or make it writable), then re-run"
            ) from exc
        if self.link_target is not None:
            try:
                self._swap_current(self.link_target)
            except OSError as exc:
                undone = self._write_back_before()
                raise ReleaseError(
                    f"cannot point {self.layout.current} at {self.link_target}: {exc.strerror or exc}. "
                    f"It still points to {serving or '(nothing)'}; "
                    + (
                        "state.json says so again"
                        if undone
                        else f"state.json could not be put back and names {self.link_target} (the link wins)"
                    )
                    + f". Fix: free space on the file system of {self.layout.root} (or make it writable), then re-run"
                ) from exc
        for name in self.remove:
            if not RELEASE_NAME.match(name):  # a name from state.json only: nothing of ours on disk to delete
                continue
            remove_hidden_first(os.path.join(self.layout.releases, name))
            remove_hidden_first(os.path.join(self.layout.wheels, name))
        self._remove_leftovers()

    def _write_back_before(self) -> bool:
        """Put state.json back as it was before the action; whether that worked."""
        try:
            write_json_atomic(self.layout.state, self.before)
        except OSError:
            return False
        return True

    def _swap_current(self, name: str) -> None:
        # rename(2) over the old link is atomic: readers see the old release or the new one, never none.
        temporary = os.path.join(self.layout.root, f".{CURRENT_LINK}.{uuid.uuid4().hex}.tmp")
        os.symlink(os.path.join(RELEASES_DIR, name), temporary)
        try:
            os.replace(temporary, self.layout.current)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def _remove_leftovers(self) -> None:
        """Hidden trees of an earlier interrupted prune (safe: we hold the lock)."""
        for parent in (self.layout.releases, self.layout.wheels):
            if os.path.islink(parent):
                continue
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(parent):
                    if _PRUNING_NAME.match(name) and not os.path.islink(os.path.join(parent, name)):
                        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)

    # ---- reporting --------------------------------------------------------------------------
    def diff(self) -> Dict[str, str]:
        return {
            "before": _render(self.before) + _render_kept(self.kept, after=False),
            "after": _render(self.state) + _render_kept(self.kept, after=True),
        }

    def result(self) -> Dict[str, Any]:
        return {
            "changed": self.changed,
            "current": self.state["current"],
            "previous": self.state["previous"],
            "last_good": self.last_good(),
            "release": self.affected,
            "releases": self.release_list(),
            "history": self.state["history"],
            "pruned": self.pruned,
            "forgotten": self.forgotten,
            "incomplete": sorted(n for n, disk in self.disk.items() if not disk.complete and n not in self.remove),
            "kept": [
                {"path": keep.path, "last_good": keep.last_good, "changed": keep.changed}
                for keep in self.kept
                if keep.content is not None
            ],
            "diff": self.diff(),
            "warnings": self.warnings,
        }


def needed_releases(root: str) -> Tuple[List[str], Optional[str]]:
    """(the releases no prune for space removes, the newest complete release): what serves (`current`), the last
    good release, the one a rollback goes to and `previous` (every prune keeps it); the newest is what a build's
    need is estimated from."""
    session = _Session(root)
    needed = {session.state["current"], session.state["previous"], session.last_good()}
    with contextlib.suppress(ReleaseError):
        needed.add(session.rollback_target())
    newest = next((name for name in session.ordered_names() if session.exists(name)), None)
    return sorted(name for name in needed if name), newest


def release_path(root: str, name: str) -> str:
    """`<root>/releases/<name>`: where the release `name` lives (the other cores take it from here)."""
    return os.path.join(root, RELEASES_DIR, name)


def manifest_path(release: str) -> str:
    """The manifest of the release directory `release` (written last: a release without it is incomplete)."""
    return os.path.join(release, MANIFEST_NAME)


def current_path(root: str) -> str:
    """The `current` link of `root`: what serves."""
    return os.path.join(root, CURRENT_LINK)


def remove_hidden_first(path: str) -> None:
    """Rename `path` to a hidden name (atomic), then delete it: an interrupted delete never leaves a
    release that looks whole, and the next prune (or vllm_release run) removes the hidden leftover."""
    if not os.path.lexists(path):
        return
    hidden = os.path.join(os.path.dirname(path), f"{_PRUNING_PREFIX}{os.path.basename(path)}.{uuid.uuid4().hex}")
    os.rename(path, hidden)
    shutil.rmtree(hidden, ignore_errors=True)


def _render(state: Dict[str, Any]) -> str:
    lines = [f"current: {state.get('current') or '-'}", f"previous: {state.get('previous') or '-'}", "releases:"]
    for name in sorted(state["releases"]):
        entry = state["releases"][name]
        reason = f" ({entry['reason']})" if entry.get("reason") else ""
        lines.append(f"  {name}: {entry.get('status')}{reason}")
    return "\n".join(lines) + "\n"


def run_action_unlocked(
    root: str,
    action: str,
    release: Optional[str] = None,
    keep_releases: int = 3,
    reason: Optional[str] = None,
    details: Optional[Dict[str, Any]] = None,
    check_mode: bool = False,
    protect: Sequence[str] = (),
    keep_files: Optional[Sequence[Dict[str, Any]]] = None,
    drop: Sequence[str] = (),
) -> Dict[str, Any]:
    """Run `action` on `root` WITHOUT taking the host lock (for callers that already hold it, e.g. a
    build that prunes, protecting the release it just made). In check mode nothing is written; the
    result predicts the change. `protect` names releases that prune never removes. `keep_files`
    (items `path`, `last_good`, `mode`, `optional`; with mark_good or keep) are copied to their last
    good copies after the state is written. `drop` names releases a prune removes besides those beyond
    `keep_releases` (what a disk budget frees), never a protected one."""
    if action not in ACTIONS:
        raise ReleaseError(f"unknown action {action!r}; use one of {', '.join(ACTIONS)}")
    if keep_files and action not in KEEP_ACTIONS:
        raise ReleaseError(
            f"keep_files goes with action={' or action='.join(KEEP_ACTIONS)}, not action={action}: the last good "
            "copies are what a release that passed served with"
        )
    if action == "keep" and not keep_files:
        raise ReleaseError("action=keep needs keep_files (the files to keep as their last good copies)")
    session = _Session(root)
    if action == "activate":
        session.activate(release, reason)
    elif action == "rollback":
        session.rollback(release, reason)
    elif action == "prune":
        session.prune(keep_releases, protect, drop)
    elif action == "mark_good":
        session.mark(release, "good", reason, details)
    elif action == "mark_failed":
        session.mark(release, "failed", reason, details)
    elif release:  # status, keep
        session.affected = session.resolve(release, require_complete=False)
    if keep_files:
        session.keep(keep_files)
    if session.changed and not check_mode:
        session.execute()
    return session.result()


@contextlib.contextmanager
def lock_for(root: str, read_only: bool, timeout: float) -> Iterator[None]:
    # A read-only run must not create anything, so it only waits for a lock that already exists.
    if read_only and not os.path.exists(os.path.join(root, LOCK_NAME)):
        yield
        return
    try:
        with host_lock(root, timeout, shared=read_only):
            yield
    except LockTimeout as exc:
        raise ReleaseError(str(exc)) from exc


def run_action(
    root: str,
    action: str,
    release: Optional[str] = None,
    keep_releases: int = 3,
    reason: Optional[str] = None,
    details: Optional[Dict[str, Any]] = None,
    check_mode: bool = False,
    lock_timeout: float = LOCK_TIMEOUT,
    protect: Sequence[str] = (),
    keep_files: Optional[Sequence[Dict[str, Any]]] = None,
) -> Dict[str, Any]:
    """`run_action_unlocked` under the host lock (`<root>/.lock`)."""
    read_only = check_mode or action == "status" or not os.path.isdir(root)
    with lock_for(root, read_only, lock_timeout):
        return run_action_unlocked(
            root, action, release, keep_releases, reason, details, check_mode, protect, keep_files
        )
