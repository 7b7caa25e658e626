# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Turn the fixture engine's source (tests/fixtures/engine, TEST EQUIPMENT standing in for vLLM) into a
real git repository with the refs the collection's tests build from.

Standard library only, Python 3.8+, git >= 2.20; no dependence on the caller's git configuration:
identity, dates and config are fixed, so every run gives the same commit SHAs.

    python3 engine_repo.py DEST [--bare] [--source DIR]    create DEST; prints {ref: sha} as JSON
    python3 engine_repo.py bump REPO BRANCH [-m MESSAGE]   one more commit on BRANCH; prints {ref: sha}
    python3 engine_repo.py version REPO [REF] [--node-len N]   version a build of REF gets (setuptools-scm)

Refs (annotated tags map to the commit they point at):
    refs/heads/main          5 commits, no tag reachable       -> 0.1.dev5+g<hash>
    refs/heads/release-0.2   main + "Release 0.2.0" (tagged) + 1 -> 0.2.1.dev1+g<hash>
    refs/tags/v0.2.0         on release-0.2, not reachable from main -> 0.2.0
    refs/heads/dflash-fix    main + 1 Python-only commit        -> 0.1.dev6+g<hash>
    refs/pull/1/head         main + 1 Python-only commit on no branch -> 0.1.dev6+g<hash>
    refs/heads/fault/slow-build     main + csrc/fixture-faults.json: the build sleeps 600 s
    refs/heads/fault/broken-ext     main + a syntax error in csrc/ops.c: the build fails
    refs/heads/fault/missing-so     main + csrc/fixture-faults.json: the build succeeds without vllm._moe_C
    refs/heads/fault/crash-on-start main + CRASH_ON_START = True: `vllm serve` exits 1 right after start
    refs/heads/fault/acceptance-drop main + ACCEPTANCE_LENGTH_DROP = 0.5: the mean acceptance length falls by 0.5
    refs/heads/fault/no-probe       main with the probed DFlash files as vLLM 0.20.1 wrote them (faults/no-probe/)
Each fault branch is main + 1 commit (0.1.dev6+g<hash>). A bump adds one commit to NEWS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

DEFAULT_SOURCE = Path(__file__).resolve().parent.parent / "fixtures" / "engine"
MAIN_COMMITS = 5
IDENTITY = ("Fixture Engine", "fixture-engine@vllm-ops.invalid")
EPOCH = 1767607200  # 2026-01-05T10:00:00Z; commit k of a fresh repository is dated EPOCH + k hours
HOUR = 3600

# main's history: (message, path prefixes); stage 1 takes every file no later stage claims.
MAIN_STAGES = (
    ("Fixture engine: package, build and compiled extensions", ()),
    ("DFlash: aux-layer ids name decoder-layer outputs (+1)", ("vllm/v1/worker/",)),
    ("DFlash: sliding-window drafter layers (layer_types, sliding_window)", ("vllm/model_executor/",)),
    (
        "Speculative decoding: config, acceptance, engine core and metrics",
        ("vllm/config/", "vllm/v1/engine/", "vllm/v1/sample/", "vllm/v1/spec_decode/", "vllm/v1/metrics/"),
    ),
    ("vllm serve: OpenAI-compatible server and CLI", ("vllm/entrypoints/", "vllm/utils/")),
)
assert len(MAIN_STAGES) == MAIN_COMMITS
# Build outputs never belong in the repository (same list as the engine's .gitignore).
SKIP_DIRS = {"__pycache__", "build", "dist", ".eggs", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
SKIP_FILES = {"vllm/_version.py"}
# Files that fault branches lay over main's (faults/<branch>/vllm/...); never part of main's tree.
FAULTS_DIR = "faults"
SKIP_SUFFIXES = (".pyc", ".so", ".egg-info")

EAGLE3_UTILS = "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"
QWEN3_DFLASH = "vllm/model_executor/models/qwen3_dflash.py"
# vLLM 0.20.1 has no DFlash speculator on Model Runner V2: fault/no-probe drops main's.
V2_DFLASH_SPECULATOR = "vllm/v1/worker/gpu/spec_decode/dflash"


class EngineRepoError(RuntimeError):
    pass


def git_env(date: Optional[int] = None) -> Dict[str, str]:
    """Environment for every git call: fixed identity, no user/system config, optional fixed date."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_AUTHOR_NAME=IDENTITY[0],
        GIT_AUTHOR_EMAIL=IDENTITY[1],
        GIT_COMMITTER_NAME=IDENTITY[0],
        GIT_COMMITTER_EMAIL=IDENTITY[1],
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        HOME=os.devnull,
        XDG_CONFIG_HOME=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        LC_ALL="C",
        TZ="UTC",
    )
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{date} +0000"
    return env


def git(
    repo: Path, *args: str, date: Optional[int] = None, stdin: Optional[str] = None, index: Optional[Path] = None
) -> str:
    env = git_env(date)
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    result = subprocess.run(
        ["git", "-C", str(repo), "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        raise EngineRepoError(f"git {' '.join(args)} failed in {repo}: {result.stderr.strip()}")
    return result.stdout.strip()


def source_files(source: Path, top: bool = True) -> List[str]:
    """Relative paths of the engine's source files, without build outputs (nor, at the top, the fault overlays)."""
    files = []
    for root, dirs, names in os.walk(source):
        skip = SKIP_DIRS | {FAULTS_DIR} if top and Path(root) == source else SKIP_DIRS
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.endswith(SKIP_SUFFIXES))
        for name in sorted(names):
            rel = Path(root, name).relative_to(source).as_posix()
            if rel not in SKIP_FILES and not name.endswith(SKIP_SUFFIXES):
                files.append(rel)
    return files


