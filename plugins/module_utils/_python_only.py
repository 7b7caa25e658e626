# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The python-only bump: a precompiled release of a commit made from an earlier release of the same inputs,
without running vLLM's setup.py, when the diff between the two commits changes Python files only.

The earlier release's venv is hard-linked to the new path (its scripts, activate files and pyvenv.cfg
relocated: rewritten, never written through a link), the package's changed files written from git, its
`_version.py`, dist-info (renamed, METADATA's version), RECORD and direct_url.json rewritten, and the
third-party dependencies made what a fresh install gets now (`settle`, _dependency_plan: the index may have
moved since the earlier release). The fleet's wheel is the earlier wheel's members copied raw, the changed
ones replaced. What setup.py would produce
otherwise is matched exactly: the version by setuptools-scm's default scheme (git describe, guess-next-dev,
node-and-date) plus the earlier build's own suffix (vLLM's `+precompiled`), checked first to reproduce the
earlier release's version; a changed file must be in the earlier wheel as its commit's git blob (a file
that setup.py takes from the base wheel is not). Every RECORD hash of the package is verified before the
release is complete. Any doubt is a refusal (`Refused`, with the reason): the caller builds the normal way.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import zipfile
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_lookup import compiled_from_its_sources
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_paths import Paths, read_manifest, relocate_venv
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import sha256_file
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import git_env
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import compiled_changes
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import RELEASES_DIR, release_path
from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_overlay import copy_raw

if TYPE_CHECKING:  # what _dependency_plan.DependencyPlan is to this module (it imports this one: no import back)
    from typing import Protocol

    class DependencyPlan(Protocol):
        def settle(self, venv: str, package: str, version: str) -> Dict[str, Any]: ...

        def close(self) -> None: ...


__all__ = ["Refused", "build_from_earlier", "site_packages"]

# Paths outside the package that no wheel member comes from (README.md is METADATA's long description).
NOT_PACKAGED = ("docs/", "tests/", "examples/", "benchmarks/", ".github/", ".buildkite/")
MAX_CANDIDATES = 3
_TAG = re.compile(r"^v?(\d+(?:\.\d+)*)$")
_DESCRIBE = re.compile(r"^(?P<tag>.+)-(?P<distance>\d+)-g(?P<node>[0-9a-f]+)$")


class Refused(Exception):
    """The python-only bump cannot be proven equal to the normal build: the reason says why."""


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _file_record_hash(path: str) -> str:
    return "sha256=" + base64.urlsafe_b64encode(bytes.fromhex(sha256_file(path))).rstrip(b"=").decode()


