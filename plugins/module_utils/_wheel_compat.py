# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a wheel installs here: its file name's tags against the tags a python on this host supports.

packaging (vendored: the module runs on the host's python, which may lack it) parses the name
(`utils.parse_wheel_filename`) and lists the supported tags as `tags.sys_tags()` does, with one change:
`sys_tags()` answers for the python running it, which is Ansible's, while the wheel is installed into the
release venv, whose python (`python` / vllm_python) may be another version (3.10 runs the module, 3.12
the venv). So the interpreter tags are the venv python's - CPython <major>.<minor>, the version probed by
running it (vLLM supports CPython only) - and the platform tags are this host's, which both pythons share:
the machine, and the glibc (or musl) version that packaging's own probes read (os.confstr, the running
interpreter's ELF header). A manylinux_2_39 wheel is refused on a glibc 2.35 host, as pip there would.
"""

from __future__ import annotations

import sys
from typing import FrozenSet, List, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._vendor.packaging import _manylinux, _musllinux
from ansible_collections.vllm_ops.dflash.plugins.module_utils._vendor.packaging.tags import (
    Tag,
    compatible_tags,
    cpython_tags,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._vendor.packaging.utils import (
    InvalidWheelFilename,
    parse_wheel_filename,
)

__all__ = [
    "InvalidWheelFilename",
    "host_libc",
    "parse_wheel_filename",
    "platform_fits",
    "python_fits",
    "supported_tags",
]


def _python(python_version: str) -> Tuple[int, int]:
    major, minor = python_version.split(".")[:2]
    return int(major), int(minor)


def _platforms(machine: str) -> List[str]:
    """This host's platform tags, most specific first (packaging.tags._linux_platforms for `machine`)."""
    return [*_manylinux.platform_tags([machine]), *_musllinux.platform_tags([machine]), f"linux_{machine}"]


def supported_tags(python_version: str, machine: str) -> List[Tag]:
    """The tags CPython `python_version` on this host installs, in pip's order of preference."""
    version = _python(python_version)
    interpreter = f"cp{version[0]}{version[1]}"
    platforms = _platforms(machine)
    return [*cpython_tags(version, [interpreter], platforms), *compatible_tags(version, interpreter, platforms)]


def python_fits(tags: FrozenSet[Tag], python_version: str) -> bool:
    """Whether any of the wheel's tags is for CPython `python_version` (its interpreter and ABI), any platform."""
    wanted = {(tag.interpreter, tag.abi) for tag in supported_tags(python_version, "any")}
    return any((tag.interpreter, tag.abi) in wanted for tag in tags)


def platform_fits(tags: FrozenSet[Tag], python_version: Optional[str], machine: str) -> bool:
    """Whether any of the wheel's tags installs on this host with CPython `python_version` (with None: any
    tag's platform is this host's, whatever its Python)."""
    if python_version is None:
        platforms = {*_platforms(machine), "any"}
        return any(tag.platform in platforms for tag in tags)
    return not tags.isdisjoint(supported_tags(python_version, machine))


def host_libc() -> Optional[str]:
    """This host's C library as the platform tags see it (`glibc 2.35`, `musl 1.2`), or None."""
    glibc = _manylinux._get_glibc_version()
    if glibc[0] >= 0:
        return f"glibc {glibc[0]}.{glibc[1]}"
    musl = _musllinux._get_musl_version(sys.executable)
    return f"musl {musl.major}.{musl.minor}" if musl else None
