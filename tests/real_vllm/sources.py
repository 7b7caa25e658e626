"""Real vLLM inputs for the lane: the sdist and the release wheel from PyPI, and a fork repo made from the sdist.

The sdist is fetched with pip's own index client (pip >= 23 internals, as ../shared/tools/vllm_sdist.py
does): `pip download --no-binary :all: vllm==X` would prepare metadata first, which for vLLM means
installing torch into an isolated build env. Run with a python whose pip is importable (the test venv).

The repo: one commit of the sdist's tree (git's view of it: .gitignore'd files such as vllm/_version.py and
the egg-info left out) tagged `v<version>` on `main`, and fork branches on top that each change ONE thing.
Commits have fixed authors and dates, so the same sdist gives the same SHAs on every machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

GIT_ENV = {
    "GIT_AUTHOR_NAME": "real-vllm lane",
    "GIT_AUTHOR_EMAIL": "lane@vllm-ops.invalid",
    "GIT_COMMITTER_NAME": "real-vllm lane",
    "GIT_COMMITTER_EMAIL": "lane@vllm-ops.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}
EPOCH = 1764547200  # 2025-12-01T00:00:00Z: commit dates, one second apart


class Fork(NamedTuple):
    """A fork branch: `path` edited on top of `parent`; `precompiled` is the right answer of `auto`."""

    branch: str
    parent: str
    path: str
    what: str
    precompiled: bool
    base: str = "main"  # precompiled_base the decision is asked with


# One compiled path each (vLLM's setup.py: csrc/, cmake/, CMakeLists.txt, setup.py, requirements/,
# pyproject.toml, vllm/_custom_ops.py; rust/ for the rust frontend), plus python-only controls.
FORKS: List[Fork] = [
    Fork("fork/python", "main", "vllm/model_executor/models/qwen3_dflash.py", "one python file (DFlash)", True),
    Fork("fork/docs", "main", "docs/README.md", "docs only", True),
    Fork("fork/csrc", "main", "csrc/custom_quickreduce.cu", "a csrc/*.cu file", False),
    Fork("fork/pyproject", "main", "pyproject.toml", "pyproject.toml (the torch build pin)", False),
    Fork("fork/custom-ops", "main", "vllm/_custom_ops.py", "vllm/_custom_ops.py", False),
    Fork("fork/rust", "main", "rust/src/parser/benches/kimi_k2.rs", "a file under rust/", False),
    Fork("fork/cmake", "main", "cmake/utils.cmake", "a cmake/ file", False),
    Fork("fork/cmakelists", "main", "CMakeLists.txt", "CMakeLists.txt", False),
    Fork("fork/requirements", "main", "requirements/common.txt", "requirements/common.txt", False),
    Fork("fork/setup-py", "main", "setup.py", "setup.py", False),
    # The stale base: upstream moved csrc/ after the release the wheel was built from.
    Fork("upstream-next", "main", "csrc/custom_quickreduce.cu", "upstream: a csrc/ change after v0.26.0", False),
    Fork(
        "fork/stale-base",
        "upstream-next",
        "vllm/model_executor/models/qwen3_dflash.py",
        "python-only, on upstream-next (csrc/ changed after the wheel's commit)",
        False,
        base="upstream-next",
    ),
]
BUMP_FILE = "vllm/model_executor/models/qwen3_dflash.py"


def fetch_sdist(name: str, version: str, dest: str) -> str:
    """The path of `<name>-<version>.tar.gz` in `dest`, downloaded from the index unless already there."""
    for candidate in (f"{name}-{version}.tar.gz", f"{name.replace('-', '_')}-{version}.tar.gz"):
        if os.path.isfile(os.path.join(dest, candidate)):
            return os.path.join(dest, candidate)
    from pip._internal.index.collector import LinkCollector
    from pip._internal.index.package_finder import PackageFinder
    from pip._internal.models.index import PyPI
    from pip._internal.models.search_scope import SearchScope
    from pip._internal.models.selection_prefs import SelectionPreferences
    from pip._internal.network.session import PipSession

    session = PipSession()
    index = os.environ.get("PIP_INDEX_URL", PyPI.simple_url)
    scope = SearchScope.create(find_links=[], index_urls=[index], no_index=False)
    finder = PackageFinder.create(
        link_collector=LinkCollector(session=session, search_scope=scope),
        selection_prefs=SelectionPreferences(allow_yanked=False),
    )
    for found in finder.find_all_candidates(name):
        if str(found.version) == version and found.link.filename.endswith(".tar.gz"):
            os.makedirs(dest, exist_ok=True)
            path = os.path.join(dest, found.link.filename)
            response = session.get(found.link.url, stream=True)
            response.raise_for_status()
            with open(path + ".part", "wb") as out:
                for chunk in response.iter_content(1 << 20):
                    out.write(chunk)
            os.replace(path + ".part", path)
            return path
    raise SystemExit(f"no sdist of {name}=={version} on {index}. Fix: check the version, or set PIP_INDEX_URL")


def fetch_wheel(python: str, name: str, version: str, dest: str) -> str:
    """The release wheel from the index (`pip download --no-deps --only-binary :all:`), unless already there."""
    prefix = f"{name}-{version}-"
    found = (
        sorted(f for f in os.listdir(dest) if f.startswith(prefix) and f.endswith(".whl"))
        if os.path.isdir(dest)
        else []
    )
    if not found:
        subprocess.run(
            [
                python,
                "-m",
                "pip",
                "download",
                "-q",
                f"{name}=={version}",
                "--no-deps",
                "--only-binary",
                ":all:",
                "-d",
                dest,
            ],
            check=True,
        )
        found = sorted(f for f in os.listdir(dest) if f.startswith(prefix) and f.endswith(".whl"))
    if len(found) != 1:
        raise SystemExit(f"expected one {prefix}*.whl in {dest}, found {found}. Fix: keep one")
    return os.path.join(dest, found[0])


def _git(repo: str, *args: str, date: Optional[int] = None) -> str:
    env = dict(os.environ, **GIT_ENV)
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"@{date} +0000"
    return subprocess.run(
        ["git", "-C", repo, *args], check=True, env=env, capture_output=True, text=True
    ).stdout.strip()


def _edit(work: str, path: str, line: str) -> None:
    target = Path(work, path)
    if not target.is_file():
        raise SystemExit(f"{path} is not in this sdist. Fix: pick another file in tests/real_vllm/sources.py FORKS")
    comment = "//" if target.suffix in (".cu", ".rs", ".h", ".cpp") else "#"
    if path == "pyproject.toml":  # the torch build pin, as a fork moving to another torch would
        text = target.read_text(encoding="utf-8")
        if '"torch == ' not in text:
            raise SystemExit("pyproject.toml has no torch pin to change. Fix: update FORKS")
        target.write_text(text.replace('"torch == ', '"torch >= ', 1), encoding="utf-8")
        return
    if target.suffix == ".md":
        comment = ""
    with target.open("a", encoding="utf-8") as handle:
        handle.write(f"\n{comment} {line}\n".replace("\n ", "\n"))


def _owned(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
    return tarfile.data_filter(member, path).replace(uid=os.getuid(), gid=os.getgid(), uname="", gname="")


def make_repo(sdist: str, dest: str, version: str) -> Dict[str, str]:
    """A git repo at `dest` from the sdist (re-made from scratch); returns branch/tag -> commit."""
    shutil.rmtree(dest, ignore_errors=True)
    work = dest + ".unpack"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/", 1)[0]
        # Owned by whoever runs the lane: git refuses a repository owned by another user ("dubious ownership").
        archive.extractall(work, filter=_owned)
    os.rename(os.path.join(work, top), dest)
    shutil.rmtree(work)
    for generated in ("PKG-INFO",):  # sdist-only files a checkout of the repository does not have
        with_path = os.path.join(dest, generated)
        if os.path.exists(with_path):
            os.unlink(with_path)
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")  # honours vLLM's .gitignore: vllm/_version.py, *.egg-info stay out
    date = EPOCH
    _git(dest, "commit", "-q", "-m", f"vLLM {version} (from the PyPI sdist)", date=date)
    _git(dest, "tag", "-a", f"v{version}", "-m", f"v{version}", date=date)
    for fork in FORKS:
        date += 1
        _git(dest, "checkout", "-q", "-b", fork.branch, fork.parent)
        _edit(dest, fork.path, f"vllm_ops real-vllm lane: {fork.branch}")
        _git(dest, "commit", "-q", "-am", f"{fork.branch}: {fork.what}", date=date)
    _git(dest, "checkout", "-q", "main")
    return commits(dest)


def commits(repo: str) -> Dict[str, str]:
    out = _git(
        repo, "for-each-ref", "--format=%(refname:short) %(objectname) %(*objectname)", "refs/heads", "refs/tags"
    )
    result = {}
    for line in out.splitlines():
        name, sha, *peeled = line.split()
        result[name] = peeled[0] if peeled else sha
    return result


def bump(repo: str, branch: str, parent: str, n: int) -> str:
    """A new python-only commit `branch` on `parent` (the bench's bump); returns its SHA."""
    _git(repo, "checkout", "-q", "-B", branch, parent)
    _edit(repo, BUMP_FILE, f"vllm_ops bench bump {n}")
    _git(repo, "commit", "-q", "-am", f"{branch}: python-only bump {n}", date=EPOCH + 1000 + n)
    _git(repo, "checkout", "-q", "main")
    return _git(repo, "rev-parse", branch)
