"""The precompiled decision against real git repositories (no build: decisions and their reasons)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_decision import wheel_decision
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import BuildOptions
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import write_json_atomic
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import (
    BaseWheel,
    compile_inputs,
    compiled_changes,
    decide,
    local_base_wheels,
    needs_git,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled_data import (
    COMPILED_PATHS,
    PRECOMPILED_ENV,
    PrecompiledError,
    parse_base,
)
from ansible_collections.vllm_ops.dflash.tests.helpers.fake_wheel import make_wheel
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import commit_files, git

INPUTS = {"python": "/usr/bin/python3", "python_version": "3.11.2", "build_env": {}, "torch": None}
HOST = {"python_version": "3.11.2", "machine": "x86_64"}  # the build python and the host the wheel must fit
BASE_FILES = {
    "vllm/model.py": "x = 1\n",
    "csrc/ops.cu": "// ops\n",
    "CMakeLists.txt": "project(x)\n",
    "setup.py": "# setup\n",
    "requirements/cuda.txt": "torch==2.9.0\n",
    "cmake/utils.cmake": "#\n",
    "pyproject.toml": '[build-system]\nrequires = ["torch==2.9.0"]\n',
    "vllm/_custom_ops.py": "def add(): ...\n",
    "rust/src/lib.rs": "// frontend\n",
    "vllm/vllm_flash_attn/flash_attn_interface.py": "# source-controlled\n",
    "vllm/third_party/flashmla/__init__.py": "# replaced by the wheel's copy\n",
}
# branch -> (files written on top of the base wheel's commit, whether a compiled source changed)
BRANCHES = {
    "py-only": ({"vllm/model.py": "x = 2\n", "docs/a.md": "doc\n"}, False),
    "csrc": ({"csrc/ops.cu": "// changed\n"}, True),
    "cmake-dir": ({"cmake/utils.cmake": "# changed\n"}, True),
    "cmakelists": ({"CMakeLists.txt": "project(x2)\n"}, True),
    "nested-cmakelists": ({"tools/ext/CMakeLists.txt": "project(y)\n"}, True),
    "setup": ({"setup.py": "# changed\n"}, True),
    "requirements": ({"requirements/cuda.txt": "torch==2.9.1\n"}, True),
    "pyproject": ({"pyproject.toml": '[build-system]\nrequires = ["torch==2.10.0"]\n'}, True),
    "custom-ops": ({"vllm/_custom_ops.py": "def add(): return 1\n"}, True),
    "rust": ({"rust/src/lib.rs": "// changed frontend\n"}, True),
    "rust-toolchain": ({"rust-toolchain.toml": "[toolchain]\nchannel = '1.90'\n"}, True),
    "build-rust": ({"tools/build_rust.py": "# changed\n"}, True),
    "flashmla-py": ({"vllm/third_party/flashmla/__init__.py": "# hidden by the wheel's copy\n"}, True),
    "flash-attn-kernel-py": ({"vllm/vllm_flash_attn/ops/triton.py": "# extracted from the wheel\n"}, True),
    "flash-attn-interface": ({"vllm/vllm_flash_attn/flash_attn_interface.py": "# not replaced\n"}, False),
    "lookalike": (
        {"csrc_notes.md": "no\n", "docs/setup.py.md": "no\n", "my-cmake/x": "no\n", "docs/rust/x.md": "no\n"},
        False,
    ),
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """base (tag v0.26.0, the base wheel's commit) -> main2 on main (main moved on after the branches
    forked); one branch per row of BRANCHES on base; `stale`: base -> a csrc/ change (the line a fork
    follows), and `stale-pr`: a Python-only change on top of it."""
    path = tmp_path_factory.mktemp("precompiled") / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    shas = {"base": commit_files(path, "base", BASE_FILES)}
    git(path, "tag", "-a", "v0.26.0", "-m", "release 0.26.0")
    for branch, (changes, _compiled) in BRANCHES.items():
        git(path, "checkout", "-q", "-b", branch, shas["base"])
        shas[branch] = commit_files(path, branch, changes)
    git(path, "checkout", "-q", "-b", "renamed", shas["base"])
    git(path, "mv", "csrc/ops.cu", "vllm/ops_source.txt")
    git(path, "commit", "-q", "-m", "move a compiled source out of csrc/")
    shas["renamed"] = git(path, "rev-parse", "HEAD")
    git(path, "checkout", "-q", "-b", "stale", shas["base"])
    shas["stale"] = commit_files(path, "the line changes its kernels", {"csrc/ops.cu": "// the line's kernels\n"})
    git(path, "checkout", "-q", "-b", "stale-pr")
    shas["stale-pr"] = commit_files(path, "python-only on the line", {"vllm/model.py": "x = 'pr'\n"})
    git(path, "checkout", "-q", "main")
    shas["main2"] = commit_files(path, "main moves on", {"csrc/ops.cu": "// main changed the kernels\n"})
    git(path, "checkout", "-q", "--orphan", "unrelated")
    shas["unrelated"] = commit_files(path, "unrelated history", {"README": "other\n"})
    git(path, "checkout", "-q", "main")
    return path / ".git", shas


@pytest.fixture
def release_wheel(repo, tmp_path):
    """The 0.26.0 release wheel, as PyPI has it: its _version.py names the tagged commit."""
    return str(make_wheel(tmp_path, "0.26.0", commit_id="g" + repo[1]["base"][:9]))


def auto(wheel, commit, mirror, base_commit, label="main", **kwargs):
    return decide("auto", wheel, commit, str(mirror), base_commit, label, **dict(HOST, **kwargs))


@pytest.mark.parametrize("branch", list(BRANCHES))
def test_auto_full_build_exactly_when_a_compiled_path_changed_since_the_wheels_commit(repo, release_wheel, branch):
    mirror, shas = repo
    decision = auto(release_wheel, shas[branch], mirror, shas["main2"])
    compiled = BRANCHES[branch][1]
    assert decision.use is not compiled
    assert (decision.wheel_commit, decision.commit) == (shas["base"], shas[branch])
    assert decision.merge_base == shas["base"]  # not main's tip: main moved on after the fork
    assert decision.changed_files == len(BRANCHES[branch][0])
    assert f"since the base wheel's commit {shas['base'][:12]} (vllm/_version.py of " in decision.reason
    details = decision.details()
    assert (details["wheel_commit"], details["commit"]) == (shas["base"], shas[branch])
    if compiled:
        assert decision.env() == {}
        assert decision.reason.endswith(": full build")
        assert decision.compiled_changed == sorted(BRANCHES[branch][0])
        assert details["compiled_changed"] == decision.compiled_changed
        assert decision.compiled_changed[0] in decision.reason
    else:
        assert decision.env() == {"VLLM_USE_PRECOMPILED": "1", "VLLM_PRECOMPILED_WHEEL_LOCATION": release_wheel}
        assert "none under vLLM's compiled paths: precompiled (base wheel " in decision.reason


def test_a_stale_base_wheel_is_never_used_for_a_python_only_ref(repo, release_wheel):
    """The line the fork follows changed csrc/ after the wheel was built: 0 files differ from the merge-base
    with that line, but the wheel's libraries are of the older csrc/."""
    mirror, shas = repo
    decision = auto(release_wheel, shas["stale-pr"], mirror, shas["stale"], "stale")
    assert decision.merge_base == shas["stale"]
    assert decision.use is False and decision.env() == {}
    assert decision.compiled_changed == ["csrc/ops.cu"]
    assert decision.reason == (
        f"2 files changed since the base wheel's commit {shas['base'][:12]} (vllm/_version.py of "
        f"{os.path.basename(release_wheel)}), 1 under vLLM's compiled paths (csrc/ops.cu): full build"
    )
    details = decision.details()
    assert details["wheel_commit"] == shas["base"] and details["merge_base"] == shas["stale"]
    assert details["compiled_changed"] == ["csrc/ops.cu"]


