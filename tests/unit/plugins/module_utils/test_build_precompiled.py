"""vllm_build's precompiled rules end to end, on the fixture engine's repository (a vLLM stand-in whose
setup.py reads vLLM's precompiled variables as vLLM's does): the decision through build(), in check mode
where a build would prove nothing more, and real builds where the engine's own lookup is the point."""

from __future__ import annotations

import json
import os
import platform
import sys
import zipfile
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _precompiled
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build import BuildError, BuildOptions, build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import ensure_mirror, mirror_path
from ansible_collections.vllm_ops.dflash.tests.helpers import engine_repo
from ansible_collections.vllm_ops.dflash.tests.helpers.fake_wheel import make_wheel
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import commit_files, git

pytestmark = pytest.mark.engine

# branch (off main) -> the change it makes; each is a compiled path of vLLM.
COMPILED = {
    "touch/csrc": {"csrc/ops.c": "/* changed */\n"},
    "touch/pyproject": {"pyproject.toml": None},  # appended to below
    "touch/custom-ops": {"vllm/_custom_ops.py": "# the Python side of the compiled ops\n"},
    "touch/rust": {"rust/src/lib.rs": "// the Rust frontend\n"},
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """The engine repository plus: `line` (main + a csrc/ change: the line a fork follows), `line-pr` (a
    Python-only change on it), and one branch per COMPILED row."""
    repo = tmp_path_factory.mktemp("engine") / "repo"
    refs = engine_repo.create_engine_repo(repo)
    main = refs["refs/heads/main"]
    shas = {"main": main, "dflash-fix": refs["refs/heads/dflash-fix"]}
    git(repo, "checkout", "-q", "-b", "line", main)
    shas["line"] = commit_files(repo, "the line changes a kernel", {"csrc/moe_ops.c": "/* line */\n"})
    git(repo, "checkout", "-q", "-b", "line-pr")
    shas["line-pr"] = commit_files(repo, "python-only", {"vllm/line_pr.py": "X = 1\n"})
    for branch, files in COMPILED.items():
        git(repo, "checkout", "-q", "-b", branch, main)
        if "pyproject.toml" in files:
            files = {"pyproject.toml": (repo / "pyproject.toml").read_text() + "# the torch build pin moves\n"}
        shas[branch] = commit_files(repo, branch, files)
    git(repo, "checkout", "-q", "main")
    return repo, shas


@pytest.fixture(scope="module")
def base_wheel(engine, tmp_path_factory):
    """A wheel shaped like the engine's build of main (its _version.py names main's commit)."""
    _repo, shas = engine
    directory = tmp_path_factory.mktemp("base-wheel")
    return make_wheel(
        directory, "0.1.dev5", commit_id="g" + shas["main"][:9], tags=f"cp38-abi3-linux_{platform.machine()}"
    )


def options(repo: Path, root: Path, ref: str, **kwargs) -> BuildOptions:
    kwargs.setdefault("keep_releases", 10)
    return BuildOptions(str(repo), ref, root=str(root), python=sys.executable, **kwargs)


def mirrored(repo: Path, root: Path) -> Path:
    """A root whose mirror already holds every branch (check mode decides from the mirror as it is)."""
    ensure_mirror(str(repo), mirror_path(str(root), str(repo)), 120)
    return root


def test_a_stale_base_wheel_is_refused_for_a_python_only_ref(engine, base_wheel, tmp_path):
    repo, shas = engine
    root = mirrored(repo, tmp_path / "root")
    opts = options(repo, root, "line-pr", precompiled_base="line", precompiled_wheel=str(base_wheel))
    result = build(opts, check_mode=True)
    assert result["precompiled"] is False
    assert result["precompiled_reason"] == (
        f"2 files changed since the base wheel's commit {shas['main'][:12]} (vllm/_version.py of "
        f"{base_wheel.name}), 1 under vLLM's compiled paths (csrc/moe_ops.c): full build"
    )


def test_a_python_only_ref_on_the_wheels_commit_is_precompiled(engine, base_wheel, tmp_path):
    repo, _shas = engine
    root = mirrored(repo, tmp_path / "root")
    result = build(options(repo, root, "dflash-fix", precompiled_wheel=str(base_wheel)), check_mode=True)
    assert result["precompiled"] is True
    assert "none under vLLM's compiled paths: precompiled (base wheel " in result["precompiled_reason"]


@pytest.mark.parametrize("branch", list(COMPILED))
def test_each_compiled_path_builds_in_full(engine, base_wheel, tmp_path, branch):
    repo, _shas = engine
    root = mirrored(repo, tmp_path / "root")
    result = build(options(repo, root, branch, precompiled_wheel=str(base_wheel)), check_mode=True)
    assert result["precompiled"] is False
    changed = next(iter(COMPILED[branch]))
    assert f"1 under vLLM's compiled paths ({changed}): full build" in result["precompiled_reason"]


def _nothing_built(root: Path) -> None:
    releases = root / "releases"
    assert not releases.exists() or not [n for n in os.listdir(releases) if not n.startswith(".")]
    assert not (root / "wheels").exists() or not os.listdir(root / "wheels")
    assert os.readlink(root / "current") == "releases/previous"  # untouched


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"precompiled_wheel": "NOT_A_ZIP"}, r"is not a zip archive \(a wheel is one\)\. Fix:"),
        ({"precompiled_wheel": "OTHER_PYTHON"}, r"is for Python 2\.7 \(cp27-cp27mu\).*Fix:"),
        ({"precompiled_wheel_commit": "f" * 12}, r"precompiled_wheel_commit 'f{12}' is not a commit of the repo"),
        ({"precompiled": "always"}, r"the wheel of [0-9a-f]{12} cannot be had from file:.*Fix:"),
        ({"precompiled": "always", "precompiled_wheel": "OTHER_PYTHON"}, r"is for Python 2\.7 \(cp27-cp27mu\)"),
    ],
    ids=["not-a-wheel", "other-python", "unknown-commit", "unreachable-nightly", "always-other-python"],
)
def test_bad_input_is_refused_before_anything_is_built(engine, base_wheel, tmp_path, monkeypatch, kwargs, message):
    repo, _shas = engine
    root = tmp_path / "root"
    root.mkdir()
    os.symlink("releases/previous", root / "current")
    monkeypatch.setattr(_precompiled, "NIGHTLY_INDEX", (tmp_path / "no-index").as_uri())
    if kwargs.get("precompiled_wheel") == "NOT_A_ZIP":
        (tmp_path / "vllm-0.1-cp38-abi3-linux_x86_64.whl").write_text("<html>404</html>")
        kwargs = dict(kwargs, precompiled_wheel=str(tmp_path / "vllm-0.1-cp38-abi3-linux_x86_64.whl"))
    elif kwargs.get("precompiled_wheel") == "OTHER_PYTHON":
        kwargs = dict(kwargs, precompiled_wheel=str(make_wheel(tmp_path, "0.1", tags="cp27-cp27mu-linux_x86_64")))
    elif "precompiled_wheel_commit" in kwargs:
        kwargs = dict(kwargs, precompiled_wheel=str(base_wheel))
    with pytest.raises(BuildError, match=message):
        build(options(repo, root, "dflash-fix", **kwargs))
    _nothing_built(root)


