"""The base wheel of the precompiled path: what it is (name, tags, commit) and what is refused before a build."""

from __future__ import annotations

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import check_wheel, decide, wheel_info
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled_data import PrecompiledError
from ansible_collections.vllm_ops.dflash.plugins.module_utils._vendor.packaging import _manylinux
from ansible_collections.vllm_ops.dflash.tests.helpers.fake_wheel import make_wheel

HOST = {"python_version": "3.11.2", "machine": "x86_64"}


def test_a_release_wheel_as_pypi_has_it(tmp_path):
    path = make_wheel(tmp_path, "0.26.0", commit_id="gf2654939e", tags="cp38-abi3-manylinux1_x86_64")
    info = wheel_info(str(path))
    assert (info.version, info.python_tags, info.abi_tags, info.platform_tags) == (
        "0.26.0", ["cp38"], ["abi3"], ["manylinux1_x86_64"])  # fmt: skip
    assert (info.commit_id, info.tag) == ("f2654939e", "v0.26.0")
    check_wheel(info, **HOST)


def test_a_wheel_url_is_read_from_its_name():
    info = wheel_info("https://wheels.vllm.ai/abc/vllm-0.11.2.dev278%2Bgdbc3d9991-cp38-abi3-manylinux1_x86_64.whl")
    assert (info.version, info.local_commit, info.commit_id, info.tag) == (
        "0.11.2.dev278+gdbc3d9991", "dbc3d9991", None, None)  # fmt: skip
    check_wheel(info, **HOST)


@pytest.mark.parametrize(
    ("tags", "python_version", "machine"),
    [
        ("cp38-abi3-manylinux1_x86_64", "3.12.1", "x86_64"),  # abi3 of an older Python: fine
        ("cp311-cp311-linux_x86_64", "3.11.9", "x86_64"),
        ("cp312-abi3-manylinux_2_28_aarch64", "3.12.0", "aarch64"),
        ("py3-none-any", "3.8.10", "x86_64"),
        ("cp311.cp312-cp311.cp312-manylinux2014_x86_64.manylinux_2_17_x86_64", "3.12.3", "x86_64"),
    ],
)
def test_wheels_that_fit_the_build(tmp_path, tags, python_version, machine):
    check_wheel(wheel_info(str(make_wheel(tmp_path, "0.26.0", commit_id=None, tags=tags))), python_version, machine)


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ("cp312-cp312-linux_x86_64", r"for Python 3\.12 \(cp312-cp312\), but the build's python is 3\.11\.2.*Fix:"),
        ("cp310-cp310-manylinux1_x86_64", r"for Python 3\.10 \(cp310-cp310\), but the build's python is 3\.11\.2"),
        ("cp312-abi3-manylinux1_x86_64", r"for Python 3\.12 \(cp312-abi3\)"),  # abi3 needs at least 3.12
        ("cp38-abi3-manylinux1_aarch64", r"for manylinux1_aarch64, but this host is linux x86_64.*Fix:"),
        ("cp38-abi3-macosx_11_0_arm64", r"for macosx_11_0_arm64, but this host is linux x86_64"),
        ("cp38-abi3-win_amd64", r"for win_amd64"),
    ],
)
def test_a_wheel_for_another_python_or_platform_is_refused(tmp_path, tags, message):
    path = str(make_wheel(tmp_path, "0.26.0", commit_id=None, tags=tags))
    with pytest.raises(PrecompiledError, match=message):
        check_wheel(wheel_info(path), **HOST)
    for mode in ("auto", "always"):  # refused by the decision itself, before anything is built
        with pytest.raises(PrecompiledError, match=message):
            decide(mode, path, **HOST)


def test_a_wheel_for_a_newer_glibc_than_the_hosts_is_refused(tmp_path):
    """No host has glibc 2.99: the tags are packaging's for this host, glibc version included."""
    path = str(make_wheel(tmp_path, "0.26.0", commit_id=None, tags="cp38-abi3-manylinux_2_99_x86_64"))
    with pytest.raises(PrecompiledError, match=r"for manylinux_2_99_x86_64, but this host is linux x86_64 with glibc"):
        check_wheel(wheel_info(path), **HOST)


@pytest.mark.parametrize(("glibc", "fits"), [((2, 35), False), ((2, 36), True), ((2, 39), True)])
def test_the_hosts_glibc_version_decides_a_manylinux_wheel(tmp_path, monkeypatch, glibc, fits):
    monkeypatch.setattr(_manylinux, "_get_glibc_version", lambda: glibc)
    info = wheel_info(str(make_wheel(tmp_path, "0.26.0", commit_id=None, tags="cp38-abi3-manylinux_2_36_x86_64")))
    if fits:
        check_wheel(info, **HOST)
    else:
        with pytest.raises(PrecompiledError, match=r"but this host is linux x86_64 with glibc 2\.35\."):
            check_wheel(info, **HOST)


def test_the_tags_are_the_build_pythons_not_the_modules(tmp_path):
    """The module's python (this one) is not the venv's: a cp313 wheel fits a 3.13 build python only."""
    info = wheel_info(str(make_wheel(tmp_path, "0.26.0", commit_id=None, tags="cp313-cp313-manylinux_2_17_x86_64")))
    check_wheel(info, "3.13.1", "x86_64")
    with pytest.raises(PrecompiledError, match=r"is for Python 3\.13 \(cp313-cp313\)"):
        check_wheel(info, "3.12.7", "x86_64")


def _not_a_zip(tmp_path):
    path = tmp_path / "vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl"
    path.write_bytes(b"<html>404 Not Found</html>")  # what a failed download leaves behind
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_not_a_zip, r"is not a zip archive \(a wheel is one\).*Fix:"),
        (lambda p: make_wheel(p, package=None), r"has no vllm/ package.*Fix:"),
        (lambda p: make_wheel(p, dist="torch", package="torch"), r"is a wheel of torch, not of vLLM.*Fix:"),
        (lambda p: make_wheel(p, metadata_name="vllm-fork"), r"dist-info names vllm-fork, not vllm"),
        (lambda p: make_wheel(p, name="vllm.zip"), r"is not a wheel file name.*Fix:"),
    ],
    ids=["not-zip", "no-package", "other-project", "other-metadata-name", "not-a-wheel-name"],
)
def test_a_wheel_that_is_not_a_vllm_wheel_is_refused(tmp_path, make, message):
    path = str(make(tmp_path))
    with pytest.raises(PrecompiledError, match=message):
        check_wheel(wheel_info(path), **HOST)
    with pytest.raises(PrecompiledError, match=message):
        decide("always", path, **HOST)


def test_a_url_that_names_no_wheel_is_refused():
    with pytest.raises(PrecompiledError, match=r"is not a wheel file name.*Fix:"):
        decide("always", "https://example.org/download?id=3", **HOST)


def test_never_ignores_the_wheel(tmp_path):
    path = str(_not_a_zip(tmp_path))
    assert decide("never", path, **HOST).use is False