def _record_text(rows: List[List[str]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows(rows)
    return out.getvalue().encode("utf-8")


def _git_bytes(mirror: str, *args: str) -> bytes:
    """A read of the local mirror (bytes: a blob is installed as git holds it)."""
    try:
        done = subprocess.run(
            ["git", "--git-dir", mirror, *args], capture_output=True, env=git_env(), timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Refused(f"git {args[0]} cannot run on the mirror ({exc})") from exc
    if done.returncode != 0:
        raise Refused(f"git {' '.join(args[:2])} failed on the mirror: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def _git(mirror: str, *args: str) -> str:
    return _git_bytes(mirror, *args).decode("utf-8", errors="surrogateescape").strip()


def _blob(mirror: str, commit: str, path: str) -> bytes:
    return _git_bytes(mirror, "cat-file", "blob", f"{commit}:{path}")


class ScmVersion:
    """setuptools-scm's version of a commit with its default schemes (guess-next-dev, node-and-date)."""

    def __init__(self, mirror: str, commit: str, abbrev: int) -> None:
        try:
            described = _git(mirror, "describe", "--tags", "--long", f"--abbrev={abbrev}", "--match", "*[0-9]*", commit)
        except Refused:  # no tag reachable: setuptools-scm counts every commit from tag 0.0
            count, short = (
                _git(mirror, "rev-list", "--count", commit),
                _git(mirror, "rev-parse", f"--short={abbrev}", commit),
            )
            described = f"0.0-{count}-g{short}"
        found = _DESCRIBE.match(described)
        tag = _TAG.match(found.group("tag")) if found else None
        if not found or not tag:
            raise Refused(f"git describe gives {described!r}: not a plain release tag, another version scheme")
        distance, self.node = int(found.group("distance")), "g" + found.group("node")
        parts = [int(p) for p in tag.group(1).split(".")]
        self.tuple: Tuple[Any, ...]
        if distance == 0:
            self.version, self.tuple = tag.group(1), tuple(parts)
        else:
            parts[-1] += 1
            base = ".".join(str(p) for p in parts)
            self.version = f"{base}.dev{distance}+{self.node}"
            self.tuple = (*parts, f"dev{distance}", self.node)


def _suffix(installed: str, scm: str) -> str:
    """What the earlier build added to setuptools-scm's version (vLLM: `+precompiled`, `.precompiled`)."""
    if not installed.startswith(scm):
        raise Refused(f"the earlier release's version {installed} is not setuptools-scm's {scm} + a suffix")
    rest = installed[len(scm) :]
    if rest and rest[0] not in "+.":
        raise Refused(f"the earlier release's version {installed} has an unknown suffix {rest!r}")
    return rest[1:]


def _with_suffix(scm: str, suffix: str) -> str:
    return f"{scm}{'.' if '+' in scm else '+'}{suffix}" if suffix else scm


class Earlier:
    """An earlier release that a python-only bump can start from."""

    def __init__(self, root: str, name: str, manifest: Mapping[str, Any]) -> None:
        self.name = name
        self.commit = str(manifest.get("commit") or "")
        self.venv = os.path.join(release_path(root, name), "venv")
        self.wheel = str((manifest.get("wheel") or {}).get("path") or "")
        self.wheel_sha = str((manifest.get("wheel") or {}).get("sha256") or "")
        self.built_at = str(manifest.get("built_at") or "")


def candidates(root: str, digest: str, commit: str) -> List[Earlier]:
    """Complete releases with the same inputs (python, installer, env, the precompiled decision: the digest),
    another commit, precompiled by `auto` (their libraries checked against their sources), newest first."""
    found = []
    directory = os.path.join(root, RELEASES_DIR)
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if name.startswith("."):
            continue
        manifest = read_manifest(release_path(root, name))
        if not manifest or manifest.get("inputs_hash") != digest or manifest.get("commit") == commit:
            continue
        if not manifest.get("precompiled") or not compiled_from_its_sources(manifest):
            continue
        if manifest.get("source") != "build" or not (manifest.get("wheel") or {}).get("path"):
            continue
        found.append(Earlier(root, name, manifest))
    return sorted(found, key=lambda e: e.built_at, reverse=True)[:MAX_CANDIDATES]


class Diff:
    """The package's changes between two commits, refused unless the wheel takes them from git alone."""

    def __init__(self, mirror: str, old: str, new: str, package: str, members: Mapping[str, zipfile.ZipInfo]) -> None:
        out = _git(mirror, "diff", "--no-renames", "--name-status", "-z", old, new)
        fields = [f for f in out.split("\0") if f]
        changes = list(zip(fields[0::2], fields[1::2]))
        self.paths = [path for _status, path in changes]
        compiled = compiled_changes(self.paths)
        if compiled:
            raise Refused(f"{len(compiled)} changed files under vLLM's compiled or dependency paths ({compiled[0]})")
        self.written: Dict[str, bytes] = {}
        self.removed: List[str] = []
        for status, path in changes:
            if not path.startswith(package + "/"):
                if not path.startswith(NOT_PACKAGED):
                    raise Refused(f"{path} changed: outside {package}/ and not known to stay out of the wheel")
                continue
            if path == f"{package}/_version.py":
                raise Refused(f"{path} is tracked by git: setup.py writes it")
            if status in ("M", "D", "T"):
                if path not in members:
                    raise Refused(f"{path} changed but is not in the earlier wheel (setup.py leaves it out)")
                if status == "T":
                    raise Refused(f"{path} changed its type")
            if status == "A":
                init = os.path.join(os.path.dirname(path), "__init__.py")
                if not path.endswith(".py") or init not in members:
                    raise Refused(
                        f"{path} is new and not a module of a package the wheel has: setup.py may leave it out"
                    )
            if status not in ("M", "D", "A"):
                raise Refused(f"{path}: git status {status}")
            if status == "D":
                self.removed.append(path)
            else:
                self.written[path] = _blob(mirror, new, path)
        # What the earlier wheel must hold for these files, if setup.py took them from git.
        self.old_blobs = {p: _blob(mirror, old, p) for s, p in changes if s in "MD" and p.startswith(package + "/")}


def _dist_info(names: List[str], package: str, version: str) -> str:
    wanted = f"{package}-{version}.dist-info"
    if not any(n.startswith(wanted + "/") for n in names):
        raise Refused(f"the earlier wheel has no {wanted}/")
    return wanted


def _metadata(data: bytes, old: str, new: str) -> bytes:
    line = f"Version: {old}\n".encode()
    if data.count(line) != 1:
        raise Refused("the earlier METADATA does not name its version once")
    return data.replace(line, f"Version: {new}\n".encode(), 1)


def _version_file(data: bytes, old: ScmVersion, new: ScmVersion) -> bytes:
    """setuptools-scm's _version.py of the earlier commit with the new commit's values in place of its own."""
    text = data.decode("utf-8")
    for before, after in ((old.version, new.version), (repr(old.tuple), repr(new.tuple)), (old.node, new.node)):
        quoted = repr(before) if isinstance(before, str) and not before.startswith("(") else before
        replaced = repr(after) if isinstance(after, str) and not after.startswith("(") else after
        if text.count(quoted) < 1:
            raise Refused(f"the earlier _version.py does not hold {quoted}: another setuptools-scm template")
        text = text.replace(quoted, replaced)
    return text.encode("utf-8")


def _write_wheel(
    earlier: zipfile.ZipFile, dest: str, renames: Mapping[str, str], written: Mapping[str, bytes], removed: List[str]
) -> Dict[str, List[str]]:
    """The new wheel: the earlier members copied raw (renamed), `written` ones new, RECORD last. Returns the
    RECORD rows by name."""
    record_name = next(n for n in renames.values() if n.endswith(".dist-info/RECORD"))
    old_rows = {}
    old_record = next(n for n in renames if n.endswith(".dist-info/RECORD"))
    for row in csv.reader(io.StringIO(earlier.read(old_record).decode("utf-8"))):
        if row:
            old_rows[renames.get(row[0], row[0])] = row
    rows: Dict[str, List[str]] = {}
    with zipfile.ZipFile(dest + ".part", "w", zipfile.ZIP_DEFLATED) as out:
        for info in earlier.infolist():
            name = renames.get(info.filename, info.filename)
            if name == record_name or info.filename in removed:
                continue
            if name in written:
                entry = zipfile.ZipInfo(name, info.date_time)
                entry.external_attr = info.external_attr
                entry.compress_type = zipfile.ZIP_DEFLATED
                out.writestr(entry, written[name])
                rows[name] = [name, _record_hash(written[name]), str(len(written[name]))]
            else:
                copy_raw(earlier, info, out, name)
                if name not in old_rows:
                    raise Refused(f"the earlier wheel's RECORD does not list {info.filename}")
                rows[name] = [name, *old_rows[name][1:3]]
        for name, data in written.items():
            if name not in rows:
                entry = zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0))
                entry.external_attr = 0o644 << 16
                entry.compress_type = zipfile.ZIP_DEFLATED
                out.writestr(entry, data)
                rows[name] = [name, _record_hash(data), str(len(data))]
        rows[record_name] = [record_name, "", ""]
        out.writestr(zipfile.ZipInfo(record_name, (2020, 1, 1, 0, 0, 0)), _record_text(list(rows.values())))
    os.replace(dest + ".part", dest)
    return rows


def site_packages(venv: str) -> str:
    lib = os.path.join(venv, "lib")
    found = [os.path.join(lib, d, "site-packages") for d in os.listdir(lib) if d.startswith("python")]
    found = [d for d in found if os.path.isdir(d)]
    if len(found) != 1:
        raise Refused(f"{len(found)} site-packages in {venv}, not one")
    return found[0]


def _link_tree(source: str, dest: str, skip: Callable[[str], bool]) -> int:
    """`dest` as a tree of hard links to `source` (symlinks as symlinks, no __pycache__: what running left)."""
    count = 0
    for top, dirs, files in os.walk(source):
        relative = os.path.relpath(top, source)
        dirs[:] = [d for d in dirs if d != "__pycache__" and not skip(os.path.normpath(os.path.join(relative, d)))]
        target_dir = os.path.join(dest, relative) if relative != "." else dest
        os.makedirs(target_dir, exist_ok=True)
        for name in files + [d for d in os.listdir(top) if os.path.islink(os.path.join(top, d)) and d not in files]:
            rel = os.path.normpath(os.path.join(relative, name))
            if skip(rel):
                continue
            path, target = os.path.join(top, name), os.path.join(target_dir, name)
            if os.path.islink(path):
                os.symlink(os.readlink(path), target)
            else:
                try:
                    os.link(path, target)
                except OSError:  # another file system: a copy, same bytes
                    shutil.copy2(path, target)
            count += 1
    return count


def _replace(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write `path` anew (a hard-linked file is replaced, never written through)."""
    with open(path + ".part", "wb") as handle:
        handle.write(data)
    os.chmod(path + ".part", mode)
    os.replace(path + ".part", path)


def verify_record(site: str, dist_info: str) -> int:
    """Every file the installed RECORD of `dist_info` lists, against its sha256 and size. Raises Refused."""
    with open(os.path.join(site, dist_info, "RECORD"), encoding="utf-8") as handle:
        rows = [row for row in csv.reader(handle) if row]
    checked = 0
    for row in rows:
        if len(row) < 3 or not row[1]:
            continue
        path = os.path.normpath(os.path.join(site, row[0]))
        if not os.path.isfile(path) or os.path.getsize(path) != int(row[2]) or _file_record_hash(path) != row[1]:
            raise Refused(f"{path} does not match its RECORD line (a hard-linked file changed since it was installed)")
        checked += 1
    return checked


# plan_for(wheel): the dry run of a fresh install of the new wheel, started as soon as the wheel is written
# (_dependency_plan.DependencyPlan); its settle() gives the bump's venv what that install gets.
Planner = Callable[[str], "DependencyPlan"]


def build_from_earlier(
    root: str,
    digest: str,
    commit: str,
    mirror: str,
    package: str,
    paths: Paths,
    note: Callable[[str], None],
    plan_for: Planner,
) -> Dict[str, Any]:
    """Make the release of `paths` (venv + the wheel in wheels/<name>/) from an earlier release, or raise
    Refused with every candidate's reason (nothing of the attempt left behind). Returns the python_only
    result: used, reason, files_changed, seconds, from (the earlier release), dependencies (what moved since
    it: `plan_for`), wheel, wheel_sha256."""
    started = time.monotonic()
    found = candidates(root, digest, commit)
    if not found:
        raise Refused("no earlier precompiled release of the same inputs on this host")
    reasons = []
    for earlier in found:
        try:
            done = _from(earlier, commit, mirror, package, paths, note, plan_for)
        except BaseException as exc:
            for path in (paths.venv, paths.wheels):
                shutil.rmtree(path, ignore_errors=True)
            if not isinstance(exc, (Refused, OSError, ValueError, KeyError, zipfile.BadZipFile)):
                raise  # the deadline, an interrupt: no other candidate, and no half wheel left for a later run
            reasons.append(f"from {earlier.name}: {exc}")
            note(f"python-only bump refused {reasons[-1]}")
            continue
        done["seconds"] = round(time.monotonic() - started, 2)
        return done
    raise Refused("; ".join(reasons))


def _from(
    earlier: Earlier,
    commit: str,
    mirror: str,
    package: str,
    paths: Paths,
    note: Callable[[str], None],
    plan_for: Planner,
) -> Dict:
    if not os.path.isfile(earlier.wheel) or sha256_file(earlier.wheel) != earlier.wheel_sha:
        raise Refused(f"its wheel {earlier.wheel} is missing or not the one it installed")
    with zipfile.ZipFile(earlier.wheel) as archive:
        members = {info.filename: info for info in archive.infolist()}
        parts = os.path.basename(earlier.wheel).split("-")
        old_version = parts[1]
        old_info = _dist_info(list(members), package, old_version)
        diff = Diff(mirror, earlier.commit, commit, package, members)
        for path, blob in diff.old_blobs.items():
            if archive.read(path) != blob:
                raise Refused(f"{path} in the earlier wheel is not its commit's git blob: setup.py writes it")
        version_file = f"{package}/_version.py"
        old_version_py = archive.read(version_file) if version_file in members else None
        node = re.search(r"\+g([0-9a-f]+)", old_version) or re.search(
            r"'g([0-9a-f]+)'", (old_version_py or b"").decode()
        )
        abbrev = len(node.group(1)) if node else 7
        old_scm, new_scm = ScmVersion(mirror, earlier.commit, abbrev), ScmVersion(mirror, commit, abbrev)
        new_version = _with_suffix(new_scm.version, _suffix(old_version, old_scm.version))
        new_info = f"{package}-{new_version}.dist-info"
        renames = {n: new_info + n[len(old_info) :] if n.startswith(old_info + "/") else n for n in members}
        written = dict(diff.written)
        if old_version_py is not None:
            written[version_file] = _version_file(old_version_py, old_scm, new_scm)
        written[f"{new_info}/METADATA"] = _metadata(archive.read(f"{old_info}/METADATA"), old_version, new_version)
        os.makedirs(paths.wheels, exist_ok=True)
        wheel = os.path.join(paths.wheels, "-".join([parts[0], new_version, *parts[2:]]))
        wheel_rows = _write_wheel(archive, wheel, renames, written, diff.removed)
    plan = plan_for(wheel)  # uv asks the index while the venv is linked
    try:
        return _venv_from(earlier, package, paths, note, plan, wheel, wheel_rows, written, diff, members)
    finally:
        plan.close()


def _venv_from(
    earlier: Earlier,
    package: str,
    paths: Paths,
    note: Callable[[str], None],
    plan: DependencyPlan,
    wheel: str,
    wheel_rows: Dict[str, List[str]],
    written: Dict[str, bytes],
    diff: Diff,
    members: Mapping[str, zipfile.ZipInfo],
) -> Dict:
    """The bump's venv from the earlier one and the new wheel (its name gives the versions), linked while
    `plan` runs, then given the dependencies a fresh install gets."""
    site = site_packages(earlier.venv)
    old_version, new_version = os.path.basename(earlier.wheel).split("-")[1], os.path.basename(wheel).split("-")[1]
    new_info, old_info = f"{package}-{new_version}.dist-info", f"{package}-{old_version}.dist-info"
    wheel_sha = sha256_file(wheel)
    note(f"python-only bump from {earlier.name}: {len(diff.paths)} files changed; wheel {wheel} assembled")
    # The venv: hard links of the earlier one, then the package's files that differ written anew.
    old_site_rel = os.path.relpath(site, earlier.venv)
    old_dist = os.path.join(old_site_rel, f"{package}-{old_version}.dist-info")
    if not os.path.isdir(os.path.join(earlier.venv, old_dist)):
        raise Refused(f"{old_dist} is not installed in {earlier.venv}")
    replaced = {os.path.normpath(os.path.join(old_site_rel, p)) for p in [*written, *diff.removed]}
    linked = _link_tree(earlier.venv, paths.venv, lambda rel: rel == old_dist or rel in replaced)
    relocated = relocate_venv(paths.venv, earlier.venv, os.path.join(paths.final, "venv"))
    new_site = os.path.join(paths.venv, old_site_rel)
    _rehash_scripts(new_site, f"{package}-{old_version}.dist-info", relocated)
    for name, data in written.items():
        if not name.startswith(new_info + "/"):
            target = os.path.join(new_site, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            _replace(target, data, members[name].external_attr >> 16 & 0o777 or 0o644 if name in members else 0o644)
    rows = _install_dist_info(
        site, new_site, old_dist, new_info, old_info, wheel_rows, written, diff, (wheel, wheel_sha)
    )
    checked = verify_record(new_site, new_info)
    note(f"python-only bump: {linked} files hard-linked from {earlier.name}; {checked} files of {new_info} "
         f"match its RECORD ({rows} lines)")  # fmt: skip
    dependencies = plan.settle(paths.venv, package, new_version)
    return {
        "used": True,
        "reason": f"{len(diff.paths)} files changed since {earlier.name} ({earlier.commit[:12]}), all Python "
        f"files of {package}/ or outside the wheel: built from that release without setup.py",
        "files_changed": len(diff.paths),
        "from": earlier.name,
        "dependencies": dependencies,
        "wheel": wheel,
        "wheel_sha256": wheel_sha,
    }


def _install_dist_info(
    old_site: str,
    new_site: str,
    old_dist: str,
    new_info: str,
    old_info: str,
    wheel_rows: Mapping[str, List[str]],
    written: Mapping[str, bytes],
    diff: Diff,
    wheel: Tuple[str, str],
) -> int:
    """The installed dist-info under its new name: the earlier files (linked), METADATA, direct_url.json and
    RECORD anew. RECORD keeps the earlier installed lines of what is the same file, new ones for the rest."""
    old_dir = os.path.join(old_site, os.path.basename(old_dist))
    new_dir = os.path.join(new_site, new_info)
    _link_tree(old_dir, new_dir, lambda rel: rel in ("RECORD", "METADATA", "direct_url.json", "uv_cache.json"))
    _replace(os.path.join(new_dir, "METADATA"), written[f"{new_info}/METADATA"])
    direct_url = os.path.join(old_dir, "direct_url.json")
    if os.path.isfile(direct_url):
        with open(direct_url, encoding="utf-8") as handle:
            data = json.load(handle)
        data["url"] = "file://" + urllib.parse.quote(os.path.abspath(wheel[0]), safe="/+")
        archive = data.get("archive_info")
        if isinstance(archive, dict) and ("hash" in archive or "hashes" in archive):
            archive.pop("hash", None)
            archive["hashes"] = {"sha256": wheel[1]}
        _replace(os.path.join(new_dir, "direct_url.json"), json.dumps(data, separators=(",", ":")).encode("utf-8"))
    uv_cache = os.path.join(old_dir, "uv_cache.json")
    if os.path.isfile(uv_cache):  # uv's freshness record of a local wheel: its mtime
        with open(uv_cache, encoding="utf-8") as handle:
            data = json.load(handle)
        if not isinstance(data.get("timestamp"), dict):
            raise Refused(f"{uv_cache} has no timestamp as uv writes it")
        mtime = os.stat(wheel[0]).st_mtime_ns
        data["timestamp"] = {"secs_since_epoch": mtime // 10**9, "nanos_since_epoch": mtime % 10**9}
        _replace(os.path.join(new_dir, "uv_cache.json"), json.dumps(data, separators=(",", ":")).encode("utf-8"))
    with open(os.path.join(old_dir, "RECORD"), encoding="utf-8") as handle:
        old_rows = [row for row in csv.reader(handle) if row]
    old_base = os.path.basename(old_dist)
    rows = []
    for row in old_rows:
        name = new_info + row[0][len(old_base) :] if row[0].startswith(old_base + "/") else row[0]
        if name in diff.removed:
            continue
        path = os.path.normpath(os.path.join(new_site, name))
        if name.endswith(".dist-info/RECORD"):
            rows.append([name, "", ""])
        elif (
            name in written
            or name.endswith(("/direct_url.json", "/uv_cache.json"))
            or _relinked(path, os.path.join(old_site, row[0]))
        ):
            rows.append([name, _file_record_hash(path), str(os.path.getsize(path))])
        else:
            rows.append([name, *row[1:3]])
    listed = {row[0] for row in rows}
    rows[-1:-1] = [[n, *wheel_rows[n][1:3]] for n in written if n not in listed]
    _replace(os.path.join(new_dir, "RECORD"), _record_text(rows))
    return len(rows)


def _rehash_scripts(site: str, skip: str, relocated: List[str]) -> None:
    """The other dists' RECORD lines of their relocated scripts (bin/*: the venv's path in the shebang), as
    their installer writes them for the new path. Those dists' files are otherwise the earlier ones."""
    moved = {os.path.normpath(path) for path in relocated}
    for name in os.listdir(site):
        record = os.path.join(site, name, "RECORD")
        if not name.endswith(".dist-info") or name == skip or not os.path.isfile(record):
            continue
        with open(record, encoding="utf-8") as handle:
            rows = [row for row in csv.reader(handle) if row]
        changed = False
        for row in rows:
            path = os.path.normpath(os.path.join(site, row[0]))
            if path in moved and len(row) >= 3 and row[1]:
                row[1:3] = [_file_record_hash(path), str(os.path.getsize(path))]
                changed = True
        if changed:
            _replace(record, _record_text(rows))


def _relinked(new: str, old: str) -> bool:
    """Whether `new` is no longer the earlier file (relocated: a script naming the venv's path)."""
    try:
        return os.stat(new).st_ino != os.stat(old).st_ino
    except OSError:
        return True