def test_the_wheels_commit_from_the_release_tag_or_the_local_version(repo, tmp_path):
    mirror, shas = repo
    release = str(make_wheel(tmp_path / "tag", "0.26.0", commit_id=None))  # setuptools-scm < 8: no commit id
    decision = auto(release, shas["py-only"], mirror, shas["main2"])
    assert (decision.use, decision.wheel_commit) == (True, shas["base"])
    assert f"(tag v0.26.0, of the wheel's version {os.path.basename(release)})" in decision.reason
    dev = str(make_wheel(tmp_path / "dev", f"0.26.1.dev1+g{shas['stale'][:9]}", commit_id=None))
    decision = auto(dev, shas["stale-pr"], mirror, shas["stale"], "stale")
    assert (decision.use, decision.wheel_commit, decision.changed_files) == (True, shas["stale"], 1)
    assert f"(the version's +g{shas['stale'][:9]} of {os.path.basename(dev)})" in decision.reason
    url = "https://wheels.example/vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl"  # a URL: its name only
    assert auto(url, shas["csrc"], mirror, shas["main2"]).wheel_commit == shas["base"]


def test_a_release_wheel_of_a_repository_made_from_the_sdist_takes_the_release_tag(repo, tmp_path):
    """PyPI's 0.26.0 wheel names upstream's commit; a repo made from the sdist has v0.26.0 under another SHA."""
    mirror, shas = repo
    upstream = str(make_wheel(tmp_path / "pypi", "0.26.0", commit_id="gffd46bfab"))
    decision = auto(upstream, shas["py-only"], mirror, shas["main2"])
    assert (decision.use, decision.wheel_commit) == (True, shas["base"])
    assert "tag v0.26.0 (the release of " in decision.reason and "ffd46bfab is not in the repository" in decision.reason
    decision = auto(upstream, shas["csrc"], mirror, shas["main2"])  # the tag's csrc/ is still compared
    assert decision.use is False and "csrc/" in decision.reason


