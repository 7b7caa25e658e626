"""The precompiled decision against real git repositories (no build: decisions and their reasons)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import write_json_atomic
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import (
    BaseWheel,
    PrecompiledError,
    compile_inputs,
    compiled_changes,
    decide,
    local_base_wheels,
    parse_base,
)
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import commit_files, git

INPUTS = {"python": "/usr/bin/python3", "python_version": "3.11.2", "build_env": {}, "torch": None}
# branch -> (files written on top of main, whether a compiled source changed)
BRANCHES = {
    "py-only": ({"vllm/model.py": "x = 2\n", "docs/a.md": "doc\n"}, False),
    "csrc": ({"csrc/ops.cu": "// changed\n"}, True),
    "cmake-dir": ({"cmake/utils.cmake": "# changed\n"}, True),
    "cmakelists": ({"CMakeLists.txt": "project(x2)\n"}, True),
    "nested-cmakelists": ({"tools/ext/CMakeLists.txt": "project(y)\n"}, True),
    "setup": ({"setup.py": "# changed\n"}, True),
    "requirements": ({"requirements/cuda.txt": "torch==2.9.1\n"}, True),
    "lookalike": ({"csrc_notes.md": "not csrc\n", "docs/setup.py.md": "no\n", "my-cmake/x": "no\n"}, False),
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """main: base -> main2 (main moved on after the branches forked); one branch per row of BRANCHES."""
    path = tmp_path_factory.mktemp("precompiled") / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    files = {"vllm/model.py": "x = 1\n", "csrc/ops.cu": "// ops\n", "CMakeLists.txt": "project(x)\n"}
    files.update({"setup.py": "# setup\n", "requirements/cuda.txt": "torch==2.9.0\n", "cmake/utils.cmake": "#\n"})
    shas = {"base": commit_files(path, "base", files)}
    for branch, (changes, _compiled) in BRANCHES.items():
        git(path, "checkout", "-q", "-b", branch, shas["base"])
        shas[branch] = commit_files(path, branch, changes)
    git(path, "checkout", "-q", "-b", "renamed", shas["base"])
    git(path, "mv", "csrc/ops.cu", "vllm/ops_source.txt")
    git(path, "commit", "-q", "-m", "move a compiled source out of csrc/")
    shas["renamed"] = git(path, "rev-parse", "HEAD")
    git(path, "checkout", "-q", "main")
    shas["main2"] = commit_files(path, "main moves on", {"csrc/ops.cu": "// main changed the kernels\n"})
    git(path, "checkout", "-q", "--orphan", "unrelated")
    shas["unrelated"] = commit_files(path, "unrelated history", {"README": "other\n"})
    git(path, "checkout", "-q", "main")
    return path / ".git", shas


@pytest.mark.parametrize("branch", list(BRANCHES))
def test_auto_full_build_exactly_when_a_compiled_source_changed(repo, tmp_path, branch):
    mirror, shas = repo
    wheel = tmp_path / "vllm-base.whl"
    wheel.write_bytes(b"wheel")
    decision = decide("auto", str(wheel), shas[branch], str(mirror), shas["main2"], "main")
    compiled = BRANCHES[branch][1]
    assert decision.use is not compiled
    assert decision.merge_base == shas["base"]  # not main's tip: main moved on after the fork
    assert decision.changed_files == len(BRANCHES[branch][0])
    assert f"since merge-base {shas['base'][:12]} with main" in decision.reason
    if compiled:
        assert decision.env() == {}
        assert decision.reason.endswith(": full build")
        assert decision.compiled_changed and decision.compiled_changed[0] in decision.reason
    else:
        assert decision.env() == {"VLLM_USE_PRECOMPILED": "1", "VLLM_PRECOMPILED_WHEEL_LOCATION": str(wheel)}
        assert "none under csrc/ cmake/ CMakeLists.txt setup.py requirements/: precompiled" in decision.reason


def test_a_rename_out_of_csrc_counts_as_a_compiled_change(repo):
    mirror, shas = repo
    decision = decide("auto", "https://wheels.example/base.whl", shas["renamed"], str(mirror), shas["main2"], "main")
    assert decision.use is False and decision.compiled_changed == ["csrc/ops.cu"]


def test_the_ref_on_main_itself_has_no_changes(repo):
    mirror, shas = repo
    decision = decide("auto", "https://wheels.example/w.whl", shas["main2"], str(mirror), shas["main2"], "main")
    assert (decision.use, decision.changed_files, decision.merge_base) == (True, 0, shas["main2"])
    assert decision.reason.startswith("0 files changed since merge-base")


def test_unrelated_history_builds_in_full(repo):
    mirror, shas = repo
    decision = decide("auto", "https://w/x.whl", shas["unrelated"], str(mirror), shas["main2"], "up#main")
    assert decision.use is False and "shares no history with up#main" in decision.reason


def test_auto_without_a_base_wheel_builds_in_full(repo):
    mirror, shas = repo
    decision = decide("auto", None, shas["py-only"], str(mirror), shas["main2"], "main", candidates=[])
    assert decision.use is False
    assert "none under csrc/" in decision.reason and "but no base wheel" in decision.reason


def _wheel(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.whl"
    path.write_bytes(name.encode())
    return str(path)


def test_auto_borrows_a_local_wheel_with_the_same_compiled_sources(repo, tmp_path):
    mirror, shas = repo
    candidates = [
        BaseWheel("newest-csrc-differs", shas["csrc"], _wheel(tmp_path, "a"), "2026-01-03T00:00:00Z"),
        BaseWheel("older-same", shas["lookalike"], _wheel(tmp_path, "b"), "2026-01-02T00:00:00Z"),
        BaseWheel("unknown-commit", "f" * 40, _wheel(tmp_path, "c"), "2026-01-04T00:00:00Z"),
    ]
    decision = decide("auto", None, shas["py-only"], str(mirror), shas["main2"], "main", candidates)
    assert (decision.use, decision.base_release) == (True, "older-same")
    assert decision.env()["VLLM_PRECOMPILED_WHEEL_LOCATION"] == candidates[1].path
    assert "precompiled from the wheel of release older-same" in decision.reason
    # The merge-base's own wheel wins over newer ones.
    merge_base = BaseWheel("merge-base", shas["base"], _wheel(tmp_path, "d"), "2025-01-01T00:00:00Z")
    decision = decide("auto", None, shas["py-only"], str(mirror), shas["main2"], "main", [*candidates, merge_base])
    assert decision.base_release == "merge-base"


def test_never_and_always_need_no_repository(tmp_path):
    never = decide("never", _wheel(tmp_path, "w"))
    assert (never.use, never.env(), never.reason) == (False, {}, "precompiled: never: full build")
    always = decide("always")
    assert always.env() == {"VLLM_USE_PRECOMPILED": "1"}
    assert "vLLM looks up the base wheel itself" in always.reason
    given = decide("always", "https://u:tok@wheels.example/v.whl")
    assert given.env()["VLLM_PRECOMPILED_WHEEL_LOCATION"] == "https://u:tok@wheels.example/v.whl"
    assert "tok" not in given.reason and "tok" not in json.dumps(given.details())


def test_the_wheel_location_can_name_the_merge_base(repo):
    mirror, shas = repo
    template = "https://wheels.vllm.ai/{merge_base}/vllm-1.0.0.dev-cp38-abi3-manylinux1_x86_64.whl"
    decision = decide("always", template, shas["csrc"], str(mirror), shas["main2"], "main")
    assert decision.wheel_location == template.replace("{merge_base}", shas["base"])


def test_bad_options_name_the_fix(tmp_path):
    with pytest.raises(PrecompiledError, match="not a file on this host"):
        decide("always", str(tmp_path / "missing.whl"))
    with pytest.raises(PrecompiledError, match="not one of auto, always, never"):
        decide("sometimes")


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("main", (None, "main")),
        ("refs/heads/release", (None, "refs/heads/release")),
        ("https://github.com/vllm-project/vllm.git#main", ("https://github.com/vllm-project/vllm.git", "main")),
        ("/srv/upstream.git#v0.26.0", ("/srv/upstream.git", "v0.26.0")),
    ],
)
def test_parse_base(spec, parsed):
    assert parse_base(spec) == parsed


@pytest.mark.parametrize("spec", ["", "https://x/y.git#", "#main"])
def test_parse_base_refuses_half_specs(spec):
    with pytest.raises(PrecompiledError, match="is not a ref or `<url>#<ref>`"):
        parse_base(spec)


def test_compiled_changes_matches_whole_path_components():
    paths = ["csrc/a.cu", "csrcx/a", "cmake/x", "CMakeLists.txt", "a/CMakeLists.txt", "setup.py", "x/setup.py"]
    paths += ["requirements/common.txt", "requirements.txt", "vllm/x.py"]
    expected = ["csrc/a.cu", "cmake/x", "CMakeLists.txt", "a/CMakeLists.txt", "setup.py", "requirements/common.txt"]
    assert compiled_changes(paths) == expected


def _release(root: Path, name: str, commit: str, inputs: dict, built_at: str, **extra) -> str:
    wheel = root / "wheels" / name / "vllm-1-cp38-abi3-linux_x86_64.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"w")
    manifest = {"commit": commit, "inputs": inputs, "built_at": built_at, "wheel": {"path": str(wheel)}, **extra}
    write_json_atomic(str(root / "releases" / name / "manifest.json"), manifest)
    return str(wheel)


def test_local_base_wheels_only_trusted_releases_of_the_same_compile_inputs(tmp_path):
    root = tmp_path
    full = dict(INPUTS, precompiled=False)
    _release(root, "old-full", "a" * 40, full, "2026-01-01T00:00:00Z")
    _release(root, "new-auto", "b" * 40, dict(INPUTS, precompiled=True), "2026-01-02T00:00:00Z",
             precompiled=True, precompiled_details={"mode": "auto"})  # fmt: skip
    _release(root, "forced", "c" * 40, dict(INPUTS, precompiled=True), "2026-01-03T00:00:00Z",
             precompiled=True, precompiled_details={"mode": "always"})  # fmt: skip
    _release(root, "other-torch", "d" * 40, dict(INPUTS, torch="2.8.0"), "2026-01-04T00:00:00Z")
    gone = _release(root, "wheel-gone", "e" * 40, full, "2026-01-05T00:00:00Z")
    os.unlink(gone)
    (root / "releases" / "corrupt").mkdir()
    (root / "releases" / "corrupt" / "manifest.json").write_text("{not json")
    (root / "releases" / "half-built").mkdir()
    found = local_base_wheels(str(root), dict(INPUTS, precompiled=True))
    assert [base.release for base in found] == ["new-auto", "old-full"]
    assert compile_inputs(dict(INPUTS, precompiled=True)) == INPUTS
    assert local_base_wheels(str(tmp_path / "nothing"), INPUTS) == []
