"""The real-vLLM lane's fork repo, made from a stand-in sdist: one thing changed per branch, stable SHAs."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "real_vllm"))
import sources


def _sdist(tmp_path: Path) -> Path:
    """A tarball shaped like vLLM's sdist: every path a fork branch edits, plus sdist-only and ignored files."""
    top = tmp_path / "vllm-0.26.0"
    files = {fork.path: "x = 1\n" for fork in sources.FORKS}
    files["pyproject.toml"] = '[build-system]\nrequires = [\n    "torch == 2.11.0",\n]\n'
    files["PKG-INFO"] = "Metadata-Version: 2.1\n"
    files["vllm/_version.py"] = "__version__ = '0.26.0'\n"  # generated; .gitignore'd upstream
    files[".gitignore"] = "/vllm/_version.py\n*.egg-info/\n"
    files["vllm.egg-info/PKG-INFO"] = "x\n"
    for name, text in files.items():
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(text)
    path = tmp_path / "vllm-0.26.0.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        archive.add(top, arcname="vllm-0.26.0")
    return path


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_each_fork_branch_changes_one_file_on_its_parent(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commits = sources.make_repo(str(_sdist(tmp_path)), str(repo), "0.26.0")
    assert commits["v0.26.0"] == commits["main"]
    tracked = _git(repo, "ls-files", "--", "vllm/_version.py", "vllm.egg-info", "PKG-INFO")
    assert tracked == ""  # a checkout of the repository has none of them
    for fork in sources.FORKS:
        parent = _git(repo, "rev-parse", f"{fork.branch}^")
        assert parent == commits[fork.parent], fork.branch
        assert _git(repo, "diff", "--name-only", parent, fork.branch).splitlines() == [fork.path]
    pin = _git(repo, "diff", "main", "fork/pyproject", "--", "pyproject.toml")
    assert '-    "torch == 2.11.0",' in pin and '+    "torch >= 2.11.0",' in pin
    # the stale base: the wheel's commit (the tag) lacks the csrc/ change the fork's line has
    assert _git(repo, "diff", "--name-only", "v0.26.0", "fork/stale-base").splitlines() == sorted(
        ["csrc/custom_quickreduce.cu", "vllm/model_executor/models/qwen3_dflash.py"]
    )


def test_the_same_sdist_gives_the_same_commits(tmp_path: Path) -> None:
    sdist = str(_sdist(tmp_path))
    first = sources.make_repo(sdist, str(tmp_path / "a"), "0.26.0")
    assert sources.make_repo(sdist, str(tmp_path / "b"), "0.26.0") == first
    bump = sources.bump(str(tmp_path / "a"), "bench/bump-1", "main", 1)
    assert _git(tmp_path / "a", "diff", "--name-only", "main", bump) == sources.BUMP_FILE


def test_a_missing_path_names_the_fix(tmp_path: Path) -> None:
    sdist = _sdist(tmp_path)
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if not m.name.endswith("setup.py")]
        archive.extractall(tmp_path / "x", members=members, filter="data")
    smaller = tmp_path / "smaller.tar.gz"
    with tarfile.open(smaller, "w:gz") as archive:
        archive.add(tmp_path / "x" / "vllm-0.26.0", arcname="vllm-0.26.0")
    with pytest.raises(SystemExit, match=r"setup\.py is not in this sdist\. Fix:"):
        sources.make_repo(str(smaller), str(tmp_path / "repo"), "0.26.0")