def test_a_wheel_whose_commit_the_repository_lacks_builds_in_full(repo, tmp_path):
    mirror, shas = repo
    unknown = str(make_wheel(tmp_path / "u", "0.1.dev9+gabcdef012", commit_id="gabcdef012"))
    decision = auto(unknown, shas["py-only"], mirror, shas["main2"])
    assert decision.use is False and decision.wheel_commit is None
    assert "the base wheel's commit abcdef012 (vllm/_version.py of " in decision.reason
    assert "is not in the repository (precompiled_wheel_commit can name the commit" in decision.reason
    assert decision.reason.endswith(": full build")
    untagged = str(make_wheel(tmp_path / "t", "0.25.0", commit_id=None))
    decision = auto(untagged, shas["py-only"], mirror, shas["main2"])
    assert decision.use is False and "tag v0.25.0" in decision.reason and "not in the repository" in decision.reason
    forced = str(make_wheel(tmp_path / "p", f"0.26.1.dev1+g{shas['py-only'][:9]}.precompiled", commit_id=None))
    decision = auto(forced, shas["py-only"], mirror, shas["main2"])
    assert decision.use is False and "precompiled_wheel_commit" in decision.reason  # its libraries are older


def test_precompiled_wheel_commit_names_the_wheels_commit(repo, tmp_path):
    mirror, shas = repo
    anonymous = str(make_wheel(tmp_path, "1.0", commit_id=None, name="vllm-1.0-cp38-abi3-linux_x86_64.whl"))
    decision = auto(anonymous, shas["stale-pr"], mirror, shas["stale"], "stale", wheel_commit=shas["stale"][:10])
    assert (decision.use, decision.wheel_commit, decision.wheel_commit_source) == (
        True, shas["stale"], "precompiled_wheel_commit")  # fmt: skip
    decision = auto(anonymous, shas["stale-pr"], mirror, shas["stale"], "stale", wheel_commit="v0.26.0")
    assert (decision.use, decision.compiled_changed) == (False, ["csrc/ops.cu"])
    with pytest.raises(PrecompiledError, match=r"precompiled_wheel_commit 'f{12}' is not a commit of the repo.*Fix:"):
        auto(anonymous, shas["py-only"], mirror, shas["main2"], wheel_commit="f" * 12)


def test_the_ref_on_the_wheels_commit_has_no_changes(repo, release_wheel):
    mirror, shas = repo
    decision = auto(release_wheel, shas["base"], mirror, shas["main2"])
    assert (decision.use, decision.changed_files, decision.wheel_commit) == (True, 0, shas["base"])
    assert decision.reason.startswith(f"0 files changed since the base wheel's commit {shas['base'][:12]}")


def test_unrelated_history_builds_in_full(repo, release_wheel):
    mirror, shas = repo
    decision = auto(release_wheel, shas["unrelated"], mirror, shas["main2"], "up#main")
    assert decision.use is False and decision.merge_base is None
    assert decision.reason.endswith(": full build")


