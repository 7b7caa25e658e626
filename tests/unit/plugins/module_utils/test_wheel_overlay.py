"""The wheel overlay: a build from the stub, overlaid, equals the build from the base wheel, byte for byte."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Dict, Optional

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_overlay import (
    PLACEHOLDER_MAGIC,
    OverlayError,
    link_installed,
    make_stub,
    overlay,
    stub_for,
    unpack_members,
)

MIN = 4096  # tests' threshold: members this large get a placeholder
# Large and barely compressible (like a .so), and small ones.
LIB = hashlib.sha256(b"lib").digest() * 400  # 12.8 kB
RUST = bytes(range(256)) * 40  # 10 kB
BASE_FILES = {
    "vllm/__init__.py": b"from .version import __version__\n",
    "vllm/_C.abi3.so": LIB,
    "vllm/vllm-rs": RUST,
    "vllm/vllm_flash_attn/__init__.py": b"# in the repo\n",
    "vllm/vllm_flash_attn/layers.py": b"# from the wheel\n",
}


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(
    path: Path, files: Dict[str, bytes], dist: str, modes: Optional[Dict[str, int]] = None, streamed: bool = False
) -> Path:
    """A wheel with a valid RECORD, deflated like setuptools' (streamed: sizes in data descriptors)."""
    record = f"{dist}.dist-info/RECORD"
    members = dict(files)
    members[f"{dist}.dist-info/METADATA"] = b"Metadata-Version: 2.1\nName: vllm\n"
    rows = [[name, _hash(data), str(len(data))] for name, data in members.items()] + [[record, "", ""]]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    members[record] = out.getvalue().encode()
    with open(path, "wb") as handle:
        target = _Unseekable(handle) if streamed else handle
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:  # type: ignore[arg-type]
            for name, data in members.items():
                info = zipfile.ZipInfo(name, (2026, 7, 25, 2, 9, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = ((modes or {}).get(name, 0o644) | 0o100000) << 16
                if streamed:
                    with archive.open(info, "w") as member:
                        member.write(data)
                else:
                    archive.writestr(info, data)
    return path


class _Unseekable(io.RawIOBase):
    def __init__(self, handle) -> None:
        self.handle = handle

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def _setup_py_build(wheel: Path, out: Path, sources: Dict[str, bytes]) -> Path:
    """What vLLM's precompiled setup.py does: extract chosen members verbatim, add the repo's files, pack."""
    with zipfile.ZipFile(wheel) as base:
        extracted = {
            name: base.read(name)
            for name in base.namelist()
            if name.endswith((".so", "vllm-rs")) or name == "vllm/vllm_flash_attn/layers.py"
        }
    modes = {name: 0o755 for name in extracted if name.endswith((".so", "vllm-rs"))}
    return _wheel(out, {**sources, **extracted}, "vllm-0.26.1.dev1+gabc.precompiled", modes)


def _contents(path: Path) -> Dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None  # every CRC checks out
        return {name: archive.read(name) for name in archive.namelist()}


def _record_valid(files: Dict[str, bytes]) -> None:
    record = next(name for name in files if name.endswith(".dist-info/RECORD"))
    rows = list(csv.reader(io.StringIO(files[record].decode())))
    listed = {row[0] for row in rows}
    assert listed == set(files)
    for name, digest, size in rows:
        if name != record:
            assert (digest, int(size)) == (_hash(files[name]), len(files[name])), name


SOURCES = {
    "vllm/__init__.py": b"from .version import __version__\n",
    "vllm/model_executor/models/qwen3_dflash.py": b"# the fork's change\n",
    "vllm/vllm_flash_attn/__init__.py": b"# in the repo\n",
}


@pytest.mark.parametrize("streamed", [False, True], ids=["sizes-in-headers", "data-descriptors"])
def test_overlay_equals_the_build_from_the_base_wheel(tmp_path: Path, streamed: bool) -> None:
    base = _wheel(tmp_path / "base.whl", BASE_FILES, "vllm-0.26.0", streamed=streamed)
    with zipfile.ZipFile(base) as archive:
        assert bool(archive.getinfo("vllm/_C.abi3.so").flag_bits & 0x08) == streamed
    stub = tmp_path / "stub" / "base.whl"
    stub.parent.mkdir()
    counts = make_stub(str(base), str(stub), MIN)
    assert counts == {"replaced": 2, "replaced_bytes": len(LIB) + len(RUST)}
    stub_files = _contents(stub)
    assert stub_files["vllm/_C.abi3.so"].startswith(PLACEHOLDER_MAGIC)
    assert stub_files["vllm/vllm_flash_attn/layers.py"] == BASE_FILES["vllm/vllm_flash_attn/layers.py"]
    assert os.path.getsize(stub) < os.path.getsize(base)

    expected = _setup_py_build(base, tmp_path / "expected.whl", SOURCES)
    from_stub = _setup_py_build(stub, tmp_path / "from-stub.whl", SOURCES)
    result = overlay(str(from_stub), str(base), str(tmp_path / "final.whl"))

    assert set(result.pop("placeholders")) == {"vllm/_C.abi3.so", "vllm/vllm-rs"}
    assert result == {"swapped": 2, "swapped_bytes": len(LIB) + len(RUST), "members": len(_contents(expected))}
    final = _contents(tmp_path / "final.whl")
    assert final == _contents(expected)
    _record_valid(final)
    with zipfile.ZipFile(tmp_path / "final.whl") as archive:
        so = archive.getinfo("vllm/_C.abi3.so")
        assert so.external_attr >> 16 & 0o777 == 0o644  # the base wheel's member, mode and all
        assert so.compress_type == zipfile.ZIP_DEFLATED
    assert not (tmp_path / "final.whl.part").exists()


def test_a_placeholder_under_another_name_refuses_the_wheel(tmp_path: Path) -> None:
    base = _wheel(tmp_path / "base.whl", BASE_FILES, "vllm-0.26.0")
    stub = tmp_path / "stub.whl"
    make_stub(str(base), str(stub), MIN)
    with zipfile.ZipFile(stub) as archive:
        placeholder = archive.read("vllm/_C.abi3.so")
    built = _wheel(tmp_path / "built.whl", {"vllm/moved.so": placeholder}, "vllm-0.26.1")
    with pytest.raises(OverlayError, match=r"holds the placeholder of vllm/_C\.abi3\.so.*Fix:"):
        overlay(str(built), str(base), str(tmp_path / "final.whl"))
    assert not (tmp_path / "final.whl").exists()


def test_a_base_wheel_changed_since_its_stub_is_refused(tmp_path: Path) -> None:
    base = _wheel(tmp_path / "base.whl", BASE_FILES, "vllm-0.26.0")
    stub = tmp_path / "stub.whl"
    make_stub(str(base), str(stub), MIN)
    built = _setup_py_build(stub, tmp_path / "built.whl", SOURCES)
    other = _wheel(tmp_path / "other.whl", dict(BASE_FILES, **{"vllm/_C.abi3.so": LIB[::-1]}), "vllm-0.26.0")
    with pytest.raises(OverlayError, match=r"changed since its stub was made\. Fix: remove the stub cache"):
        overlay(str(built), str(other), str(tmp_path / "final.whl"))
    without = _wheel(tmp_path / "without.whl", {"vllm/__init__.py": b""}, "vllm-0.26.0")
    with pytest.raises(OverlayError, match=r"has no vllm/_C\.abi3\.so"):
        overlay(str(built), str(without), str(tmp_path / "final.whl"))


def test_a_base_wheel_that_does_not_match_its_record_gets_no_stub(tmp_path: Path) -> None:
    base = _wheel(tmp_path / "base.whl", BASE_FILES, "vllm-0.26.0")
    damaged = tmp_path / "damaged.whl"
    with zipfile.ZipFile(base) as source, zipfile.ZipFile(damaged, "w", zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            data = source.read(info)
            out.writestr(info, data[::-1] if info.filename == "vllm/_C.abi3.so" else data)
    with pytest.raises(OverlayError, match=r"does not match the wheel's RECORD.*Fix: download"):
        make_stub(str(damaged), str(tmp_path / "stub.whl"), MIN)
    assert not (tmp_path / "stub.whl").exists()


def test_stub_for_makes_one_stub_per_wheel_content(tmp_path: Path) -> None:
    base = _wheel(tmp_path / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", BASE_FILES, "vllm-0.26.0")
    cache = tmp_path / "cache"
    first = stub_for(str(base), str(cache), MIN)
    assert os.path.basename(first) == base.name
    stamp = json.loads((Path(first).parent / ".stub.json").read_text())
    assert stamp["base_sha256"] == hashlib.sha256(base.read_bytes()).hexdigest()
    made = os.stat(first).st_mtime_ns
    assert stub_for(str(base), str(cache), MIN) == first
    assert os.stat(first).st_mtime_ns == made  # reused, not made again
    _wheel(base, dict(BASE_FILES, **{"vllm/_C.abi3.so": LIB[::-1]}), "vllm-0.26.0")  # same name, new content
    assert stub_for(str(base), str(cache), MIN) != first


def test_a_wheel_without_a_record_is_refused(tmp_path: Path) -> None:
    bare = tmp_path / "bare.whl"
    with zipfile.ZipFile(bare, "w") as archive:
        archive.writestr("vllm/__init__.py", b"")
    with pytest.raises(OverlayError, match=r"0 \.dist-info/RECORD files, not one; it is not a wheel"):
        make_stub(str(bare), str(tmp_path / "stub.whl"), MIN)


def test_with_the_smallest_threshold_only_the_wheels_metadata_stays(tmp_path: Path) -> None:
    base = _wheel(tmp_path / "base.whl", BASE_FILES, "vllm-0.26.0")
    stub = tmp_path / "stub.whl"
    assert make_stub(str(base), str(stub), 1)["replaced"] == len(BASE_FILES)
    files = _contents(stub)
    assert all(data.startswith(PLACEHOLDER_MAGIC) for name, data in files.items() if name.startswith("vllm/"))
    assert files["vllm-0.26.0.dist-info/RECORD"] == _contents(base)["vllm-0.26.0.dist-info/RECORD"]
    result = overlay(str(_setup_py_build(stub, tmp_path / "built.whl", SOURCES)), str(base), str(tmp_path / "f.whl"))
    assert result["swapped"] == 3  # the .so, vllm-rs and the flash-attn file setup.py extracted
    assert _contents(tmp_path / "f.whl") == _contents(_setup_py_build(base, tmp_path / "expected.whl", SOURCES))


def _install(wheel: Path, site: Path, cache: Path) -> Path:
    """What uv does with a wheel: unpack it into its cache, hard-link the files into site-packages, and write
    direct_url.json and RECORD (with direct_url.json's line) as new files. Returns the dist-info."""
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            cached = cache / info.filename
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_bytes(archive.read(info))
            (site / info.filename).parent.mkdir(parents=True, exist_ok=True)
            os.link(cached, site / info.filename)
    dist_info = next(p for p in site.iterdir() if p.name.endswith(".dist-info"))
    url = json.dumps({"url": f"file://{wheel}", "archive_info": {}}, separators=(",", ":")).encode()
    (dist_info / "direct_url.json").write_bytes(url)
    record = (dist_info / "RECORD").read_bytes().decode()
    (dist_info / "RECORD").unlink()  # RECORD is linked from the cache: the installer writes a new one
    line = f"{dist_info.name}/direct_url.json,{_hash(url)},{len(url)}\n"
    (dist_info / "RECORD").write_text(record + line)
    return dist_info


def _tree(site: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(site)): p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()}


@pytest.fixture
def overlaid(tmp_path: Path):
    """A base wheel, its stub, the wheel built from the stub and the overlaid wheel (what the build keeps)."""
    base = _wheel(tmp_path / "base.whl", BASE_FILES, "vllm-0.26.0")
    (tmp_path / "stub").mkdir()
    stub = tmp_path / "stub" / "base.whl"
    make_stub(str(base), str(stub), MIN)
    from_stub = _setup_py_build(stub, tmp_path / "from-stub.whl", SOURCES)
    final = tmp_path / "final.whl"
    placeholders = overlay(str(from_stub), str(base), str(final))["placeholders"]
    sha = hashlib.sha256(final.read_bytes()).hexdigest()
    return {"base": base, "stub": stub, "from_stub": from_stub, "final": final, "sha": sha, "ph": placeholders}


def test_a_linked_install_equals_installing_the_overlaid_wheel(tmp_path: Path, overlaid) -> None:
    expected = tmp_path / "expected"
    _install(overlaid["final"], expected, tmp_path / "cache-final")
    members = unpack_members(str(overlaid["stub"]), str(overlaid["base"]))
    sites = []
    for release in ("one", "two"):
        site = tmp_path / release
        dist_info = _install(overlaid["from_stub"], site, tmp_path / f"cache-{release}")
        counts = link_installed(str(dist_info), overlaid["ph"], members, (str(overlaid["final"]), overlaid["sha"]))
        assert counts == {"linked": 2, "linked_bytes": len(LIB) + len(RUST), "copied": 0}
        assert _tree(site) == _tree(expected)  # same files, same bytes, RECORD and direct_url.json included
        sites.append(site)
    for name in ("vllm/_C.abi3.so", "vllm/vllm-rs"):
        # one copy on disk for every release, read-only (a write into one would change all)
        assert (sites[0] / name).samefile(sites[1] / name)
        assert (sites[0] / name).samefile(Path(members, name))
        assert os.stat(sites[0] / name).st_mode & 0o222 == 0
        # the installer's cache still holds the placeholder: nothing was written through its hard link
        assert (tmp_path / "cache-one" / name).read_bytes().startswith(PLACEHOLDER_MAGIC)
    assert not list(tmp_path.rglob("*.part"))


def test_unpack_members_once_per_stub(overlaid) -> None:
    members = unpack_members(str(overlaid["stub"]), str(overlaid["base"]))
    so = Path(members, "vllm/_C.abi3.so")
    assert so.read_bytes() == LIB and not Path(members, "vllm/__init__.py").exists()  # only the placeholders'
    made = os.stat(so).st_mtime_ns
    assert unpack_members(str(overlaid["stub"]), str(overlaid["base"])) == members
    assert os.stat(so).st_mtime_ns == made


def test_unpack_members_refuses_a_base_wheel_that_is_not_the_stubs(tmp_path: Path, overlaid) -> None:
    other = _wheel(tmp_path / "other.whl", dict(BASE_FILES, **{"vllm/_C.abi3.so": LIB[::-1]}), "vllm-0.26.0")
    with pytest.raises(OverlayError, match=r"does not match its stub .*Fix: remove"):
        unpack_members(str(overlaid["stub"]), str(other))
    assert not Path(overlaid["stub"].parent, "members", ".members.json").exists()  # not marked complete


def test_a_linked_install_refuses_a_changed_member_or_a_file_that_is_no_placeholder(tmp_path: Path, overlaid) -> None:
    members = unpack_members(str(overlaid["stub"]), str(overlaid["base"]))
    wheel = (str(overlaid["final"]), overlaid["sha"])
    dist_info = _install(overlaid["from_stub"], tmp_path / "site", tmp_path / "cache")
    so = Path(members, "vllm/_C.abi3.so")
    os.chmod(so, 0o644)
    so.write_bytes(LIB[::-1])
    with pytest.raises(OverlayError, match=r"no longer matches .*Fix: remove"):
        link_installed(str(dist_info), overlaid["ph"], members, wheel)
    fresh = tmp_path / "fresh"
    (fresh / "base.whl").parent.mkdir()
    os.link(overlaid["stub"], fresh / "base.whl")
    members = unpack_members(str(fresh / "base.whl"), str(overlaid["base"]))
    installed = tmp_path / "site" / "vllm" / "vllm-rs"
    installed.unlink()
    installed.write_bytes(b"not a placeholder")
    with pytest.raises(OverlayError, match=r"vllm-rs is not the placeholder of vllm/vllm-rs"):
        link_installed(str(dist_info), overlaid["ph"], members, wheel)
