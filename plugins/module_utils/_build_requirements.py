# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The build requirements of a checkout, for a build without isolation (`--no-build-isolation`).

Without isolation the wheel builds against what the release venv holds, so the ref's own build
requirements go there first, as vLLM's docs do it (`uv pip install -r requirements/build/cuda.txt`,
then `--no-build-isolation`). Read from the checkout, first found wins:
`requirements/build/<VLLM_TARGET_DEVICE>.txt` (vLLM >= 0.2x), `requirements/build.txt` (older vLLM),
then `[build-system] requires` of pyproject.toml. With a torch the venv already sees (system site
packages) the torch lines are left out, as vLLM's `use_existing_torch.py` does.
"""

from __future__ import annotations

import os
import re
from typing import List, Optional

from ansible_collections.vllm_ops.dflash.plugins.module_utils._pep517 import pyproject_table

__all__ = ["BuildRequirements", "build_requirements"]

DEFAULT_DEVICE = "cuda"
_TORCH = re.compile(r"^\s*torch\s*(?:[=<>!~;\[@ ]|$)", re.IGNORECASE)
_INCLUDE = re.compile(r"^(\s*(?:-r|-c|--requirement|--constraint)(?:\s+|=))(\S+)(.*)$")


class BuildRequirements:
    """What to install before the wheel build: the source (a path in the checkout) and the requirement
    file to give the installer (`-r <file>`)."""

    def __init__(self, source: str, file: str, skipped: List[str]) -> None:
        self.source = source
        self.file = file
        self.skipped = skipped  # lines left out (torch, when the venv has one)

    def __repr__(self) -> str:
        return f"BuildRequirements({self.source})"


def _absolute_includes(line: str, directory: str) -> str:
    """`-r other.txt` of a file read from `directory`, made absolute (the copy lives elsewhere)."""
    match = _INCLUDE.match(line)
    if not match or os.path.isabs(match.group(2)) or "://" in match.group(2):
        return line
    return match.group(1) + os.path.normpath(os.path.join(directory, match.group(2))) + match.group(3)


def build_requirements(src: str, dest: str, device: Optional[str], keep_torch: bool) -> Optional[BuildRequirements]:
    """The build requirements of the checkout `src`, written to the requirement file `dest`; None when the
    checkout declares none. `keep_torch=False` leaves the torch lines out (the venv already has torch)."""
    candidates = [os.path.join("requirements", "build", f"{device or DEFAULT_DEVICE}.txt")]
    candidates.append(os.path.join("requirements", "build.txt"))
    lines: Optional[List[str]] = None
    source = ""
    for relative in candidates:
        path = os.path.join(src, relative)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                directory = os.path.dirname(path)
                lines = [_absolute_includes(line.rstrip("\n"), directory) for line in handle]
            source = relative
            break
    if lines is None:
        requires = (pyproject_table(src) or {}).get("requires")
        if not requires or not isinstance(requires, list) or not all(isinstance(item, str) for item in requires):
            return None
        lines, source = list(requires), "pyproject.toml [build-system] requires"
    skipped = [] if keep_torch else [line.strip() for line in lines if _TORCH.match(line)]
    kept = [line for line in lines if keep_torch or not _TORCH.match(line)]
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest, "w", encoding="utf-8") as handle:
        handle.write("\n".join(kept) + "\n")
    return BuildRequirements(source, dest, skipped)