def test_auto_without_a_base_wheel_builds_in_full(repo):
    mirror, shas = repo
    decision = auto(None, shas["py-only"], mirror, shas["main2"], candidates=[])
    assert decision.use is False
    assert "none under vLLM's compiled paths" in decision.reason and "but no base wheel" in decision.reason


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
    decision = auto(None, shas["py-only"], mirror, shas["main2"], candidates=candidates)
    assert (decision.use, decision.base_release, decision.wheel_commit) == (True, "older-same", shas["lookalike"])
    assert decision.env()["VLLM_PRECOMPILED_WHEEL_LOCATION"] == candidates[1].path
    assert decision.reason == (
        f"6 files changed since the base wheel's commit {shas['lookalike'][:12]} (the manifest of release "
        "older-same), none under vLLM's compiled paths: precompiled from the wheel of release older-same "
        "(same compiled sources)"
    )
    # The merge-base's own wheel wins over newer ones.
    merge_base = BaseWheel("merge-base", shas["base"], _wheel(tmp_path, "d"), "2025-01-01T00:00:00Z")
    decision = auto(None, shas["py-only"], mirror, shas["main2"], candidates=[*candidates, merge_base])
    assert decision.base_release == "merge-base"
    # A line that changed csrc/ since every local wheel: none lends its libraries.
    decision = auto(None, shas["stale-pr"], mirror, shas["stale"], "stale", candidates=[merge_base])
    assert decision.use is False and "but no base wheel" in decision.reason


def _index(tmp_path: Path, commit: str, machine: str = "x86_64") -> str:
    """A wheel index laid out like wheels.vllm.ai: <commit>/vllm/metadata.json."""
    meta = tmp_path / "index" / commit / "vllm" / "metadata.json"
    meta.parent.mkdir(parents=True)
    name = f"vllm-0.26.1.dev1-cp38-abi3-manylinux1_{machine}.whl"
    meta.write_text(json.dumps([{"package_name": "vllm", "platform_tag": f"manylinux1_{machine}", "filename": name}]))
    return (tmp_path / "index").as_uri()


def test_always_without_a_wheel_pins_the_merge_base_and_never_the_nightly(repo, tmp_path):
    mirror, shas = repo
    index = _index(tmp_path, shas["base"])
    decision = decide("always", None, shas["csrc"], str(mirror), shas["main2"], "main", index=index, **HOST)
    assert decision.use is True and decision.wheel_location is None
    assert decision.env() == {"VLLM_USE_PRECOMPILED": "1", "VLLM_PRECOMPILED_WHEEL_COMMIT": shas["base"]}
    assert decision.wheel_commit == shas["base"] and decision.details()["wheel_commit"] == shas["base"]
    assert f"the wheel of {shas['base'][:12]} (merge-base with main) from {index}" in decision.reason
    assert needs_git("always", None) and not needs_git("always", "/w.whl") and not needs_git("never", None)


def test_always_without_a_wheel_refuses_an_unreachable_or_missing_nightly(repo, tmp_path):
    mirror, shas = repo
    missing = (tmp_path / "no-index").as_uri()
    with pytest.raises(PrecompiledError, match=rf"the wheel of {shas['base'][:12]} cannot be had from .*Fix: give"):
        decide("always", None, shas["csrc"], str(mirror), shas["main2"], "main", index=missing, **HOST)
    other_arch = _index(tmp_path, shas["base"], machine="aarch64")
    with pytest.raises(PrecompiledError, match="lists no vllm wheel for x86_64"):
        decide("always", None, shas["csrc"], str(mirror), shas["main2"], "main", index=other_arch, **HOST)
    with pytest.raises(PrecompiledError, match="shares no history with main"):
        decide("always", None, shas["unrelated"], str(mirror), shas["main2"], "main", index=other_arch, **HOST)
    # An explicit commit is the one pinned (and looked up).
    index = _index(tmp_path / "2", shas["stale"])
    decision = decide("always", None, shas["csrc"], str(mirror), shas["main2"], "main", index=index,
                      wheel_commit="stale", **HOST)  # fmt: skip
    assert decision.env()["VLLM_PRECOMPILED_WHEEL_COMMIT"] == shas["stale"]


