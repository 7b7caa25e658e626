# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A precompiled build's wheel, tagged like the base wheel whose libraries it holds.

setuptools tags the wheel that vLLM's setup.py builds for the interpreter that built it
(`cp311-cp311-linux_x86_64` on a CPython 3.11 build host), although on the precompiled path every
compiled member is the base wheel's, byte for byte, and vLLM's release wheels are `cp38-abi3-manylinux_2_28`.
A fleet whose build host runs another Python than its GPU hosts (3.11 builds, 3.12 serves) could not
install the wheel it built. `base_tagged()` checks the claim member by member (each compiled member of
the built wheel has the hash the base wheel's RECORD gives it) and, when it holds, writes the wheel again
with the base wheel's tags: WHEEL's `Tag:` lines, RECORD's line for WHEEL and the file name. The other
members are copied raw (no inflating). When any compiled member is new or different, the build's own
tags stay, and the reason says which member.
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
from typing import Dict, List, Optional

from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_compat import (
    InvalidWheelFilename,
    parse_wheel_filename,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_overlay import (
    OverlayError,
    copy_raw,
    read_record,
    record_hash,
    write_record,
)

__all__ = ["TagResult", "base_tagged", "compiled_member", "wheel_tags"]

# Extension modules and shared libraries: what ties a wheel to an ABI or a platform.
_COMPILED = re.compile(r"\.(so|pyd|dylib)(\.[0-9.]+)?$")


def compiled_member(name: str) -> bool:
    """Whether a wheel member is compiled code (an extension module or a shared library)."""
    return bool(_COMPILED.search(name))


def wheel_tags(filename: str) -> str:
    """The compressed tag set of a wheel file name as it spells it: `cp38-abi3-manylinux_2_28_x86_64`."""
    name = os.path.basename(filename)
    try:
        parse_wheel_filename(name)  # packaging's PEP 427 check; the retagged name keeps the original spelling
    except InvalidWheelFilename as exc:
        raise OverlayError(
            f"{filename} is not a wheel file name (name-version-python-abi-platform.whl): {exc}"
        ) from exc
    return "-".join(name[: -len(".whl")].split("-")[-3:])


class TagResult:
    """What base_tagged did: the wheel's path, whether it was retagged, and why (or why not)."""

    def __init__(self, path: str, retagged: bool, reason: str, tags: str) -> None:
        self.path = path
        self.retagged = retagged
        self.reason = reason
        self.tags = tags

    def details(self) -> Dict[str, object]:
        return {"retagged": self.retagged, "reason": self.reason, "tags": self.tags}


def _foreign_member(built: zipfile.ZipFile, base: zipfile.ZipFile) -> Optional[str]:
    """The first compiled member of `built` that is not the base wheel's, byte for byte (by RECORD), or None."""
    _name, built_rows = read_record(built)
    _base_name, base_rows = read_record(base)
    base_hashes = {row[0]: row[1] for row in base_rows if len(row) >= 2}
    for row in built_rows:
        name = row[0]
        if not compiled_member(name):
            continue
        if len(row) < 2 or not row[1] or base_hashes.get(name) != row[1]:
            return name
    return None


def _wheel_file(archive: zipfile.ZipFile) -> str:
    names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/WHEEL")]
    if len(names) != 1:
        raise OverlayError(f"{archive.filename} has {len(names)} .dist-info/WHEEL files, not one; it is not a wheel")
    return names[0]


def _tag_lines(text: str) -> List[str]:
    return [line for line in text.splitlines() if line.startswith("Tag:")]


def base_tagged(built_wheel: str, base_wheel: str) -> TagResult:
    """`built_wheel` with `base_wheel`'s tags when its compiled members are all the base wheel's.

    The retagged wheel is written beside the built one (under a temporary name first) and replaces it;
    the returned path is the wheel to install. Raises OverlayError for a file that is not a wheel.
    """
    try:
        return _base_tagged(built_wheel, base_wheel)
    except zipfile.BadZipFile as exc:
        raise OverlayError(f"{built_wheel} or {base_wheel} is not a readable wheel ({exc})") from exc


def _base_tagged(built_wheel: str, base_wheel: str) -> TagResult:
    own, tags = wheel_tags(built_wheel), wheel_tags(base_wheel)
    if own == tags:
        return TagResult(built_wheel, False, f"the build's tags are the base wheel's ({tags})", tags)
    with zipfile.ZipFile(built_wheel) as built, zipfile.ZipFile(base_wheel) as base:
        foreign = _foreign_member(built, base)
        if foreign is not None:
            reason = (
                f"kept the build's tags {own}: {foreign} is not the base wheel's (compiled here), "
                f"so the wheel is only as portable as this build host"
            )
            return TagResult(built_wheel, False, reason, own)
        wheel_name = _wheel_file(built)
        wheel_text = built.read(wheel_name).decode("utf-8")
        base_lines = _tag_lines(base.read(_wheel_file(base)).decode("utf-8"))
        kept = [line for line in wheel_text.splitlines() if not line.startswith("Tag:")]
        new_wheel = ("\n".join(kept + base_lines) + "\n").encode("utf-8")
        record_name, rows = read_record(built)
        wheel_row = [wheel_name, record_hash(hashlib.sha256(new_wheel).digest()), str(len(new_wheel))]
        rows = [wheel_row if row[0] == wheel_name else row for row in rows]
        stem = os.path.basename(built_wheel)[: -len(".whl")].split("-")[:-3]
        dest = os.path.join(os.path.dirname(built_wheel), "-".join([*stem, tags]) + ".whl")
        tmp = dest + ".part"
        try:
            with zipfile.ZipFile(tmp, "w") as out:
                for info in built.infolist():
                    if info.filename in (wheel_name, record_name):
                        continue
                    copy_raw(built, info, out)
                for name, data in ((wheel_name, new_wheel), (record_name, write_record(rows))):
                    entry = zipfile.ZipInfo(name, built.getinfo(name).date_time)
                    entry.external_attr = built.getinfo(name).external_attr
                    entry.compress_type = zipfile.ZIP_DEFLATED
                    out.writestr(entry, data)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    os.replace(tmp, dest)
    if os.path.abspath(dest) != os.path.abspath(built_wheel):
        os.unlink(built_wheel)
    reason = f"tagged {tags} like the base wheel (was {own}): every compiled member is the base wheel's"
    return TagResult(dest, True, reason, tags)
