# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stage pinned models (target and drafter) into the Hugging Face cache the server reads, and verify them.

A model is a repo id and a revision (a 40-hex commit; a branch or tag only with `allow_moving_revision`).
Two sources lay out the same HF cache directory, `<cache_dir>/models--<org>--<name>/snapshots/<commit>/`:
- `hub`: `huggingface_hub.snapshot_download` in a python that has it (the release venv's, see _hub.py), each
  file then checked against the hub's listing for that commit - the LFS sha256, or the git blob sha1 of a
  file stored in git;
- `path`: a directory on the host (an air-gapped host; the role copies a controller directory there first),
  each file checked against `checksums` (sha256) when given, copied into the cache's blobs and linked.
The verdict is recorded (`{"files": {path: sha256}, "models": {...}}`), the format vllm_drift's
`recorded_inputs` reads, so the look sees a changed file. Standard library only (the target's system python).

The per-file check stays here, in the module, rather than huggingface_hub's `verify_repo_checksums` run in
the release venv or vendored. That function exists from huggingface_hub 1.1.0 only (absent from the 0.36.0
and 1.0.0 wheels), while a release venv with transformers 4 holds huggingface_hub < 1.0; it lists and checks
the whole repo (no allow_patterns: a staged subset is reported incomplete); and it returns mismatches, not
the sha256 of each file the record needs, so every file would be read twice. Vendoring it is no way out: the
target's python may be older than it allows (Requires-Python >=3.9 for 1.1.0, >=3.10 for 2.4.0, whose
`str | None` annotations fail to import on 3.9), and it imports huggingface_hub's constants, cache layout
and path filters. Its rule is the one applied here (the LFS sha256, else the git blob sha1), and
test_models.py::test_why_not_verify_repo_checksums holds the two differences to account.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import (
    read_json,
    sha256_stream,
    write_json_atomic,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._hub import STAGE_SCRIPT

__all__ = ["ModelSpec", "StageError", "snapshot_dir", "stage_models"]

COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
SOURCES = ("hub", "path")


class StageError(Exception):
    """A model that cannot be staged as asked; the message names the cause and the fix."""


class ModelSpec:
    def __init__(
        self,
        name: str,
        repo_id: str,
        revision: str,
        source: str = "hub",
        path: Optional[str] = None,
        allow_patterns: Optional[Sequence[str]] = None,
        checksums: Optional[Mapping[str, str]] = None,
        allow_moving_revision: bool = False,
    ) -> None:
        where = f"models[{name}]"
        if not REPO_ID.match(repo_id or ""):
            raise StageError(f"{where}: repo_id {repo_id!r} is not a Hugging Face repo id. Fix: give org/name.")
        if source not in SOURCES:
            raise StageError(f"{where}: source {source!r} is unknown. Fix: use one of {', '.join(SOURCES)}.")
        revision = (revision or "").strip()
        if not revision:
            raise StageError(f"{where}: {repo_id} has no revision. Fix: give the 40-hex commit to serve.")
        self.moving = not COMMIT.match(revision)
        if self.moving and (source == "path" or not allow_moving_revision):
            why = "a local copy is named by the commit it was taken from" if source == "path" else "it can move"
            raise StageError(
                f"{where}: revision {revision!r} of {repo_id} is not a 40-hex commit ({why}). "
                "Fix: pin the commit (the hub's 'sha' of that revision)"
                + ("." if source == "path" else ", or set allow_moving_revision to accept a branch or tag.")
            )
        if source == "path" and not (path and os.path.isabs(path)):
            raise StageError(f"{where}: source path needs an absolute 'path' on the host. Fix: set path.")
        for file_name, digest in (checksums or {}).items():
            if not re.match(r"^[0-9a-fA-F]{64}$", str(digest)):
                raise StageError(f"{where}: checksums[{file_name}] is not a sha256. Fix: give 64 hex digits.")
        self.name = name
        self.repo_id = repo_id
        self.revision = revision
        self.source = source
        self.path = path
        self.allow_patterns = list(allow_patterns) if allow_patterns else None
        self.checksums = {k: str(v).lower() for k, v in (checksums or {}).items()}

    @classmethod
    def from_option(cls, item: Mapping[str, Any]) -> ModelSpec:
        return cls(
            name=str(item.get("name") or item.get("repo_id")),
            repo_id=str(item.get("repo_id") or ""),
            revision=str(item.get("revision") or ""),
            source=str(item.get("source") or "hub"),
            path=item.get("path"),
            allow_patterns=item.get("allow_patterns"),
            checksums=item.get("checksums"),
            allow_moving_revision=bool(item.get("allow_moving_revision")),
        )


def repo_dir(cache_dir: str, repo_id: str) -> str:
    """huggingface_hub's cache folder of a model repo."""
    return os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"))


def snapshot_dir(cache_dir: str, repo_id: str, commit: str) -> str:
    return os.path.join(repo_dir(cache_dir, repo_id), "snapshots", commit)


def hash_file(path: str) -> Dict[str, Any]:
    """sha256 and git blob sha1 of a file in one read (the hub names non-LFS files by the latter)."""
    size = os.path.getsize(path)
    sha1 = hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as handle:
        sha256 = sha256_stream(handle, also=[sha1])
    return {"sha256": sha256.hexdigest(), "git_sha1": sha1.hexdigest(), "size": size}


def _allowed(relpath: str, patterns: Optional[Sequence[str]]) -> bool:
    # huggingface_hub's filter_repo_objects: fnmatch, and a pattern ending in "/" matches a whole folder.
    if not patterns:
        return True
    return any(fnmatch.fnmatch(relpath, p + "*" if p.endswith("/") else p) for p in patterns)


def _snapshot_files(directory: str) -> List[str]:
    """Every file under `directory` (relative, `/`-separated), links included but never followed into."""
    found = []
    for parent, dirs, files in os.walk(directory):
        # .cache/, .git/: never model files. A link to a directory is listed like a file, so that
        # _source_problem() judges it (os.walk would list it in `dirs` and not descend).
        links = [d for d in dirs if os.path.islink(os.path.join(parent, d))]
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in links)
        for file_name in files + links:
            found.append(os.path.relpath(os.path.join(parent, file_name), directory).replace(os.sep, "/"))
    return sorted(found)


def _source_problem(source: str, relpath: str) -> Optional[str]:
    """Why `relpath` of a `path` source must not be staged, or None.

    The module runs as root: a link out of the source dir (to /etc/shadow, another model's cache, a
    device) would be read with root's rights and published as a world-readable blob, and a file that
    others may not read would become readable by every local user. The staged blob is 0644, as
    huggingface_hub leaves it, so only a regular file inside the source dir that others may read is staged.
    """
    path = os.path.join(source, relpath)
    real_source = os.path.realpath(source)
    real = os.path.realpath(path)
    if not real.startswith(real_source + os.sep):
        return f"is a link out of the source path (to {real}); copy the file itself into {source} (cp -L)"
    try:
        info = os.stat(real)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISDIR(info.st_mode):
        return f"is a link to a directory; copy that directory itself into {source}"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file (a device, FIFO or socket)"
    if not info.st_mode & stat.S_IROTH:
        return (
            f"may not be read by others (mode {stat.S_IMODE(info.st_mode):04o}) and its staged copy would be "
            "0644, readable by every local user; make it readable (chmod o+r) if it is meant to be served, or "
            "keep it out of the source path (or of allow_patterns)"
        )
    return None


def _mismatches(spec: ModelSpec, commit: str, listing: Mapping[str, Any], snapshot: str) -> Dict[str, Any]:
    """Hash what the snapshot holds of `listing`; {"files": {rel: facts}, "problems": [rel, why]}."""
    files: Dict[str, Any] = {}
    problems = []
    for relpath, expected in sorted(listing.items()):
        path = os.path.join(snapshot, relpath)
        if not os.path.isfile(path):
            problems.append((relpath, "is missing"))
            continue
        actual = hash_file(path)
        if expected.get("sha256"):
            ok, checked = actual["sha256"] == expected["sha256"], "sha256 (LFS oid)"
            want, got = expected["sha256"], actual["sha256"]
        elif expected.get("git_sha1"):
            ok, checked = actual["git_sha1"] == expected["git_sha1"], "git blob sha1"
            want, got = expected["git_sha1"], actual["git_sha1"]
        else:
            ok, checked, want, got = True, "none (not listed)", None, None
        if not ok:
            problems.append((relpath, f"has {checked} {got}, the listing says {want}"))
        files[relpath] = {"sha256": actual["sha256"], "size": actual["size"], "verified_by": checked}
    return {"files": files, "problems": problems}


def _refusal(spec: ModelSpec, commit: str, problems: Sequence[Any], fix: str) -> StageError:
    named = "; ".join(f"{relpath} {why}" for relpath, why in problems)
    return StageError(f"{spec.repo_id} at revision {spec.revision} ({commit}): {named}. Fix: {fix}")


def _remove_staged(snapshot: str, relpaths: Sequence[str]) -> None:
    """Drop a refused file (its snapshot link and the blob it points at), so nothing unverified stays staged."""
    for relpath in relpaths:
        link = os.path.join(snapshot, relpath)
        target = os.path.realpath(link)
        for path in (link, target):
            with contextlib.suppress(OSError):
                os.unlink(path)


Runner = Callable[[str, Mapping[str, Any], Mapping[str, str], float], Dict[str, Any]]


def run_stage_script(python: str, request: Mapping[str, Any], env: Mapping[str, str], timeout: float) -> Dict[str, Any]:
    """Run _hub.STAGE_SCRIPT in `python`; its last stdout line is the answer."""
    fd, script = tempfile.mkstemp(prefix="vllm-model-stage-", suffix=".py")
    with os.fdopen(fd, "w") as handle:
        handle.write(STAGE_SCRIPT)
    try:
        process = subprocess.run(
            [python, script],
            input=json.dumps(dict(request)),
            capture_output=True,
            text=True,
            env=dict(env),
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise StageError(
            f"{python} does not exist. Fix: set python to a python with huggingface_hub (the release venv's)."
        ) from None
    except subprocess.TimeoutExpired:
        raise StageError(
            f"staging {request['repo_id']} took longer than {timeout:.0f} s. Fix: raise timeout."
        ) from None
    finally:
        os.unlink(script)
    lines = [line for line in process.stdout.splitlines() if line.strip()]
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (process.stderr or process.stdout).strip().splitlines()[-3:]
        raise StageError(
            f"the staging script in {python} gave no answer (exit {process.returncode}): {' | '.join(tail)}"
        ) from None


_HUB_FIXES = {
    "repo_not_found": "check repo_id (and that the token may read it, for a private repo).",
    "revision_not_found": "give a commit that exists in the repo (the hub's 'sha'; `git ls-remote` on the repo).",
    "unauthorized": "put a token that may read the repo in vllm_hf_token.",
    "unreachable": "let the host reach the hub (HF_ENDPOINT), or stage from a path (source: path).",
    "no_huggingface_hub": "point python at a venv with huggingface_hub (the release venv: vLLM depends on it).",
}


def _plan_hub(
    spec: ModelSpec, cache_dir: str, python: str, env: Mapping[str, str], timeout: float, runner: Runner
) -> Dict[str, Any]:
    """Ask the hub for the listing (an unknown repo or revision is refused here) and hash what is staged."""
    request: Dict[str, Any] = {"repo_id": spec.repo_id, "revision": spec.revision}
    request.update({"allow_patterns": spec.allow_patterns, "cache_dir": cache_dir, "download": False})
    listed = runner(python, request, env, timeout)
    if "error" in listed:
        fix = _HUB_FIXES.get(listed["error"], "see the message.")
        raise StageError(f"{spec.repo_id} at revision {spec.revision}: {listed['message']}. Fix: {fix}")
    commit, listing = listed["commit"], listed["listing"]
    if not listing:
        raise StageError(
            f"{spec.repo_id} at revision {spec.revision} ({commit}): no file matches allow_patterns "
            f"{spec.allow_patterns}. Fix: widen allow_patterns."
        )
    snapshot = snapshot_dir(cache_dir, spec.repo_id, commit)
    before = _mismatches(spec, commit, listing, snapshot)
    staged = not before["problems"]
    return {
        "commit": commit,
        "snapshot": snapshot,
        "files": before["files"] if staged else {},
        "changed": not staged,
        "apply": lambda: _download(spec, request, commit, listing, snapshot, python, env, timeout, runner),
    }


def _download(
    spec: ModelSpec,
    request: Mapping[str, Any],
    commit: str,
    listing: Mapping[str, Any],
    snapshot: str,
    python: str,
    env: Mapping[str, str],
    timeout: float,
    runner: Runner,
) -> Dict[str, Any]:
    downloaded = runner(python, dict(request, download=True, revision=commit), env, timeout)
    if "error" in downloaded:
        fix = _HUB_FIXES.get(downloaded["error"], "see the message.")
        raise StageError(f"{spec.repo_id} at revision {spec.revision}: {downloaded['message']}. Fix: {fix}")
    after = _mismatches(spec, commit, listing, snapshot)
    if after["problems"]:
        _remove_staged(snapshot, [problem[0] for problem in after["problems"]])
        raise _refusal(
            spec,
            commit,
            after["problems"],
            "the download differs from the hub's listing (a corrupt mirror or proxy?); the file was removed from "
            "the cache, nothing else changed - re-run, or stage from a verified path.",
        )
    return after["files"]


def _link(blob: str, link: str) -> None:
    os.makedirs(os.path.dirname(link), exist_ok=True)
    tmp = link + ".tmp-link"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(os.path.relpath(blob, os.path.dirname(link)), tmp)
    os.replace(tmp, link)


def _plan_path(spec: ModelSpec, cache_dir: str, check_mode: bool) -> Dict[str, Any]:
    """Hash the host directory and check it against `checksums`; what copying it would change."""
    source = str(spec.path)
    snapshot = snapshot_dir(cache_dir, spec.repo_id, spec.revision)
    if not os.path.isdir(source):
        if check_mode:  # a controller directory is copied there first, which check mode does not do
            return {"commit": spec.revision, "snapshot": snapshot, "files": {}, "changed": True, "apply": None}
        raise StageError(f"{spec.repo_id}: source path {source} is not a directory. Fix: copy the model there first.")
    relpaths = [p for p in _snapshot_files(source) if _allowed(p, spec.allow_patterns)]
    if not relpaths:
        raise StageError(
            f"{spec.repo_id}: no file in {source} matches allow_patterns {spec.allow_patterns}. Fix: widen them."
        )
    unsafe = [(p, why) for p, why in ((p, _source_problem(source, p)) for p in relpaths) if why]
    if unsafe:
        raise _refusal(spec, spec.revision, unsafe, "nothing was staged; stage only the model's own files.")
    hashes = {relpath: hash_file(os.path.join(source, relpath)) for relpath in relpaths}
    problems = [(p, "is not in the source path") for p in sorted(set(spec.checksums) - set(hashes))]
    problems += [
        (p, f"has sha256 {hashes[p]['sha256']}, checksums say {spec.checksums[p]}")
        for p in relpaths
        if p in spec.checksums and spec.checksums[p] != hashes[p]["sha256"]
    ]
    if problems:
        raise _refusal(spec, spec.revision, problems, f"copy the files of that revision into {source} again.")
    verified_by = "sha256 (checksums)" if spec.checksums else "none (no checksums given)"
    files = {p: {"sha256": h["sha256"], "size": h["size"], "verified_by": verified_by} for p, h in hashes.items()}
    stale = [
        relpath
        for relpath in relpaths
        if not (
            os.path.isfile(os.path.join(snapshot, relpath))
            and hash_file(os.path.join(snapshot, relpath))["sha256"] == hashes[relpath]["sha256"]
        )
    ]
    return {
        "commit": spec.revision,
        "snapshot": snapshot,
        "files": files,
        "changed": bool(stale),
        "apply": lambda: _copy(spec, source, stale, hashes, cache_dir, snapshot, files),
    }


def _copy(
    spec: ModelSpec,
    source: str,
    relpaths: Sequence[str],
    hashes: Mapping[str, Any],
    cache_dir: str,
    snapshot: str,
    files: Dict[str, Any],
) -> Dict[str, Any]:
    """Copy into the cache's blobs (named by sha256) and link the snapshot to them, as huggingface_hub does."""
    blobs = os.path.join(repo_dir(cache_dir, spec.repo_id), "blobs")
    for relpath in relpaths:
        blob = os.path.join(blobs, hashes[relpath]["sha256"])
        os.makedirs(blobs, exist_ok=True)
        tmp = blob + ".incomplete"
        _copy_checked(spec, source, relpath, hashes[relpath]["sha256"], tmp)
        os.replace(tmp, blob)
        _link(blob, os.path.join(snapshot, relpath))
    return files


def _copy_checked(spec: ModelSpec, source: str, relpath: str, sha256: str, tmp: str) -> None:
    """Copy `relpath` to `tmp` (0644) as it was checked: the same rules again, then the same sha256.

    Between the plan and the copy the file may have been swapped for a link or changed; the blob is
    named by its sha256, so it must hold exactly those bytes.
    """
    problem = _source_problem(source, relpath)
    if problem:
        raise _refusal(spec, spec.revision, [(relpath, problem)], "nothing more was staged; re-run.")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    real = os.path.realpath(os.path.join(source, relpath))
    created = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    with open(os.open(real, flags), "rb") as src, open(os.open(tmp, created, 0o644), "wb") as dst:
        os.fchmod(dst.fileno(), 0o644)  # whatever the umask
        digest = sha256_stream(src, copy_to=dst)
    if digest.hexdigest() != sha256:
        os.unlink(tmp)
        raise _refusal(
            spec,
            spec.revision,
            [(relpath, f"changed while it was staged (sha256 {digest.hexdigest()}, checked {sha256})")],
            "nothing more was staged; re-run once the source path is no longer written to.",
        )


def stage_models(
    specs: Sequence[ModelSpec],
    cache_dir: str,
    record: Optional[str] = None,
    python: str = sys.executable,
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 3600.0,
    check_mode: bool = False,
    runner: Runner = run_stage_script,
) -> Dict[str, Any]:
    """Stage every model, then record them. Any refusal raises before the record changes."""
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise StageError(f"models: names {names} repeat. Fix: give each model its own name.")
    if not os.path.isabs(cache_dir):
        raise StageError(f"cache_dir {cache_dir} is not absolute. Fix: give the HF cache the unit uses (HF_HOME/hub).")
    child_env = dict(env if env is not None else os.environ)
    # The staging run must reach the hub (the unit's HF_HUB_OFFLINE does not apply) and print nothing but JSON.
    child_env.update({"HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    # Every model is checked first (listing, revision, checksums), so that a refusal of the drafter leaves
    # the target unstaged too; only then is anything downloaded or copied.
    plans = [
        _plan_hub(spec, cache_dir, python, child_env, timeout, runner)
        if spec.source == "hub"
        else _plan_path(spec, cache_dir, check_mode)
        for spec in specs
    ]
    models: Dict[str, Any] = {}
    for spec, plan in zip(specs, plans):
        files = plan["apply"]() if plan["changed"] and not check_mode else plan["files"]
        models[spec.name] = {
            "repo_id": spec.repo_id,
            "revision": spec.revision,
            "commit": plan["commit"],
            "moving_revision": spec.moving,
            "source": spec.source,
            "snapshot": plan["snapshot"],
            "files": files,
            "changed": plan["changed"],
        }
    changed = any(plan["changed"] for plan in plans)
    result: Dict[str, Any] = {"models": models, "record": record, "record_changed": False}
    if record:
        content = {
            "files": {
                os.path.join(m["snapshot"], relpath): facts["sha256"]
                for m in models.values()
                for relpath, facts in sorted(m["files"].items())
            },
            "models": {
                name: {
                    key: m[key] for key in ("repo_id", "revision", "commit", "moving_revision", "source", "snapshot")
                }
                for name, m in models.items()
            },
        }
        try:
            previous = read_json(record, None)
        except (OSError, ValueError):
            previous = None
        result["record_changed"] = previous != content
        if result["record_changed"] and not check_mode:
            write_json_atomic(record, content)
        result["diff"] = {"before": previous, "after": content}
    result["changed"] = changed or result["record_changed"]
    return result
