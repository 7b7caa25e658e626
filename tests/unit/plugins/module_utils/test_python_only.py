"""The python-only bump (_python_only) on the fixture engine (a vLLM stand-in whose setup.py takes its
compiled modules from a base wheel as vLLM's does): real precompiled builds with uv, then the bump of a
Python-only commit from the earlier release, held to the normal build of the same commit file by file."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import platform
import sys
import zipfile
from pathlib import Path
from typing import Dict

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build import BuildOptions, build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import ensure_mirror, mirror_path
from ansible_collections.vllm_ops.dflash.plugins.module_utils._python_only import Diff, Refused
from ansible_collections.vllm_ops.dflash.tests.helpers import engine_repo
from ansible_collections.vllm_ops.dflash.tests.helpers.fake_wheel import make_pure_wheel, make_wheel
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import commit_files, git, installed_version

pytestmark = [pytest.mark.engine, pytest.mark.slow_build]

LIBRARIES = ("vllm/_C.abi3.so", "vllm/_moe_C.abi3.so", "vllm/cumem_allocator.abi3.so")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """The engine repository plus `py-bump` (main + a changed and a new module: Python only), `py-deps`
    (main + a dependency change) and `py-compiled` (main + a csrc/ change)."""
    repo = tmp_path_factory.mktemp("engine") / "repo"
    refs = engine_repo.create_engine_repo(repo)
    main = refs["refs/heads/main"]
    shas = {"main": main}
    # A licence file: setuptools puts it in the dist-info's licenses/ (a directory there), as vLLM's wheel has.
    git(repo, "checkout", "-q", "-b", "base", main)
    shas["base"] = commit_files(repo, "licence", {"LICENSE": "Apache-2.0 stand-in\n"})
    git(repo, "checkout", "-q", "-b", "py-bump", shas["base"])
    init = (repo / "vllm" / "__init__.py").read_text()
    shas["py-bump"] = commit_files(
        repo, "python only", {"vllm/__init__.py": init + "BUMPED = True\n", "vllm/bumped.py": "X = 1\n"}
    )
    git(repo, "checkout", "-q", "-b", "py-deps", main)
    requirements = sorted((repo / "requirements").iterdir())[0]
    shas["py-deps"] = commit_files(
        repo, "deps", {f"requirements/{requirements.name}": requirements.read_text() + "# a new pin\n"}
    )
    git(repo, "checkout", "-q", "-b", "py-compiled", main)
    shas["py-compiled"] = commit_files(repo, "kernel", {"csrc/ops.c": "/* changed */\n"})
    git(repo, "checkout", "-q", "main")
    return repo, shas


@pytest.fixture(scope="module")
def base_wheel(engine, tmp_path_factory):
    """A base wheel of main's commit with the engine's compiled modules."""
    _repo, shas = engine
    wheel = make_wheel(
        tmp_path_factory.mktemp("base-wheel"), "0.1.dev5", commit_id="g" + shas["main"][:9],
        tags=f"cp38-abi3-linux_{platform.machine()}",
    )  # fmt: skip
    with zipfile.ZipFile(wheel) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members.update({name: f"compiled {name}".encode() for name in LIBRARIES[1:]})
    info = next(name.split("/")[0] for name in members if name.endswith(".dist-info/WHEEL"))
    rows = [f"{name},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}" for name, data in members.items()]
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/RECORD", "\n".join([*rows, f"{info}/RECORD,,"]) + "\n")
    return wheel


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def options(repo: Path, root: Path, ref: str, wheel: Path, pip_args, installer="uv", **kwargs) -> BuildOptions:
    return BuildOptions(
        str(repo), ref, root=str(root), python=sys.executable, installer=installer, pip_args=pip_args,
        precompiled_wheel=str(wheel), keep_releases=10, **kwargs,
    )  # fmt: skip


def installed(release: str) -> Dict[str, bytes]:
    """Every file of the release's venv (no __pycache__), by path, with RECORD as its sorted lines."""
    venv = Path(release, "venv")
    files = {}
    for path in sorted(venv.rglob("*")):
        if "__pycache__" in path.parts or path.is_dir():
            continue
        relative = str(path.relative_to(venv))
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        if path.name == "RECORD":
            data = b"\n".join(sorted(data.splitlines()))
        files[relative] = data.replace(str(venv).encode(), b"<venv>")
    return files


