# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A precompiled build of vLLM without inflating, copying and deflating its compiled libraries again.

vLLM's setup.py, on the precompiled path, copies members of the base wheel verbatim into the source tree
(`[extract] vllm/_C...so`), setuptools copies them twice more (build/lib, bdist dir) and deflates them
into the new wheel: measured on real vLLM 0.26.0 (2 cores), most of the build stage's time, for 730 MB of
bytes that end up unchanged. So the build is given a *stub* of the base wheel instead: the same members,
but each large one replaced by a small placeholder naming it; setup.py copies placeholders where it
would have copied libraries, and `overlay()` then writes the final wheel, taking each placeholder's
member raw (still compressed, CRC and all) from the base wheel and every other member raw from the built
wheel, with RECORD's lines for the swapped members set to the real hash and size.

The result holds the same files with the same bytes as vLLM's own build of that commit (setup.py still
decides which members go where; a placeholder found anywhere but under its own name refuses the wheel),
and RECORD stays valid. Only the zip members' timestamps differ: the base wheel's for swapped members.

The release is installed the same way round (`link_installed`): the wheel built from the stub (a few MB)
is installed, and each placeholder in the venv is replaced by a hard link to the base wheel's member,
unpacked once beside the stub (`unpack_members`) and checked against its hash on every use. The installer
never inflates the 650 MB of libraries again, its cache never holds them per release, and every release
built from one base wheel shares their disk blocks.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import shutil
import struct
import urllib.parse
import zipfile
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import CHUNK, sha256_file, sha256_stream

__all__ = [
    "MIN_SIZE",
    "OverlayError",
    "copy_raw",
    "link_installed",
    "make_stub",
    "overlay",
    "read_record",
    "record_hash",
    "stub_for",
    "unpack_members",
    "write_record",
]

# Members this large (vLLM's .so files, the rust frontend, the largest CUDA headers) get a placeholder.
MIN_SIZE = 1 << 20
PLACEHOLDER_MAGIC = b"vllm_ops.dflash wheel-overlay placeholder v1\n"
_STAMP = ".stub.json"
_MEMBERS = "members"
_MEMBERS_STAMP = ".members.json"


class OverlayError(Exception):
    """The stub or the overlay cannot be made; the message names the cause and the fix."""