def _publish(index: Path, commit: str, wheel: Path) -> None:
    """<index>/<commit>/vllm/metadata.json and the wheel, as wheels.vllm.ai lays them out."""
    tag = f"manylinux1_{platform.machine()}"
    (index / commit).mkdir(parents=True)
    name = f"vllm-0.1.dev5-cp38-abi3-{tag}.whl"
    (index / commit / name).write_bytes(wheel.read_bytes())
    meta = index / commit / "vllm" / "metadata.json"
    meta.parent.mkdir()
    meta.write_text(json.dumps([{"package_name": "vllm", "platform_tag": tag, "filename": name, "path": f"../{name}"}]))


@pytest.mark.slow_build
def test_always_without_a_wheel_builds_on_the_merge_bases_wheel_never_the_nightly(
    engine, tmp_path, monkeypatch, pip_args
):
    """The engine's setup.py, like vLLM's, would take the nightly wheel without a pinned commit; the
    collection pins the merge-base, whose wheel the index has."""
    repo, shas = engine
    libraries = tmp_path / "merge-base.whl"
    with zipfile.ZipFile(libraries, "w") as archive:
        for so in ("vllm/_C.abi3.so", "vllm/_moe_C.abi3.so", "vllm/cumem_allocator.abi3.so"):
            archive.writestr(so, "merge-base libraries")
    index = tmp_path / "index"
    _publish(index, shas["main"], libraries)
    _publish(index, "nightly", libraries)
    monkeypatch.setattr(_precompiled, "NIGHTLY_INDEX", index.as_uri())
    opts = options(
        repo, tmp_path / "root", "dflash-fix", precompiled="always", pip_args=pip_args,
        build_env={"VLLM_FIXTURE_WHEEL_INDEX": index.as_uri()},
    )  # fmt: skip
    result = build(opts)
    assert (result["built"], result["precompiled"]) == (True, True)
    assert f"the wheel of {shas['main'][:12]} (merge-base with main)" in result["precompiled_reason"]
    manifest = json.loads(Path(result["release"], "manifest.json").read_text())
    assert manifest["added_env"]["VLLM_PRECOMPILED_WHEEL_COMMIT"] == shas["main"]
    assert manifest["precompiled_details"]["wheel_commit"] == shas["main"]
    log = Path(result["log_path"]).read_text()
    assert f"Using precompiled wheel commit {shas['main']}" in log and "nightly wheel" not in log
    with zipfile.ZipFile(result["wheel"]) as built:
        assert built.read("vllm/_C.abi3.so") == b"merge-base libraries"


def test_check_mode_names_the_always_release_and_asks_no_index(engine, tmp_path, monkeypatch):
    repo, shas = engine
    monkeypatch.setattr(_precompiled, "NIGHTLY_INDEX", (tmp_path / "no-index").as_uri())  # unreachable: unasked
    bare = build(options(repo, tmp_path / "empty", "dflash-fix", precompiled="always"), check_mode=True)
    assert bare["precompiled"] is True and "the commit to pin is not known in check mode" in bare["precompiled_reason"]
    root = mirrored(repo, tmp_path / "root")
    known = build(options(repo, root, "dflash-fix", precompiled="always"), check_mode=True)
    assert (known["precompiled"], known["release_name"]) == (True, bare["release_name"])
    assert f"the wheel of {shas['main'][:12]} (merge-base with main)" in known["precompiled_reason"]
    assert "is asked by the build, not in check mode" in known["precompiled_reason"]
