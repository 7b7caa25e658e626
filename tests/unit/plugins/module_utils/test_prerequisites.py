"""What a fresh GPU host lacks, one message with its fix per piece (issue 27 item 3), judged without Ansible."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._prerequisites import (
    Need,
    Observed,
    PrerequisiteError,
    installable,
    observe,
    package_manager,
    parse_cuda,
    problems,
    summary,
)

GIB = 1024**3
# A host with everything a full build needs (Ubuntu 24.04, CUDA 12.9, driver 575).
READY = Observed(
    package_manager="apt",
    python="/usr/bin/python3",
    python_version=(3, 12),
    python_has_venv=True,
    git="/usr/bin/git",
    gcc="/usr/bin/gcc",
    gcc_version=(13, 2, 0),
    gxx="/usr/bin/g++",
    nvcc="/usr/local/cuda/bin/nvcc",
    nvcc_version=(12, 9),
    driver_version=(575, 57, 8),
    disk_path="/opt",
    disk_free_bytes=500 * GIB,
)
FULL = Need(full_build=True)


def names(need: Need, seen: Observed) -> list:
    return [problem.name for problem in problems(need, seen)]


def test_a_ready_host_has_no_problem():
    assert problems(FULL, READY) == []


def test_stock_debian_lacks_the_venv_package_of_its_python_with_the_apt_fix():
    (problem,) = problems(Need(), replace(READY, python_version=(3, 11), python_has_venv=False))
    assert problem.name == "venv" and problem.packages == ["python3.11-venv"]
    assert "apt-get install -y python3.11-venv, or set vllm_prerequisites_install: true" in problem.msg


def test_the_rhel_family_gets_dnf_packages():
    seen = replace(READY, package_manager="dnf", git="", gcc="", gxx="")
    found = problems(FULL, seen)
    assert [p.name for p in found] == ["git", "compiler"]
    assert "dnf install -y git, or set vllm_prerequisites_install: true" in found[0].msg
    assert installable(found) == ["git", "gcc", "gcc-c++", "make"]


def test_every_missing_piece_is_gathered_into_one_message():
    bare = Observed(package_manager="apt", python="/usr/bin/python3", python_version=(3, 11), disk_path="/")
    found = problems(FULL, bare)
    assert [p.name for p in found] == ["venv", "git", "compiler", "cuda_toolkit", "driver", "disk"]
    msg = summary(found)
    assert msg.startswith("6 prerequisite(s) missing on this host, nothing was built or changed: (1) ")
    for index, problem in enumerate(found, start=1):
        assert f"({index}) {problem.msg}" in msg
    assert installable(found) == ["python3.11-venv", "git", "build-essential"]


def test_a_uv_makes_the_venvs_unless_the_installer_is_pip():
    without_pip = replace(READY, python_has_venv=False, uv="/opt/vllm/tools/bin/uv")
    assert problems(Need(), without_pip) == []
    assert names(Need(installer="pip"), without_pip) == ["venv"]


def test_git_and_the_compiler_are_needed_only_where_asked():
    bare = replace(READY, git="", gcc="", gxx="", nvcc="")
    assert names(Need(git=False, full_build=False), bare) == []
    assert names(Need(git=True, full_build=False), bare) == ["git"]


def test_a_python_outside_vllms_range_is_named_never_installed_over_the_system_one():
    (problem,) = problems(Need(), replace(READY, python_version=(3, 9)))
    assert problem.name == "python_version" and problem.packages == []
    assert "is python 3.9; vLLM needs 3.10 to 3.13" in problem.msg and "set vllm_python" in problem.msg
    assert names(Need(), replace(READY, python_version=(3, 14))) == ["python_version"]
    (missing,) = problems(Need(python="python3.12"), replace(READY, python=""))
    assert missing.name == "python" and missing.packages == ["python3.12", "python3.12-venv"]
    assert problems(Need(python="/opt/py/bin/python3"), replace(READY, python=""))[0].packages == []


def test_an_old_gcc_is_refused_with_vllms_floor():
    (problem,) = problems(FULL, replace(READY, gcc_version=(10, 2, 1)))
    assert problem.name == "compiler_version" and "gcc is 10.2.1; a full build of vLLM needs gcc >= 11.3" in problem.msg


def test_a_toolkit_of_another_cuda_major_than_torch_is_refused():
    (problem,) = problems(FULL, replace(READY, nvcc_version=(13, 0)))
    assert problem.name == "cuda_toolkit_version"
    assert "CUDA 13.0 but torch was built for CUDA 12.9" in problem.msg and "cuda-toolkit-12-9" in problem.msg
    assert problems(FULL, replace(READY, nvcc_version=(12, 8))) == []  # another minor: torch only warns


@pytest.mark.parametrize(
    ("cuda", "driver", "ok"),
    [
        ("12.9", (525, 60, 13), True),  # minor version compatibility's floor for 12.x
        ("12.9", (525, 60, 12), False),
        ("cu129", (470, 82, 1), False),
        ("13.0", (575, 57, 8), False),
        ("13.0", (580, 65, 6), True),
        ("", None, True),  # a host without a GPU
    ],
)
def test_the_driver_is_judged_against_the_cuda_torch_needs(cuda, driver, ok):
    found = problems(Need(cuda=cuda), replace(READY, driver_version=driver))
    assert (found == []) is ok, [p.msg for p in found]
    if not ok:
        assert found[0].name == "driver_version" and "upgrade the driver (and reboot)" in found[0].msg


def test_no_driver_says_how_to_skip_the_check_on_a_cpu_host():
    (problem,) = problems(Need(), replace(READY, driver_version=None))
    assert problem.name == "driver" and "vllm_prerequisites_cuda: ''" in problem.msg and ">= 525.60.13" in problem.msg


def test_too_little_disk_names_the_path_the_space_and_the_fix():
    (problem,) = problems(Need(min_free_gb=30), replace(READY, disk_free_bytes=12 * GIB))
    assert problem.msg.startswith("/opt has 12.0 GiB free, a release under /opt/vllm needs 30 GiB")
    assert "set vllm_root to a larger file system" in problem.msg


def test_another_family_gets_the_fix_without_a_package_command():
    (problem,) = problems(Need(), replace(READY, package_manager="", git=""))
    assert problem.packages == [] and "apt-get" not in problem.msg and "dnf" not in problem.msg


@pytest.mark.parametrize(
    ("text", "manager"),
    [
        ('ID=ubuntu\nID_LIKE=debian\nPRETTY_NAME="Ubuntu 24.04 LTS"\n', "apt"),
        ("ID=debian\n", "apt"),
        ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', "dnf"),
        ('ID="rhel"\n', "dnf"),
        ('ID=almalinux\nID_LIKE="rhel centos fedora"\n', "dnf"),
        ("ID=arch\n", ""),
    ],
)
def test_the_package_manager_comes_from_os_release(text, manager):
    assert package_manager(text)[0] == manager


def test_a_cuda_version_that_is_not_one_is_refused():
    assert parse_cuda("12.9") == (12, 9) == parse_cuda("cu129")
    assert parse_cuda("") is None
    with pytest.raises(PrerequisiteError, match="vllm_prerequisites_cuda='twelve' is not a CUDA version"):
        parse_cuda("twelve")


def test_observe_reads_this_host(tmp_path):
    os_release = tmp_path / "os-release"
    os_release.write_text('ID=ubuntu\nID_LIKE=debian\nPRETTY_NAME="Ubuntu 24.04 LTS"\n')
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  575.57.08  Sat May 24 07:21:18 UTC 2025\n")
    seen = observe(
        Need(python=sys.executable, root=str(tmp_path / "no" / "such" / "root")),
        os_release_path=str(os_release),
        driver_path=str(driver),
    )
    assert (seen.package_manager, seen.os_name) == ("apt", "Ubuntu 24.04 LTS")
    assert seen.python == sys.executable and seen.python_version == sys.version_info[:2]
    assert seen.driver_version == (575, 57, 8)
    assert (
        seen.disk_path == str(tmp_path)
        and seen.disk_free_bytes == os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    )


@pytest.mark.parametrize(
    "line",
    [
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  575.57.08  Sat May 24 07:21:18 UTC 2025",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  (dvs-builder@U16)",
        "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  575.57.08  Release Build",
    ],
    ids=["proprietary", "open-x86_64", "open-aarch64"],
)
def test_observe_reads_the_driver_of_either_kernel_module(tmp_path, line):
    driver = tmp_path / "version"
    driver.write_text(line + "\nGCC version:  gcc version 12.3.0\n")
    assert observe(Need(python=sys.executable, root=str(tmp_path)), driver_path=str(driver)).driver_version == (
        575,
        57,
        8,
    )


def test_observe_sees_a_python_without_ensurepip(tmp_path):
    # A python whose ensurepip import fails, as on Debian without python3.X-venv.
    site = tmp_path / "site"
    site.mkdir()
    (site / "ensurepip.py").write_text("raise ImportError('ensurepip is disabled in Debian/Ubuntu')\n")
    wrapper = tmp_path / "python3"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    seen = observe(Need(python=str(wrapper), root=str(tmp_path)), driver_path=str(tmp_path / "none"))
    assert seen.python_version == sys.version_info[:2] and not seen.python_has_venv
    assert observe(Need(python=sys.executable, root=str(tmp_path))).python_has_venv
    assert Path(seen.python) == wrapper


def test_core_and_module_are_python38_syntax():
    # They run on the target's system python (ansible-core 2.18's floor there: 3.8).
    import ast

    from ansible_collections.vllm_ops.dflash.plugins.module_utils import _prerequisites

    root = Path(_prerequisites.__file__).resolve().parents[2]
    for path in (Path(_prerequisites.__file__), root / "plugins" / "modules" / "vllm_prerequisites.py"):
        ast.parse(path.read_text(), feature_version=(3, 8))


def test_observe_reads_the_h200s_driver_line(tmp_path):
    # /proc/driver/nvidia/version's first line on the H200 (2026-12-02): the open kernel module, driver 580.
    driver = tmp_path / "version"
    driver.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n"
    )
    seen = observe(Need(python=sys.executable, root=str(tmp_path)), driver_path=str(driver))
    assert seen.driver_version == (580, 159, 4)
    assert problems(Need(cuda="13.0", root=str(tmp_path)), replace(READY, driver_version=seen.driver_version)) == []