def test_a_python_only_bump_gives_the_normal_builds_files(engine, base_wheel, tmp_path, pip_args, uv_on_path):
    repo, _shas = engine
    # Roots of one length: an installer writes a script's shebang as a /bin/sh trampoline once the venv's
    # path passes 127 bytes, and xdist's longer tmp_path put "normal" past it and "fast" not.
    fast, normal = tmp_path / "fast", tmp_path / "full"
    for root in (fast, normal):
        first = build(options(repo, root, "base", base_wheel, pip_args))
        assert (first["precompiled"], first["python_only"]["used"]) == (True, False)
        assert first["python_only"]["reason"] == "no earlier precompiled release of the same inputs on this host"
    bumped = build(options(repo, fast, "py-bump", base_wheel, pip_args))
    plain = build(options(repo, normal, "py-bump", base_wheel, pip_args, python_only="never"))
    assert bumped["python_only"]["used"] is True, bumped["python_only"]
    assert bumped["python_only"]["files_changed"] == 2 and bumped["python_only"]["from"] == first["release_name"]
    assert plain["python_only"] is None
    assert bumped["release_name"] == plain["release_name"]  # the same inputs: check mode names it alike
    ours, theirs = installed(bumped["release"]), installed(plain["release"])
    assert sorted(ours) == sorted(theirs)
    assert any("/licenses/" in name for name in ours)  # a directory in the dist-info, linked as one
    differ = sorted(name for name in ours if ours[name] != theirs[name])
    assert_only_the_root_differs(differ)
    record = next(name for name in differ if name.endswith("/RECORD"))
    lines = set(ours[record].splitlines()) ^ set(theirs[record].splitlines())
    assert {line.split(b",")[0].rsplit(b"/", 1)[-1] for line in lines} == {
        b"vllm",
        b"direct_url.json",
        b"uv_cache.json",
    }
    assert json.loads(ours[differ[1]])["url"] == "file://" + bumped["wheel"]
    assert json.loads(ours[differ[2]])["timestamp"]["secs_since_epoch"] == int(os.stat(bumped["wheel"]).st_mtime)

    def members(path: str) -> Dict[str, bytes]:  # RECORD's order is no part of the wheel's meaning
        with zipfile.ZipFile(path) as wheel:
            return {
                i.filename: b"\n".join(sorted(wheel.read(i).splitlines()))
                if i.filename.endswith("/RECORD")
                else wheel.read(i)
                for i in wheel.infolist()
            }

    assert os.path.basename(bumped["wheel"]) == os.path.basename(plain["wheel"])
    assert members(bumped["wheel"]) == members(plain["wheel"])
    assert hashlib.sha256(Path(bumped["wheel"]).read_bytes()).hexdigest() == bumped["wheel_sha256"]


