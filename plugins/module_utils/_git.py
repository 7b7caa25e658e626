# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Resolve a git ref to a full commit SHA, keep a bare mirror, check a commit out for a build.

Resolution asks the remote first (`git ls-remote`: no fetch, no disk), so a re-run whose release
already exists needs no mirror at all. Only a short SHA needs objects: it is looked up in the mirror.
The mirror always keeps full history and all tags: setuptools-scm derives the version
(`0.1.devN+g<hash>`, or the tag) from them, and a shallow clone yields a wrong version.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import urllib.parse
from typing import Dict, List, Mapping, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import redact_url
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import CommandResult, Deadline, run

__all__ = [
    "GitError",
    "Resolution",
    "changed_paths",
    "checkout",
    "commit_exists",
    "credentials_off_argv",
    "ensure_mirror",
    "fetch_ref",
    "fetch_short_sha",
    "git_env",
    "is_full_sha",
    "ls_remote",
    "merge_base",
    "mirror_path",
    "normalize_repo",
    "resolve_commit",
    "resolve_remote",
    "resolve_short_sha",
    "rev_parse",
]

_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
_SHORT_SHA = re.compile(r"^[0-9a-f]{4,39}$")
QUERY_TIMEOUT = 120.0


class GitError(Exception):
    """A git operation failed; the message names the repository (without credentials) and the fix."""


class Resolution:
    """A ref resolved to a commit. `kind`: branch, tag, ref, head, sha, short_sha."""

    def __init__(self, ref: str, commit: Optional[str], kind: str, full_ref: Optional[str] = None) -> None:
        self.ref = ref
        self.commit = commit
        self.kind = kind
        self.full_ref = full_ref

    def __repr__(self) -> str:
        return f"Resolution({self.ref!r} -> {self.commit} [{self.kind}])"


def is_full_sha(text: str) -> bool:
    return bool(_FULL_SHA.match(text))


# The transports a repo URL may use, for every git call (and git run by the build, e.g. setuptools-scm).
# GIT_ALLOW_PROTOCOL overrides any protocol.*.allow of the environment or the git config, so `ext::`
# (runs a command), `fd::` and unknown remote helpers are refused even where the environment allowed them.
ALLOWED_PROTOCOLS = "file:git:http:https:ssh"