def test_never_and_always_with_a_wheel_need_no_repository(tmp_path):
    wheel = str(make_wheel(tmp_path, "0.26.0", commit_id="gf2654939e"))
    never = decide("never", str(tmp_path / "not-even-there.whl"))
    assert (never.use, never.env(), never.reason) == (False, {}, "precompiled: never: full build")
    always = decide("always", wheel, **HOST)
    assert always.env() == {"VLLM_USE_PRECOMPILED": "1", "VLLM_PRECOMPILED_WHEEL_LOCATION": wheel}
    assert "the diff is not checked" in always.reason
    url = "https://u:tok@wheels.example/vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl"
    given = decide("always", url, **HOST)
    assert given.env()["VLLM_PRECOMPILED_WHEEL_LOCATION"] == url
    assert "tok" not in given.reason and "tok" not in json.dumps(given.details())


def test_the_wheel_location_can_name_the_merge_base(repo):
    mirror, shas = repo
    template = "https://wheels.vllm.ai/{merge_base}/vllm-1.0.0.dev-cp38-abi3-manylinux1_x86_64.whl"
    decision = decide("always", template, shas["csrc"], str(mirror), shas["main2"], "main", **HOST)
    assert decision.wheel_location == template.replace("{merge_base}", shas["base"])
    decision = auto(template, shas["py-only"], mirror, shas["main2"])  # the URL names its commit
    assert (decision.use, decision.wheel_commit) == (True, shas["base"])
    assert "(the merge-base named by precompiled_wheel)" in decision.reason


def test_bad_options_name_the_fix(tmp_path):
    with pytest.raises(PrecompiledError, match="not a file on this host"):
        decide("always", str(tmp_path / "missing.whl"), **HOST)
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
    paths += ["requirements/common.txt", "requirements.txt", "vllm/x.py", "pyproject.toml", "a/pyproject.toml"]
    paths += ["vllm/_custom_ops.py", "vllm/_custom_ops_utils.py", "rust/Cargo.toml", "rusty/x", "docs/rust/a.md"]
    paths += ["vllm/vllm_flash_attn/__init__.py", "vllm/vllm_flash_attn/layers/rotary.py", "vllm/vllm_flash_attn/a.md"]
    paths += ["vllm/third_party/deep_gemm/include/x.cuh", "vllm/third_party/pynvml.py"]
    expected = ["csrc/a.cu", "cmake/x", "CMakeLists.txt", "a/CMakeLists.txt", "setup.py", "requirements/common.txt"]
    expected += ["pyproject.toml", "vllm/_custom_ops.py", "rust/Cargo.toml", "vllm/vllm_flash_attn/layers/rotary.py"]
    expected += ["vllm/third_party/deep_gemm/include/x.cuh"]
    assert compiled_changes(paths) == expected
    # The list, at least (vLLM's setup.py blocks or hides each of them).
    for path in ("csrc/", "cmake/", "CMakeLists.txt", "setup.py", "requirements/", "pyproject.toml", "rust/"):
        assert path in COMPILED_PATHS
    assert "vllm/_custom_ops.py" in COMPILED_PATHS


def test_every_variable_of_vllms_precompiled_lookup_belongs_to_the_option():
    wanted = {"VLLM_USE_PRECOMPILED", "VLLM_PRECOMPILED_WHEEL_LOCATION", "VLLM_PRECOMPILED_WHEEL_COMMIT"}
    wanted |= {"VLLM_USE_PRECOMPILED_RUST", "VLLM_DOCKER_BUILD_CONTEXT"}
    assert set(PRECOMPILED_ENV) == wanted


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


@pytest.mark.parametrize("used", [True, False])
def test_a_wheel_carries_the_building_hosts_reason(used):
    """A serving host of the fleet says why its release's libraries are what they are (the base wheel, the
    diff), not only that the decision was made elsewhere; without a reason it says that much."""
    why = "3 files changed since the base wheel's commit 2af8cad57270 (tag v0.26.0), none compiled"
    opts = BuildOptions(
        "/srv/vllm.git", "main", wheel="/w/vllm.whl", wheel_precompiled=used, wheel_precompiled_reason=why
    )
    decision = wheel_decision(opts)
    assert decision is not None and decision.use is used
    assert decision.reason.startswith("precompiled: auto, decided where the wheel was built (")
    assert decision.reason.endswith(f"): {why}")
    bare = wheel_decision(BuildOptions("/srv/vllm.git", "main", wheel="/w/vllm.whl", wheel_precompiled=used))
    assert bare is not None and bare.reason.endswith(")")
    assert wheel_decision(BuildOptions("/srv/vllm.git", "main", wheel_precompiled_reason=why)) is None  # no wheel