def _stage_of(path: str) -> int:
    for index, (_message, prefixes) in enumerate(MAIN_STAGES):
        if any(path.startswith(prefix) for prefix in prefixes):
            return index
    return 0


class _Builder:
    """Writes files and commits in one work tree, dating commit k at EPOCH + k hours."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.commits = 0

    def write(self, rel: str, text: str) -> None:
        path = self.work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    def remove(self, rel: str) -> None:
        git(self.work, "rm", "-r", "-q", "--", rel)

    def overlay(self, directory: Path) -> None:
        """Copy the `vllm/` files under `directory` over the work tree."""
        if not (directory / "vllm").is_dir():
            raise EngineRepoError(f"{directory / 'vllm'} is missing: the engine source lacks its fault overlay")
        for rel in source_files(directory / "vllm", top=False):
            self.write(f"vllm/{rel}", (directory / "vllm" / rel).read_text(encoding="utf-8"))

    def edit(self, rel: str, old: str, new: str) -> None:
        text = (self.work / rel).read_text(encoding="utf-8")
        if old not in text:
            raise EngineRepoError(f"{rel} no longer contains {old!r}: update engine_repo.py with the engine source")
        self.write(rel, text.replace(old, new))

    def commit(self, message: str) -> None:
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "--no-verify", "-m", message, date=EPOCH + self.commits * HOUR)
        self.commits += 1

    def branch_from_main(self, name: Optional[str]) -> None:
        """Check out a new branch at main (or a detached main when name is None)."""
        if name is None:
            git(self.work, "checkout", "-q", "--detach", "main")
        else:
            git(self.work, "checkout", "-q", "-b", name, "main")


def _populate(work: Path, source: Path) -> None:
    git(work, "init", "-q", "--template=")
    git(work, "symbolic-ref", "HEAD", "refs/heads/main")
    b = _Builder(work)
    files = source_files(source)
    for index, (message, _prefixes) in enumerate(MAIN_STAGES):
        for rel in files:
            if _stage_of(rel) == index:
                b.write(rel, (source / rel).read_text(encoding="utf-8"))
        b.commit(message)

    b.branch_from_main("release-0.2")
    b.write("NEWS.md", "# Fixture engine news\n\n## 0.2.0\n- First release of the fixture engine.\n")
    b.commit("Release 0.2.0")
    git(work, "tag", "-a", "v0.2.0", "-m", "Fixture engine 0.2.0", date=EPOCH + b.commits * HOUR)
    b.edit("NEWS.md", "- First release", "- Backport: serve docs.\n- First release")
    b.commit("release-0.2: backport serve docs")

    b.branch_from_main("dflash-fix")
    sliding = '_SLIDING_ATTENTION = "sliding_attention"\n'
    b.edit(QWEN3_DFLASH, sliding, "# dflash-fix: feature branch of the tests.\n" + sliding)
    b.commit("DFlash: note on the dflash-fix branch")

    b.branch_from_main(None)
    b.edit(EAGLE3_UTILS, "from typing import", "# Pull request 1 of the tests.\nfrom typing import")
    b.commit("PR #1: DFlash aux layers (a pull request head, on no branch)")
    git(work, "update-ref", "refs/pull/1/head", "HEAD")

    b.branch_from_main("fault/slow-build")
    b.write("csrc/fixture-faults.json", json.dumps({"slow_build_seconds": 600}) + "\n")
    b.commit("fault: the build compiles for 600 s")

    b.branch_from_main("fault/broken-ext")
    b.edit("csrc/ops.c", "FIXTURE_MODULE(", "static int fixture_broken(void) { return 1 }\n\nFIXTURE_MODULE(")
    b.commit("fault: vllm._C does not compile")

    b.branch_from_main("fault/missing-so")
    b.write("csrc/fixture-faults.json", json.dumps({"omit_extensions": ["vllm._moe_C"]}) + "\n")
    b.commit("fault: the build silently leaves out vllm._moe_C")

    b.branch_from_main("fault/crash-on-start")
    b.edit("vllm/_fixture_faults.py", "CRASH_ON_START = False", "CRASH_ON_START = True")
    b.commit("fault: vllm serve crashes right after it starts")

    b.branch_from_main("fault/acceptance-drop")
    b.edit("vllm/_fixture_faults.py", "ACCEPTANCE_LENGTH_DROP = 0.0", "ACCEPTANCE_LENGTH_DROP = 0.5")
    b.commit("fault: the mean acceptance length falls by 0.5 (e.g. 3.2 -> 2.7), nothing else changes")

    b.branch_from_main("fault/no-probe")
    b.overlay(source / FAULTS_DIR / "no-probe")
    b.remove(V2_DFLASH_SPECULATOR)
    b.commit("fault: the DFlash code of vLLM 0.20.1 (no aux-layer +1, no sliding windows, no DFlash on V2)")

    git(work, "checkout", "-q", "main")


def refs(repo: Path) -> Dict[str, str]:
    """ref -> full commit SHA (annotated tags peeled to their commit)."""
    out = git(repo, "for-each-ref", "--format=%(refname) %(objectname) %(*objectname)")
    result = {}
    for line in out.splitlines():
        parts = line.split()
        result[parts[0]] = parts[-1]
    return result


def create_engine_repo(dest: Path, bare: bool = False, source: Optional[Path] = None) -> Dict[str, str]:
    """Create the repository at `dest` (must not exist or be empty); returns refs(dest)."""
    dest = Path(dest)
    source = Path(source or DEFAULT_SOURCE)
    if not (source / "pyproject.toml").is_file():
        raise EngineRepoError(f"{source} is not the fixture engine's source: pass --source tests/fixtures/engine")
    if dest.exists() and any(dest.iterdir()):
        raise EngineRepoError(f"{dest} exists and is not empty: choose a new directory")
    dest.mkdir(parents=True, exist_ok=True)
    if not bare:
        _populate(dest, source)
        return refs(dest)
    with tempfile.TemporaryDirectory(prefix="engine-repo-") as tmp:
        work = Path(tmp)
        _populate(work, source)
        git(dest, "init", "-q", "--bare", "--template=")
        git(dest, "symbolic-ref", "HEAD", "refs/heads/main")
        git(work, "push", "-q", str(dest.resolve()), "refs/heads/*:refs/heads/*", "refs/tags/*:refs/tags/*",
            "refs/pull/*:refs/pull/*")  # fmt: skip
    return refs(dest)


def bump_branch(repo: Path, branch: str, message: str) -> str:
    """Add one commit (a line in NEWS.md) on `branch` of a bare or non-bare repository; returns its SHA.
    A checked-out branch gets its work tree updated too (refused if local changes are in the way)."""
    repo = Path(repo)
    ref = f"refs/heads/{branch}"
    parent = git(repo, "rev-parse", "--verify", "-q", ref + "^{commit}")
    parent_date = int(git(repo, "log", "-1", "--format=%ct", parent))
    tree_files = git(repo, "ls-tree", "--name-only", parent).splitlines()
    news = (
        git(repo, "cat-file", "blob", f"{parent}:NEWS.md") + "\n"
        if "NEWS.md" in tree_files
        else "# Fixture engine news\n"
    )
    blob = git(repo, "hash-object", "-w", "--stdin", stdin=f"{news}- {message}\n")
    with tempfile.TemporaryDirectory(prefix="engine-bump-") as tmp:
        # A private index: works the same in bare repositories and leaves a work tree alone.
        index = Path(tmp) / "index"
        git(repo, "read-tree", parent, index=index)
        git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},NEWS.md", index=index)
        tree = git(repo, "write-tree", index=index)
    commit = git(repo, "commit-tree", tree, "-p", parent, "-m", message, date=parent_date + HOUR)
    git(repo, "update-ref", ref, commit, parent)
    is_bare = git(repo, "rev-parse", "--is-bare-repository") == "true"
    if not is_bare and git(repo, "symbolic-ref", "-q", "HEAD") == ref:
        git(repo, "read-tree", "-m", "-u", parent, commit)
    return commit


def scm_version(repo: Path, ref: str = "HEAD", node_len: int = 9) -> str:
    """The version setuptools-scm (guess-next-dev) gives a clean build of `ref`. node_len: hex digits
    of the hash (9 with setuptools-scm >= 8, git's abbreviation (7 here) with Debian's 7.1)."""
    sha = git(repo, "rev-parse", "--verify", "-q", ref + "^{commit}")
    node = "g" + sha[:node_len]
    try:
        described = git(repo, "describe", "--tags", "--long", "--match", "*[0-9]*", sha)
    except EngineRepoError:
        return f"0.1.dev{git(repo, 'rev-list', '--count', sha)}+{node}"
    match = re.match(r"^v?(?P<tag>.+)-(?P<distance>\d+)-g[0-9a-f]+$", described)
    if not match:
        raise EngineRepoError(f"unexpected git describe output {described!r}")
    tag, distance = match.group("tag"), int(match.group("distance"))
    if distance == 0:
        return tag
    parts = tag.split(".")
    parts[-1] = str(int(parts[-1]) + 1)
    return f"{'.'.join(parts)}.dev{distance}+{node}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["bump"]:
            parser = argparse.ArgumentParser(prog="engine_repo.py bump", description="Add one commit to a branch.")
            parser.add_argument("repo", type=Path)
            parser.add_argument("branch")
            parser.add_argument("-m", "--message", default="Bump")
            ns = parser.parse_args(args[1:])
            bump_branch(ns.repo, ns.branch, ns.message)
            print(json.dumps(refs(ns.repo), indent=2, sort_keys=True))
        elif args[:1] == ["version"]:
            parser = argparse.ArgumentParser(prog="engine_repo.py version", description="Version a build gets.")
            parser.add_argument("repo", type=Path)
            parser.add_argument("ref", nargs="?", default="HEAD")
            parser.add_argument("--node-len", type=int, default=9)
            ns = parser.parse_args(args[1:])
            print(scm_version(ns.repo, ns.ref, ns.node_len))
        else:
            parser = argparse.ArgumentParser(
                prog="engine_repo.py",
                description="Create the fixture engine's git repository (TEST EQUIPMENT). "
                "Other commands: `bump REPO BRANCH [-m MSG]`, `version REPO [REF]`.",
            )
            parser.add_argument("dest", type=Path)
            parser.add_argument("--bare", action="store_true", help="create a bare repository (a 'remote')")
            parser.add_argument("--source", type=Path, default=None, help=f"engine source (default {DEFAULT_SOURCE})")
            ns = parser.parse_args(args)
            print(json.dumps(create_engine_repo(ns.dest, ns.bare, ns.source), indent=2, sort_keys=True))
    except EngineRepoError as e:
        print(f"engine_repo.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