def git_env(base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Environment for git: C locale (parsable messages), never wait for a password prompt, and only the
    transports of ALLOWED_PROTOCOLS."""
    env = dict(os.environ if base is None else base)
    env.update({"LC_ALL": "C", "LANG": "C", "GIT_TERMINAL_PROMPT": "0", "GCM_INTERACTIVE": "never"})
    env["GIT_ALLOW_PROTOCOL"] = ALLOWED_PROTOCOLS
    if "GIT_SSH_COMMAND" not in env and "GIT_SSH" not in env:
        env["GIT_SSH_COMMAND"] = "ssh -o BatchMode=yes"
    return env


def normalize_repo(repo: str) -> str:
    """An existing local path becomes absolute (modules run from a temp dir); URLs stay as given."""
    if not repo or repo.startswith("-"):
        raise GitError(f"repo {redact_url(repo)!r} is not a repository URL or path; give an https/ssh/file URL or path")
    if "://" not in repo and os.path.exists(repo):
        return os.path.abspath(repo)
    return repo


def mirror_path(root: str, repo: str) -> str:
    """`<root>/src/<slug>.git`: readable name plus a hash of the credential-free URL (no collisions)."""
    clean = redact_url(normalize_repo(repo)).rstrip("/")
    if clean.endswith(".git"):
        clean = clean[: -len(".git")]
    tail = "-".join(re.split(r"[/:]+", clean)[-2:])
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", tail).strip("-.") or "repo"
    return os.path.join(root, "src", f"{slug}-{hashlib.sha256(clean.encode()).hexdigest()[:8]}.git")


# A credential helper of git's own config syntax (`!` runs it in a shell): it answers `get` with the
# credentials of one URL from the environment, so they reach git without its argv (which `ps` shows).
_HELPER = (
    "!f() { test \"$1\" = get && printf 'username=%s\\npassword=%s\\n' "
    '"$VLLM_OPS_GIT_USER_{n}" "$VLLM_OPS_GIT_PASS_{n}"; }; f'
)


def credentials_off_argv(args: List[str], env: Dict[str, str]) -> Tuple[List[str], Dict[str, str]]:
    """`args` with the credentials of their http(s) URLs taken out, and `env` extended so that git gets them
    from a credential helper scoped to that URL's host (GIT_CONFIG_COUNT: after any the caller set)."""
    env = dict(env)
    cleaned = []
    count = int(env.get("GIT_CONFIG_COUNT") or 0) if str(env.get("GIT_CONFIG_COUNT") or "0").isdigit() else 0
    scopes: Dict[str, int] = {}
    for arg in args:
        if not re.match(r"(?i)https?://", arg) or redact_url(arg) == arg:
            cleaned.append(arg)
            continue
        parts = urllib.parse.urlsplit(arg)
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        scope = f"{parts.scheme.lower()}://{host}" + (f":{parts.port}" if parts.port else "")
        if scope not in scopes:
            index = scopes[scope] = len(scopes)
            env[f"VLLM_OPS_GIT_USER_{index}"] = urllib.parse.unquote(parts.username or "")
            env[f"VLLM_OPS_GIT_PASS_{index}"] = urllib.parse.unquote(parts.password or "")
            # An empty helper first: helpers of the user's config do not answer for this URL before ours.
            for value in ("", _HELPER.replace("{n}", str(index))):
                env[f"GIT_CONFIG_KEY_{count}"] = f"credential.{scope}.helper"
                env[f"GIT_CONFIG_VALUE_{count}"] = value
                count += 1
        cleaned.append(redact_url(arg))
    if scopes:
        env["GIT_CONFIG_COUNT"] = str(count)
    return cleaned, env


def _git(
    args: List[str],
    timeout: float,
    git_dir: Optional[str] = None,
    log_path: Optional[str] = None,
    long_running: bool = False,
) -> CommandResult:
    argv = ["git"]
    if git_dir:
        argv += ["--git-dir", git_dir]
    args, env = credentials_off_argv(args, git_env())
    try:
        return run(argv + args, timeout, log_path=log_path, env=env, watchdog=long_running)
    except FileNotFoundError as exc:
        raise GitError("git is not installed on this host; install it (e.g. the `git` package)") from exc


def _check(result: CommandResult, what: str, repo: str, timeout: float) -> CommandResult:
    if result.timed_out:
        raise GitError(f"{what} for {redact_url(repo)} did not finish within {timeout:.0f}s; check the network")
    if result.rc != 0:
        detail = result.log_tail.strip() or f"exit code {result.rc}"
        raise GitError(f"{what} failed for {redact_url(repo)}: {detail}")
    return result


def ls_remote(repo: str, patterns: List[str], timeout: float = QUERY_TIMEOUT) -> Dict[str, str]:
    """{refname: sha} on the remote for the given patterns (no fetch). Fails if unreachable."""
    result = _git(["ls-remote", "--", repo, *patterns], timeout)
    if result.timed_out or result.rc != 0:
        detail = result.log_tail.strip() or f"git exit code {result.rc}"
        if result.timed_out:
            detail = f"no answer within {timeout:.0f}s"
        raise GitError(
            f"cannot reach repository {redact_url(repo)}: {detail}. "
            "Check the URL, the network and the credentials (https token in the URL, or ssh keys for ssh)"
        )
    refs = {}
    for line in result.stdout.splitlines():
        fields = line.split("\t", 1)
        if len(fields) == 2 and is_full_sha(fields[0]):
            refs[fields[1]] = fields[0]
    return refs


def resolve_remote(repo: str, ref: str, timeout: float = QUERY_TIMEOUT) -> Resolution:
    """Resolve `ref` with ls-remote only. A short SHA comes back with commit None (needs a mirror).

    Raises GitError for an unreachable repo, an unknown ref, or a name that is both a branch and a tag
    of different commits.
    """
    repo = normalize_repo(repo)
    ref = ref.strip()
    if not ref or ref.startswith("-") or any(c in ref for c in " ~^:?*[\\") or ".." in ref:
        raise GitError(f"ref {ref!r} is not a valid git ref; give a branch, tag, SHA or refs/... name")
    if is_full_sha(ref.lower()):
        ls_remote(repo, ["HEAD"], timeout)  # proves the repo is reachable before any build
        return Resolution(ref, ref.lower(), "sha")
    if ref == "HEAD" or ref.startswith("refs/"):
        patterns = [ref, ref + "^{}"] if ref.startswith("refs/tags/") else [ref]
        refs = ls_remote(repo, patterns, timeout)
        sha = refs.get(ref + "^{}") or refs.get(ref)
        if sha:
            return Resolution(ref, sha, "head" if ref == "HEAD" else "ref", ref)
        raise GitError(f"ref {ref!r} does not exist in {redact_url(repo)}; check the name (git ls-remote lists them)")
    branch, tag = "refs/heads/" + ref, "refs/tags/" + ref
    refs = ls_remote(repo, [branch, tag, tag + "^{}"], timeout)
    tag_sha = refs.get(tag + "^{}") or refs.get(tag)
    branch_sha = refs.get(branch)
    if branch_sha and tag_sha and branch_sha != tag_sha:
        raise GitError(
            f"ref {ref!r} is both a branch ({branch_sha[:12]}) and a tag ({tag_sha[:12]}) in {redact_url(repo)}; "
            f"say which: ref: {branch} or ref: {tag}"
        )
    if tag_sha:
        return Resolution(ref, tag_sha, "tag", tag)
    if branch_sha:
        return Resolution(ref, branch_sha, "branch", branch)
    if _SHORT_SHA.match(ref.lower()):
        return Resolution(ref, None, "short_sha")
    raise GitError(
        f"ref {ref!r} not found in {redact_url(repo)}: no branch or tag of that name; "
        "give an existing branch, tag, full or short SHA, or refs/pull/N/head"
    )


def commit_exists(mirror: str, sha: str) -> bool:
    result = _git(["cat-file", "-e", sha + "^{commit}"], QUERY_TIMEOUT, git_dir=mirror)
    return result.ok


def resolve_short_sha(mirror: str, prefix: str, repo: str) -> Optional[str]:
    """The one commit in `mirror` whose SHA starts with `prefix`; None if none (or no mirror yet); GitError if
    ambiguous. Only reads: safe without the host lock and in check mode."""
    if not os.path.isdir(os.path.join(mirror, "objects")):
        return None
    prefix = prefix.lower()
    found = _git(["rev-parse", "--disambiguate=" + prefix], QUERY_TIMEOUT, git_dir=mirror)
    candidates = [line.strip() for line in found.stdout.splitlines() if is_full_sha(line.strip())]
    if not candidates:
        return None
    # --disambiguate lists every object type; only commits count (a blob may share the prefix).
    commits = [
        sha
        for sha in candidates
        if _git(["cat-file", "-t", sha], QUERY_TIMEOUT, git_dir=mirror).stdout.strip() == "commit"
    ]
    if len(commits) > 1:
        raise GitError(
            f"short SHA {prefix!r} is ambiguous in {redact_url(repo)}: it matches commits "
            f"{', '.join(c[:12] for c in sorted(commits))}; give more hex digits"
        )
    return commits[0] if commits else None


def ensure_mirror(
    repo: str, mirror: str, timeout: float, log_path: Optional[str] = None, extra: Optional[List[str]] = None
) -> None:
    """Create the bare mirror if needed and fetch all branches and tags (+ `extra` refs or SHAs).

    The URL is passed on the command line, never stored in the mirror's config, so a token in it
    does not end up on disk; its credentials are taken off the command line (`credentials_off_argv`).
    """
    if not os.path.isdir(os.path.join(mirror, "objects")):
        tmp = mirror + ".init"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.dirname(mirror), exist_ok=True)
        _check(_git(["init", "--bare", "-q", tmp], QUERY_TIMEOUT), "git init", repo, QUERY_TIMEOUT)
        shutil.rmtree(mirror, ignore_errors=True)  # a half mirror from an interrupted init
        os.rename(tmp, mirror)
    refspecs = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]
    for item in extra or []:
        if item.startswith("refs/") and not item.startswith(("refs/heads/", "refs/tags/")):
            refspecs.append(f"+{item}:{item}")
        elif is_full_sha(item):
            refspecs.append(item)
    args = ["fetch", "--quiet", "--", repo, *refspecs]
    _check(_git(args, timeout, git_dir=mirror, log_path=log_path, long_running=True), "git fetch", repo, timeout)