def record_hash(digest: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _record_name(archive: zipfile.ZipFile) -> str:
    names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
    if len(names) != 1:
        raise OverlayError(f"{archive.filename} has {len(names)} .dist-info/RECORD files, not one; it is not a wheel")
    return names[0]


def read_record(archive: zipfile.ZipFile) -> Tuple[str, List[List[str]]]:
    import csv
    import io

    name = _record_name(archive)
    text = archive.read(name).decode("utf-8")
    return name, [row for row in csv.reader(io.StringIO(text)) if row]


def write_record(rows: List[List[str]]) -> bytes:
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows(rows)
    return out.getvalue().encode("utf-8")


def _placeholder(name: str, info: zipfile.ZipInfo, record_hash: str) -> bytes:
    fields = {"name": name, "hash": record_hash, "size": info.file_size, "crc": info.CRC}
    return PLACEHOLDER_MAGIC + json.dumps(fields, sort_keys=True).encode("utf-8") + b"\n"


def _parse_placeholder(data: bytes) -> Optional[Dict[str, Any]]:
    if not data.startswith(PLACEHOLDER_MAGIC):
        return None
    return json.loads(data[len(PLACEHOLDER_MAGIC) :].decode("utf-8"))


def make_stub(base_wheel: str, dest: str, min_size: int = MIN_SIZE) -> Dict[str, Any]:
    """Write `dest`: `base_wheel` with each member of `min_size` bytes or more replaced by its placeholder.

    Every replaced member is hashed as it is read, and checked against the base wheel's RECORD: a wheel
    whose libraries do not match its own RECORD is refused here, before any build. Returns counts.
    """
    try:
        return _make_stub(base_wheel, dest, min_size)
    except zipfile.BadZipFile as exc:
        raise OverlayError(f"{base_wheel} is not a readable wheel ({exc}). Fix: download it again") from exc


def _make_stub(base_wheel: str, dest: str, min_size: int) -> Dict[str, Any]:
    replaced = 0
    replaced_bytes = 0
    tmp = dest + ".part"
    with zipfile.ZipFile(base_wheel) as base:
        _record_name, rows = read_record(base)
        recorded = {row[0]: row[1] for row in rows if len(row) >= 2}
        with zipfile.ZipFile(tmp, "w") as stub:
            for info in base.infolist():
                # The wheel's own metadata stays: RECORD has no hash of itself, and setup.py extracts none of it.
                metadata = info.filename.split("/", 1)[0].endswith(".dist-info")
                if info.file_size < min_size or info.is_dir() or metadata:
                    copy_raw(base, info, stub)
                    continue
                with base.open(info) as member:
                    digest = sha256_stream(member)
                actual = record_hash(digest.digest())
                if recorded.get(info.filename) != actual:
                    raise OverlayError(
                        f"{info.filename} in {base_wheel} does not match the wheel's RECORD "
                        f"({recorded.get(info.filename)} recorded, {actual} read): the wheel is damaged. "
                        "Fix: download the base wheel again"
                    )
                stand_in = zipfile.ZipInfo(info.filename, info.date_time)
                stand_in.external_attr = info.external_attr  # setup.py chmods what it extracts from this
                stand_in.compress_type = zipfile.ZIP_STORED
                stub.writestr(stand_in, _placeholder(info.filename, info, actual))
                replaced += 1
                replaced_bytes += info.file_size
    os.replace(tmp, dest)
    return {"replaced": replaced, "replaced_bytes": replaced_bytes}


def stub_for(base_wheel: str, cache_dir: str, min_size: Optional[int] = None) -> str:
    """The stub of `base_wheel`, made once per wheel content under `cache_dir/<sha256[:16]>/`.

    Keeps the base wheel's file name (vLLM's setup.py only opens it, but a name that says what it is
    helps a person reading the build log). Safe to share between builds: written under a temporary
    name, and complete once its stamp exists.
    """
    min_size = MIN_SIZE if min_size is None else min_size
    digest = sha256_file(base_wheel)
    directory = os.path.join(cache_dir, f"{digest[:16]}-{min_size}")
    stub = os.path.join(directory, os.path.basename(base_wheel))
    stamp = os.path.join(directory, _STAMP)
    if os.path.isfile(stub) and os.path.isfile(stamp):
        return stub
    os.makedirs(directory, exist_ok=True)
    counts = make_stub(base_wheel, stub, min_size)
    with open(stamp + ".part", "w", encoding="utf-8") as handle:
        json.dump(dict(counts, base_sha256=digest, min_size=min_size), handle)
    os.replace(stamp + ".part", stamp)
    return stub


# Where a member's data starts: after its local header, whose name and extra lengths can differ from the
# central directory's (zipfile reads them the same way in ZipFile.open).
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")


def _data_offset(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> int:
    handle = archive.fp
    if handle is None:
        raise OverlayError(f"{archive.filename} is closed; cannot read {info.filename}")
    handle.seek(info.header_offset)
    fields = _LOCAL_HEADER.unpack(handle.read(_LOCAL_HEADER.size))
    if fields[0] != b"PK\x03\x04":
        raise OverlayError(f"{archive.filename}: bad local header for {info.filename}; the wheel is damaged")
    return info.header_offset + _LOCAL_HEADER.size + fields[10] + fields[11]


def copy_raw(source: zipfile.ZipFile, info: zipfile.ZipInfo, out: zipfile.ZipFile, name: Optional[str] = None) -> None:
    """Append `info` of `source` to `out` as stored bytes: no inflating, no deflating.

    zipfile has no public raw copy; this writes the local header with ZipInfo.FileHeader and registers
    the entry the way ZipFile.write does, so close() writes a central directory that covers it.
    """
    entry = zipfile.ZipInfo(name or info.filename, info.date_time)
    entry.compress_type = info.compress_type
    entry.external_attr = info.external_attr
    entry.create_system = info.create_system
    entry.flag_bits = info.flag_bits & 0x800  # keep "UTF-8 name"; sizes go in the header, no data descriptor
    entry.CRC = info.CRC
    entry.compress_size = info.compress_size
    entry.file_size = info.file_size
    zip64 = entry.file_size > zipfile.ZIP64_LIMIT or entry.compress_size > zipfile.ZIP64_LIMIT
    start = _data_offset(source, info)
    handle = out.fp
    if handle is None or source.fp is None:
        raise OverlayError(f"{source.filename} or the wheel being written is closed; cannot copy {info.filename}")
    entry.header_offset = handle.tell()
    handle.write(entry.FileHeader(zip64))
    source.fp.seek(start)
    remaining = info.compress_size
    while remaining:
        chunk = source.fp.read(min(CHUNK, remaining))
        if not chunk:
            raise OverlayError(f"{source.filename} ends inside {info.filename}; the wheel is damaged")
        handle.write(chunk)
        remaining -= len(chunk)
    out.filelist.append(entry)
    out.NameToInfo[entry.filename] = entry
    out.start_dir = handle.tell()


def overlay(built_wheel: str, base_wheel: str, dest: str) -> Dict[str, Any]:
    """Write `dest` from `built_wheel` (made from a stub), with each placeholder swapped for `base_wheel`'s member.

    Raises OverlayError when a placeholder sits under another member's name, names a member the base
    wheel lacks or holds differently (the base wheel changed since its stub was made), or when RECORD
    does not list a swapped member. Returns counts.
    """
    try:
        return _overlay(built_wheel, base_wheel, dest)
    except zipfile.BadZipFile as exc:
        raise OverlayError(f"{built_wheel} or {base_wheel} is not a readable wheel ({exc})") from exc


def _overlay(built_wheel: str, base_wheel: str, dest: str) -> Dict[str, Any]:
    swapped = 0
    swapped_bytes = 0
    tmp = dest + ".part"
    with zipfile.ZipFile(built_wheel) as built, zipfile.ZipFile(base_wheel) as base:
        record_name, rows = read_record(built)
        placeholders: Dict[str, Dict[str, Any]] = {}
        limit = len(PLACEHOLDER_MAGIC) + 4096
        for info in built.infolist():
            if info.file_size <= limit and not info.is_dir():
                found = _parse_placeholder(built.read(info))
                if found is not None:
                    if found.get("name") != info.filename:
                        raise OverlayError(
                            f"{built_wheel}: {info.filename} holds the placeholder of {found.get('name')}; the build "
                            "moved a precompiled member. Fix: build without the overlay (plain VLLM_USE_PRECOMPILED)"
                        )
                    placeholders[info.filename] = found
        lines = {row[0]: index for index, row in enumerate(rows)}
        for name, found in placeholders.items():
            try:
                original = base.getinfo(name)
            except KeyError:
                raise OverlayError(
                    f"{base_wheel} has no {name} for its placeholder; the stub is of another wheel. "
                    "Fix: remove the stub cache"
                ) from None
            if (original.file_size, original.CRC) != (found["size"], found["crc"]):
                raise OverlayError(
                    f"{name} in {base_wheel} changed since its stub was made. Fix: remove the stub cache"
                )
            if name not in lines:
                raise OverlayError(f"{built_wheel}'s RECORD does not list {name}; the wheel is not complete")
            rows[lines[name]] = [name, found["hash"], str(found["size"])]
        try:
            with zipfile.ZipFile(tmp, "w") as out:
                for info in built.infolist():
                    if info.filename == record_name:
                        continue
                    if info.filename in placeholders:
                        copy_raw(base, base.getinfo(info.filename), out)
                        swapped += 1
                        swapped_bytes += placeholders[info.filename]["size"]
                    else:
                        copy_raw(built, info, out)
                record = built.getinfo(record_name)
                entry = zipfile.ZipInfo(record_name, record.date_time)
                entry.external_attr = record.external_attr
                entry.compress_type = zipfile.ZIP_DEFLATED
                out.writestr(entry, write_record(rows))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    os.replace(tmp, dest)
    return {"swapped": swapped, "swapped_bytes": swapped_bytes, "members": len(rows), "placeholders": placeholders}


def unpack_members(stub: str, base_wheel: str) -> str:
    """The base wheel's members that `stub` holds placeholders for, unpacked once to `<stub dir>/members/`.

    Each is checked against the hash its placeholder records (the base wheel's RECORD) as it is written,
    and made read-only: it is hard-linked into every release built from this base wheel, so a write into
    one would change them all. Complete once its stamp exists. Returns the directory.
    """
    directory = os.path.join(os.path.dirname(stub), _MEMBERS)
    stamp = os.path.join(directory, _MEMBERS_STAMP)
    if os.path.isfile(stamp):
        return directory
    unpacked = 0
    try:
        with zipfile.ZipFile(stub) as stub_zip, zipfile.ZipFile(base_wheel) as base:
            for info in stub_zip.infolist():
                found = (
                    _parse_placeholder(stub_zip.read(info)) if info.file_size <= 4096 + len(PLACEHOLDER_MAGIC) else None
                )
                if found is None:
                    continue
                target = os.path.join(directory, *info.filename.split("/"))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with base.open(info.filename) as member, open(target + ".part", "wb") as out:
                    digest = sha256_stream(member, copy_to=out)
                if record_hash(digest.digest()) != found["hash"]:
                    os.unlink(target + ".part")
                    raise OverlayError(
                        f"{info.filename} in {base_wheel} does not match its stub ({found['hash']}). "
                        f"Fix: remove {os.path.dirname(stub)} (the stub is made again)"
                    )
                mode = (info.external_attr >> 16) & 0o555 or 0o444
                os.chmod(target + ".part", mode)
                os.replace(target + ".part", target)
                unpacked += 1
    except (KeyError, zipfile.BadZipFile) as exc:
        raise OverlayError(
            f"{base_wheel} does not hold what its stub {stub} names ({exc}). Fix: remove the stub"
        ) from exc
    with open(stamp + ".part", "w", encoding="utf-8") as handle:
        json.dump({"members": unpacked}, handle)
    os.replace(stamp + ".part", stamp)
    return directory


def _replace_file(path: str, data: bytes) -> None:
    """Write `path` anew (never in place: an installed file may be a hard link into the installer's cache)."""
    with open(path + ".part", "wb") as handle:
        handle.write(data)
    os.replace(path + ".part", path)


def link_installed(
    dist_info: str, placeholders: Dict[str, Dict[str, Any]], members: str, wheel: Optional[Tuple[str, str]] = None
) -> Dict[str, int]:
    """Replace each placeholder that the installed `dist_info` lists by a hard link to its unpacked member.

    Every installed file is checked to be the placeholder of its own name first, and every member against
    its hash (a shared file changed since it was unpacked is refused). RECORD then names the real hash
    and size, as installing the overlaid wheel writes it; direct_url.json names `wheel` ((path, sha256):
    the overlaid wheel the release keeps). Files are replaced, never written in place. Raises OverlayError (the caller
    installs the overlaid wheel instead). Returns counts.
    """
    site = os.path.dirname(dist_info)
    record_path = os.path.join(dist_info, "RECORD")
    try:
        with open(record_path, encoding="utf-8") as handle:
            rows = [row for row in csv.reader(handle) if row]
    except OSError as exc:
        raise OverlayError(f"cannot read the installed {record_path} ({exc})") from exc
    lines = {row[0]: index for index, row in enumerate(rows)}
    counts = {"linked": 0, "linked_bytes": 0, "copied": 0}
    for name, found in sorted(placeholders.items()):
        target = os.path.join(site, *name.split("/"))
        member = os.path.join(members, *name.split("/"))
        if name not in lines:
            raise OverlayError(f"the installed RECORD of {dist_info} does not list {name}")
        try:
            with open(target, "rb") as handle:
                installed = _parse_placeholder(handle.read(len(PLACEHOLDER_MAGIC) + 4096))
        except OSError as exc:
            raise OverlayError(f"the installed {target} cannot be read ({exc})") from exc
        if installed is None or installed.get("name") != name or installed.get("hash") != found["hash"]:
            raise OverlayError(f"the installed {target} is not the placeholder of {name}")
        if not os.path.isfile(member) or record_hash(bytes.fromhex(sha256_file(member))) != found["hash"]:
            raise OverlayError(
                f"{member} is missing or no longer matches {found['hash']}; releases built earlier from this base "
                f"wheel share it. Fix: remove {os.path.dirname(members)} and rebuild them"
            )
        try:
            os.link(member, target + ".part")
            counts["linked"] += 1
        except OSError:  # another file system, or no hard links there: a copy, same bytes
            shutil.copy2(member, target + ".part")
            counts["copied"] += 1
        os.replace(target + ".part", target)
        counts["linked_bytes"] += int(found["size"])
        rows[lines[name]] = [name, found["hash"], str(found["size"])]
    direct_url = os.path.join(dist_info, "direct_url.json")
    relative = f"{os.path.basename(dist_info)}/direct_url.json"
    if wheel and os.path.isfile(direct_url) and relative in lines:
        with open(direct_url, encoding="utf-8") as handle:
            data = json.load(handle)
        data["url"] = "file://" + urllib.parse.quote(os.path.abspath(wheel[0]), safe="/+")
        archive = data.get("archive_info")
        if isinstance(archive, dict) and ("hash" in archive or "hashes" in archive):  # pip records one
            archive.pop("hash", None)
            archive["hashes"] = {"sha256": wheel[1]}
        text = json.dumps(data, separators=(",", ":")).encode("utf-8")
        _replace_file(direct_url, text)
        rows[lines[relative]] = [relative, record_hash(hashlib.sha256(text).digest()), str(len(text))]
    relative = f"{os.path.basename(dist_info)}/WHEEL"
    if wheel and relative in lines:  # the kept wheel's tags (_wheel_tags may have given it the base wheel's)
        with zipfile.ZipFile(wheel[0]) as kept:
            tags = kept.read(relative) if relative in kept.namelist() else None
        if tags is not None:
            _replace_file(os.path.join(dist_info, "WHEEL"), tags)
            rows[lines[relative]] = [relative, record_hash(hashlib.sha256(tags).digest()), str(len(tags))]
    _replace_file(record_path, write_record(rows))
    return counts
