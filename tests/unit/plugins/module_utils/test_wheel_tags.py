"""A precompiled build's wheel takes the base wheel's tags only when its compiled members are the base's."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path
from typing import Dict

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_overlay import OverlayError
from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_tags import (
    base_tagged,
    compiled_member,
    wheel_tags,
)

LIB = hashlib.sha256(b"lib").digest() * 100
BASE_TAGS = "cp38-abi3-manylinux_2_28_x86_64"
BUILT_TAGS = "cp311-cp311-linux_x86_64"


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(directory: Path, version: str, tags: str, files: Dict[str, bytes]) -> Path:
    """A wheel as setuptools writes one: WHEEL with its Tag lines, and a RECORD that hashes every member."""
    dist = f"vllm-{version}.dist-info"
    python, abi, platform = tags.split("-")
    members = dict(files)
    members[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n".encode()
    members[f"{dist}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: setuptools (80.9.0)\nRoot-Is-Purelib: false\nTag: {python}-{abi}-{platform}\n"
    ).encode()
    rows = [[name, _hash(data), str(len(data))] for name, data in members.items()] + [[f"{dist}/RECORD", "", ""]]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    members[f"{dist}/RECORD"] = out.getvalue().encode()
    path = directory / f"vllm-{version}-{tags}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


@pytest.fixture
def base(tmp_path: Path) -> Path:
    (tmp_path / "base").mkdir()
    return _wheel(
        tmp_path / "base",
        "0.26.0",
        BASE_TAGS,
        {"vllm/__init__.py": b"# release\n", "vllm/_C.abi3.so": LIB, "vllm/libfoo.so.1.2": b"\x7fELF foo"},
    )


def _built(tmp_path: Path, lib: bytes = LIB) -> Path:
    (tmp_path / "built").mkdir(exist_ok=True)
    return _wheel(
        tmp_path / "built",
        "0.26.1.dev1+g9f676a04a.precompiled",
        BUILT_TAGS,
        {"vllm/__init__.py": b"# the fork\n", "vllm/_C.abi3.so": lib, "vllm/libfoo.so.1.2": b"\x7fELF foo"},
    )


def test_compiled_members_are_told_apart() -> None:
    assert compiled_member("vllm/_C.abi3.so")
    assert compiled_member("nvidia/lib/libcudart.so.13")
    assert compiled_member("deep_gemm/_C.cpython-312-x86_64-linux-gnu.so")
    assert not compiled_member("vllm/sotest.py")
    assert not compiled_member("vllm/so/README.md")


def test_wheel_tags_read_from_the_name() -> None:
    assert wheel_tags("/w/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl") == BASE_TAGS
    assert wheel_tags("vllm-0.20.1-1-cp38-abi3-manylinux_2_35_x86_64.whl") == "cp38-abi3-manylinux_2_35_x86_64"
    for name in ("vllm-0.26.0.tar.gz", "vllm-0.26.0-cp38-abi3.whl", "vllm-not.a.version-cp38-abi3-any.whl"):
        with pytest.raises(OverlayError, match="not a wheel file name"):
            wheel_tags(name)


def test_a_wheel_of_the_base_wheels_libraries_takes_its_tags(tmp_path: Path, base: Path) -> None:
    built = _built(tmp_path)
    result = base_tagged(str(built), str(base))

    assert result.retagged
    assert result.path.endswith(f"vllm-0.26.1.dev1+g9f676a04a.precompiled-{BASE_TAGS}.whl")
    assert not built.exists()  # replaced, so wheels/<name>/ keeps one wheel
    assert [p.name for p in built.parent.iterdir()] == [Path(result.path).name]
    with zipfile.ZipFile(result.path) as archive:
        assert archive.testzip() is None
        dist = "vllm-0.26.1.dev1+g9f676a04a.precompiled.dist-info"
        wheel = archive.read(f"{dist}/WHEEL").decode()
        assert "Tag: cp38-abi3-manylinux_2_28_x86_64" in wheel.splitlines()
        assert "cp311" not in wheel
        assert "Root-Is-Purelib: false" in wheel
        rows = {row[0]: row for row in csv.reader(io.StringIO(archive.read(f"{dist}/RECORD").decode())) if row}
        for name in archive.namelist():  # RECORD still right for every member, WHEEL included
            if not name.endswith("RECORD"):
                assert rows[name][1] == _hash(archive.read(name)), name
                assert rows[name][2] == str(len(archive.read(name)))
        assert archive.read("vllm/__init__.py") == b"# the fork\n"
        assert archive.read("vllm/_C.abi3.so") == LIB


def test_a_library_compiled_here_keeps_the_build_hosts_tags(tmp_path: Path, base: Path) -> None:
    built = _built(tmp_path, lib=LIB + b"rebuilt")
    before = built.read_bytes()
    result = base_tagged(str(built), str(base))

    assert not result.retagged
    assert result.path == str(built)
    assert "vllm/_C.abi3.so is not the base wheel's" in result.reason
    assert result.tags == BUILT_TAGS
    assert built.read_bytes() == before


def test_a_library_the_base_wheel_lacks_keeps_the_build_hosts_tags(tmp_path: Path, base: Path) -> None:
    (tmp_path / "built").mkdir()
    built = _wheel(
        tmp_path / "built",
        "0.26.1",
        BUILT_TAGS,
        {"vllm/_C.abi3.so": LIB, "vllm/libfoo.so.1.2": b"\x7fELF foo", "vllm/_fork_C.abi3.so": b"new"},
    )
    result = base_tagged(str(built), str(base))
    assert not result.retagged
    assert "vllm/_fork_C.abi3.so" in result.reason


def test_same_tags_nothing_to_do(tmp_path: Path, base: Path) -> None:
    (tmp_path / "built").mkdir()
    built = _wheel(tmp_path / "built", "0.26.1", BASE_TAGS, {"vllm/_C.abi3.so": LIB})
    result = base_tagged(str(built), str(base))
    assert not result.retagged and result.path == str(built)


def test_not_a_wheel_is_refused(tmp_path: Path, base: Path) -> None:
    bad = tmp_path / "vllm-0.26.1-cp311-cp311-linux_x86_64.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(OverlayError, match="not a readable wheel"):
        base_tagged(str(bad), str(base))
