# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where a build writes under `root`: the release (or its staged copy), its wheel, its build directory, its log.

The release layout itself (releases/, manifest.json, current, wheels/) is _releases' own; this file only
adds what a build needs beside it (build/<name>/, logs/, the staging prefix).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, List, Optional

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import read_json, utc_now
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import (
    WHEELS_DIR,
    current_path,
    manifest_path,
    release_path,
)

__all__ = [
    "STAGING_PREFIX",
    "Paths",
    "builds_beside",
    "log_path",
    "read_manifest",
    "relocate_venv",
    "serving",
    "wheels_path",
]

# A release built beside the one `current` names (releases/.building-<name>), swapped in when complete.
STAGING_PREFIX = ".building-"


def log_path(root: str, label: str) -> str:
    return os.path.join(root, "logs", f"build-{label}-{utc_now().replace('-', '').replace(':', '')}.log")


def wheels_path(root: str, name: str) -> str:
    """wheels/<name>/: the wheel of the release `name`, kept for a rebuild of the same inputs."""
    return os.path.join(root, WHEELS_DIR, name)


class Paths:
    """Where one release attempt writes. `staging`: the release is built beside its final place (which
    `current` names) and swapped in at the end, so what serves is never removed or rebuilt in place."""

    def __init__(self, root: str, name: str, log: Optional[str] = None, staging: bool = False) -> None:
        self.root = root
        self.final = release_path(root, name)
        self.release = release_path(root, STAGING_PREFIX + name) if staging else self.final
        self.venv = os.path.join(self.release, "venv")
        self.manifest = manifest_path(self.release)
        self.wheels = wheels_path(root, name)
        self.build = os.path.join(root, "build", name)
        self.src = os.path.join(self.build, "src")
        self.dist = os.path.join(self.build, "dist")
        # TMPDIR of every step: pip's and uv's build environments (torch included: GBs for vLLM) go with
        # the build directory, also after a kill.
        self.tmp = os.path.join(self.build, "tmp")
        self.requirements = os.path.join(self.build, "build-requirements.txt")
        self.from_stub = os.path.join(self.build, "from-stub")  # the wheel built from the stub, installed
        self.log = log or log_path(root, name)


def read_manifest(release: str) -> Optional[Dict[str, Any]]:
    """The manifest of a complete release; None when it is missing, not JSON or not an object: such a
    release is incomplete and is built again (beside it when `current` names it), never an error."""
    try:
        manifest = read_json(manifest_path(release), None)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def serving(root: str) -> Optional[str]:
    """The release name `current` points to (what serves), or None."""
    with contextlib.suppress(OSError):
        return os.path.basename(os.path.normpath(os.readlink(current_path(root))))
    return None


def builds_beside(root: str, name: str) -> bool:
    """Whether the release `name` is built beside its place: `current` names it but it has no valid manifest
    (what serves is never removed or rebuilt in place)."""
    return serving(root) == name and os.path.lexists(release_path(root, name))


def relocate_venv(venv: str, old: str, new: str) -> List[str]:
    """Make the venv at `venv`, created as `old`, right for the path `new`: its scripts' shebangs, the
    activate files and pyvenv.cfg name the path the venv was created at (its python finds itself).
    Returns the files rewritten (each replaced, never written through a hard link)."""
    rewritten = []
    candidates = [os.path.join(venv, "pyvenv.cfg")]
    bin_dir = os.path.join(venv, "bin")
    with contextlib.suppress(FileNotFoundError):
        candidates += [os.path.join(bin_dir, name) for name in os.listdir(bin_dir)]
    for path in candidates:
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 1024**2:
            continue
        with open(path, "rb") as handle:
            data = handle.read()
        if old.encode() in data:
            mode = os.stat(path).st_mode
            tmp = path + ".relocate"
            with open(tmp, "wb") as handle:
                handle.write(data.replace(old.encode(), new.encode()))
            os.chmod(tmp, mode)
            os.replace(tmp, path)
            rewritten.append(path)
    return rewritten