def assert_only_the_root_differs(differ) -> None:
    # What names the root (its own wheel file, the venv's path: a RECORD hash of bin/vllm) or a time (uv's
    # record of the wheel file's mtime) differs between any two builds in two roots; nothing else does.
    assert [name.rsplit("/", 1)[-1] for name in differ] == ["RECORD", "direct_url.json", "uv_cache.json"], differ


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_the_bump_gets_the_dependencies_a_fresh_install_gets_now(
    engine, base_wheel, tmp_path, pip_args, uv_on_path, installer
):
    """The index moves between the earlier release and the bump (a PyYAML newer than the wheelhouse's is
    published): the normal build installs it, and so does the bump (uv); with pip the bump is not tried."""
    repo, _shas = engine
    index = tmp_path / "index"
    index.mkdir()
    args = [*pip_args, "--find-links", str(index)]
    fast, normal = tmp_path / "fast", tmp_path / "full"
    for root in (fast, normal):
        first = build(options(repo, root, "base", base_wheel, args, installer))
    held = installed_version(first["release"] + "/venv", "PyYAML")  # the wheelhouse's
    assert held != "99.0"
    make_pure_wheel(index, "PyYAML", "99.0", {"yaml/__init__.py": "__version__ = '99.0'\n"})
    bumped = build(options(repo, fast, "py-bump", base_wheel, args, installer))
    plain = build(options(repo, normal, "py-bump", base_wheel, args, installer, python_only="never"))
    assert installed_version(plain["release"] + "/venv", "PyYAML") == "99.0"
    assert installed_version(bumped["release"] + "/venv", "PyYAML") == "99.0"
    if installer == "pip":
        assert bumped["python_only"]["used"] is False
        assert bumped["python_only"]["reason"].startswith("the installer is pip: the python-only bump is made with uv")
        return
    assert bumped["python_only"]["used"] is True, bumped["python_only"]
    assert bumped["python_only"]["dependencies"]["installed"] == ["pyyaml==99.0"]
    assert bumped["python_only"]["dependencies"]["removed"] == []
    ours, theirs = installed(bumped["release"]), installed(plain["release"])
    assert sorted(ours) == sorted(theirs)
    assert_only_the_root_differs(sorted(name for name in ours if ours[name] != theirs[name]))
    # The earlier release keeps its own: the bump replaced its links, never wrote through them.
    earlier = Path(fast, "releases", bumped["python_only"]["from"], "venv")
    assert installed_version(str(earlier), "PyYAML") == held
    assert next(earlier.glob("lib/python*/site-packages/yaml/__init__.py")).read_text() != "__version__ = '99.0'\n"


def test_a_tampered_hard_link_is_caught_before_the_release_is_complete(
    engine, base_wheel, tmp_path, pip_args, uv_on_path
):
    repo, _shas = engine
    root = tmp_path / "root"
    first = build(options(repo, root, "base", base_wheel, pip_args))
    site = next(Path(first["release"], "venv", "lib").glob("python*/site-packages"))
    target = site / "vllm" / "envs.py"  # linked, not changed by py-bump
    target.write_text(target.read_text() + "TAMPERED = 1\n")  # in place: every hard link of it changes
    bumped = build(options(repo, root, "py-bump", base_wheel, pip_args))
    assert bumped["python_only"]["used"] is False
    assert "vllm/envs.py does not match its RECORD line" in bumped["python_only"]["reason"]
    new_site = next(Path(bumped["release"], "venv", "lib").glob("python*/site-packages"))
    assert b"TAMPERED" not in (new_site / "vllm" / "envs.py").read_bytes()  # the normal build's own file
    records = list(new_site.glob("vllm-*.dist-info/RECORD"))
    assert len(records) == 1 and all(row for row in csv.reader(records[0].open()))


@pytest.mark.parametrize(
    ("branch", "reason"),
    [
        ("py-bump", "LICENSE changed: outside vllm/ and not known to stay out of the wheel"),
        ("py-compiled", "1 changed files under vLLM's compiled or dependency paths (csrc/ops.c)"),
        ("py-deps", "1 changed files under vLLM's compiled or dependency paths (requirements/"),
    ],
)
def test_a_compiled_or_dependency_change_is_refused(engine, tmp_path, branch, reason):
    repo, shas = engine
    mirror = mirror_path(str(tmp_path), str(repo))
    ensure_mirror(str(repo), mirror, 120)
    with pytest.raises(Refused) as refused:  # from main, py-bump adds LICENSE too (the dist-info's licenses/)
        Diff(mirror, shas["main"], shas[branch], "vllm", {})
    assert str(refused.value).startswith(reason)


def test_a_file_setup_py_takes_from_elsewhere_is_refused(engine, tmp_path):
    """A changed module the earlier wheel lacks (setup.py left it out): the bump cannot know what the build does."""
    repo, shas = engine
    mirror = mirror_path(str(tmp_path), str(repo))
    ensure_mirror(str(repo), mirror, 120)
    with pytest.raises(Refused, match=r"vllm/__init__.py changed but is not in the earlier wheel"):
        Diff(mirror, shas["base"], shas["py-bump"], "vllm", {})
