# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The name of a release: a function of the commit (or package and version) and the build inputs.

Apart from the release attempt (_build_release) so that the look (vllm_drift, _build_lookup) names a release
without importing what builds one.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import canonical_package

__all__ = ["inputs_hash", "named", "release_name"]


def inputs_hash(inputs: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the build inputs."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def release_name(commit: Optional[str], digest: str, version: Optional[str] = None, package: str = "vllm") -> str:
    """The one naming function: `<sha12>-<inputs8>` of a git commit, `<package>-<version>-<inputs8>` of a
    release from an index (_release_install). _releases.RELEASE_NAME matches both."""
    if version:
        return f"{canonical_package(package)}-{version}-{digest[:8]}"
    return f"{(commit or '')[:12]}-{digest[:8]}"


def named(commit: str, inputs: Mapping[str, Any], use_precompiled: bool) -> Tuple[str, str]:
    """(digest, release name): the precompiled decision is a build input, its environment is not."""
    digest = inputs_hash(dict(inputs, precompiled=use_precompiled))
    return digest, release_name(commit, digest)
