# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse vLLM version strings (PEP 440 as written by setuptools-scm) with `packaging.version`.

This runs on the target's system Python, where `packaging` may be missing, so PEP 440 itself is the
vendored `packaging.version` (_vendor/packaging, 24.2, the way ansible-core vendors libraries). On top of
it this splits the setuptools-scm local segments:
`0.29.1rc1.dev263+gb0b2f27da.d20260917.cu130` -> commit prefix `b0b2f27da`, dirty date `20260917`,
platform `cu130`.
"""

from __future__ import annotations

import re
from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

from ansible_collections.vllm_ops.dflash.plugins.module_utils._vendor.packaging.version import (
    InvalidVersion,
    Version,
)

__all__ = ["VersionError", "VllmVersion", "commit_matches", "parse_version", "same_commit"]

# setuptools-scm: `g<abbreviated commit>` (git never abbreviates below 7 by default) and `d<YYYYMMDD>`.
_COMMIT_SEGMENT = re.compile(r"^g([0-9a-f]{7,40})$")
_DIRTY_SEGMENT = re.compile(r"^d([0-9]{8})$")
_HEX = re.compile(r"^[0-9a-f]+$")


class VersionError(ValueError):
    """A version string that is not PEP 440, or a commit that is not hexadecimal."""


class VllmVersion(NamedTuple):
    """A parsed version. `local` is normalised (lower case, `.` separators); the last three fields are
    the setuptools-scm parts of `local`, None when absent."""

    text: str
    epoch: int
    release: Tuple[int, ...]
    pre: Optional[Tuple[str, int]]
    post: Optional[int]
    dev: Optional[int]
    local: Optional[str]
    commit_prefix: Optional[str]
    dirty_date: Optional[str]
    platform: Optional[str]

    @property
    def public(self) -> str:
        """The normalised version without its local part (`0.29.1rc1.dev263`)."""
        return Version(self.text).public

    def __str__(self) -> str:
        return self.public if self.local is None else f"{self.public}+{self.local}"

    def as_dict(self) -> Dict[str, Any]:
        """JSON-friendly form (the `version_info` fact): lists instead of tuples, `pre` as `rc1`."""
        return {
            "public": self.public,
            "epoch": self.epoch,
            "release": list(self.release),
            "pre": None if self.pre is None else f"{self.pre[0]}{self.pre[1]}",
            "post": self.post,
            "dev": self.dev,
            "local": self.local,
            "commit_prefix": self.commit_prefix,
            "dirty_date": self.dirty_date,
            "platform": self.platform,
        }


def parse_version(text: str) -> VllmVersion:
    """Parse `text`; raise VersionError when it is not a PEP 440 version."""
    if not isinstance(text, str):
        raise VersionError(f"version must be a string, got {type(text).__name__}")
    try:
        version = Version(text)
    except InvalidVersion:
        raise VersionError(
            f"{text!r} is not a PEP 440 version (expected e.g. 0.26.0 or 0.1.dev16016+g3cfc8f8b7); "
            "check the vllm distribution's METADATA"
        ) from None
    commit_prefix = dirty_date = None
    platform_segments = []
    for segment in version.local.split(".") if version.local else []:
        commit = _COMMIT_SEGMENT.match(segment)
        dirty = _DIRTY_SEGMENT.match(segment)
        if commit and commit_prefix is None:
            commit_prefix = commit.group(1)
        elif dirty and dirty_date is None:
            dirty_date = dirty.group(1)
        else:
            platform_segments.append(segment)
    return VllmVersion(
        text=text,
        epoch=version.epoch,
        release=version.release,
        pre=version.pre,
        post=version.post,
        dev=version.dev,
        local=version.local,
        commit_prefix=commit_prefix,
        dirty_date=dirty_date,
        platform=".".join(platform_segments) or None,
    )


def same_commit(prefix: str, commit: str) -> bool:
    """Whether two SHAs, full or abbreviated (at least 7 hex digits each), name the same commit."""
    shas = []
    for sha in (prefix, commit):
        text = sha.strip().lower() if isinstance(sha, str) else ""
        if not _HEX.match(text) or len(text) < 7:
            raise VersionError(f"commit {sha!r} is not a git SHA of at least 7 hex digits; pass the 40-hex commit id")
        shas.append(text)
    shorter = min(len(shas[0]), len(shas[1]))
    return shas[0][:shorter] == shas[1][:shorter]


def commit_matches(version: Union[str, VllmVersion], commit: str) -> Optional[bool]:
    """Whether the `g<hash>` in `version` is a prefix of `commit` (a full or abbreviated SHA).

    None when the version carries no hash (a tagged release such as `0.26.0` proves nothing either way).
    """
    parsed = version if isinstance(version, VllmVersion) else parse_version(version)
    if parsed.commit_prefix is None:
        same_commit(commit, commit)  # still reject a malformed commit
        return None
    return same_commit(parsed.commit_prefix, commit)