def fetch_ref(url: str, mirror: str, ref: str, dest_ref: str, timeout: float, log_path: Optional[str] = None) -> None:
    """Fetch `ref` (a full refs/... name or a full SHA) of another repository `url` into `dest_ref` of the mirror.

    Used for the upstream a fork is compared with: objects shared with the fork are not fetched twice.
    """
    source = ref if is_full_sha(ref) else f"+{ref}"
    refspec = f"{source}:{dest_ref}"
    args = ["fetch", "--quiet", "--", url, refspec]
    _check(_git(args, timeout, git_dir=mirror, log_path=log_path, long_running=True), "git fetch", url, timeout)


def rev_parse(mirror: str, name: str) -> Optional[str]:
    """The commit `name` (branch, tag, refs/... or SHA) names in the mirror, or None."""
    if name.startswith("refs/") or is_full_sha(name):
        candidates = [name]
    else:
        candidates = [f"refs/heads/{name}", f"refs/tags/{name}"]
    for candidate in candidates:
        result = _git(["rev-parse", "--verify", "-q", candidate + "^{commit}"], QUERY_TIMEOUT, git_dir=mirror)
        sha = result.stdout.strip()
        if result.ok and is_full_sha(sha):
            return sha
    return None


def resolve_commit(mirror: str, name: str) -> Optional[str]:
    """The commit a full or unambiguous short SHA, tag, branch or refs/... name means in the mirror, or None."""
    if not name or name.startswith("-"):
        return None
    result = _git(["rev-parse", "--verify", "-q", name + "^{commit}"], QUERY_TIMEOUT, git_dir=mirror)
    sha = result.stdout.strip()
    return sha if result.ok and is_full_sha(sha) else None


def merge_base(mirror: str, first: str, second: str) -> Optional[str]:
    """The best common ancestor of two commits of the mirror, or None for unrelated histories."""
    result = _git(["merge-base", first, second], QUERY_TIMEOUT, git_dir=mirror)
    sha = result.stdout.strip()
    if result.rc == 1 and not sha:
        return None
    _check(result, "git merge-base", mirror, QUERY_TIMEOUT)
    return sha


def changed_paths(mirror: str, old: str, new: str) -> List[str]:
    """Paths that differ between two commits. Renames count on both sides (the old path changed too)."""
    result = _git(["diff", "--name-only", "--no-renames", "-z", old, new], QUERY_TIMEOUT, git_dir=mirror)
    _check(result, "git diff", mirror, QUERY_TIMEOUT)
    return [path for path in result.stdout.split("\0") if path]


def fetch_short_sha(repo: str, mirror: str, prefix: str, timeout: float, log_path: Optional[str] = None) -> str:
    """Resolve a short SHA in the mirror, fetching first if it is not known there; GitError if unknown."""
    commit = resolve_short_sha(mirror, prefix, repo)
    if commit is None:
        ensure_mirror(repo, mirror, timeout, log_path)
        commit = resolve_short_sha(mirror, prefix, repo)
    if commit is None:
        raise GitError(
            f"ref {prefix!r} not found in {redact_url(repo)}: no branch, tag or commit starting with it "
            "(a commit reachable only from refs/pull/* needs refs/pull/N/head or a full SHA)"
        )
    return commit


def checkout(mirror: str, sha: str, dest: str, timeout: float, log_path: Optional[str] = None) -> None:
    """A full-history working tree of `sha` at `dest` (objects shared with the mirror, all tags present)."""
    deadline = Deadline(timeout)
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    steps = [
        ("clone", ["clone", "--quiet", "--shared", "--no-checkout", mirror, dest]),
        ("fetch of the tags", ["-C", dest, "fetch", "--quiet", mirror, "+refs/tags/*:refs/tags/*"]),
        ("checkout", ["-c", "advice.detachedHead=false", "-C", dest, "checkout", "--quiet", "--detach", sha]),
    ]
    for what, args in steps:
        result = _git(args, deadline.remaining(), log_path=log_path, long_running=True)
        _check(result, "git " + what, mirror, timeout)
