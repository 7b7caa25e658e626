# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Decide whether a vLLM build may reuse compiled libraries instead of compiling them.

vLLM's setup.py builds Python-only changes fast with `VLLM_USE_PRECOMPILED=1`: it copies the compiled
modules out of a base wheel (`VLLM_PRECOMPILED_WHEEL_LOCATION`, else the nightly wheel of the merge-base
with upstream main). That is only right when the ref changes no compiled source. `auto` therefore asks
git which files changed between the ref and its merge-base with the upstream branch, and uses the
precompiled path only when none is under COMPILED_PATHS **and** a base wheel is known: `precompiled_wheel`,
or the wheel of an earlier release on this host with the same build inputs whose commit has the same
compiled sources as the ref. Without a known base wheel auto builds in full: vLLM's own lookup needs the
network and a nightly wheel of that exact commit, which an air-gapped host or a fork does not have
(`always` opts into it).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import read_json, redact_url
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import changed_paths, commit_exists, merge_base

__all__ = [
    "COMPILED_PATHS",
    "MODES",
    "BaseWheel",
    "Decision",
    "PrecompiledError",
    "compile_inputs",
    "compiled_changes",
    "compiled_from_its_sources",
    "decide",
    "local_base_wheels",
    "needs_git",
    "parse_base",
]

MODES = ("auto", "always", "never")
# What vLLM compiles from, or what decides how it compiles (build requirements pin torch).
COMPILED_PATHS = ("csrc/", "cmake/", "CMakeLists.txt", "setup.py", "requirements/")
AREAS = " ".join(COMPILED_PATHS)
MERGE_BASE_PLACEHOLDER = "{merge_base}"
SHOWN_PATHS = 5
MAX_CANDIDATES = 10


class PrecompiledError(Exception):
    """The precompiled options cannot be honoured; the message names the fix."""


class BaseWheel:
    """A wheel of an earlier release on this host that could lend its compiled modules."""

    def __init__(self, release: str, commit: str, path: str, built_at: str) -> None:
        self.release = release
        self.commit = commit
        self.path = path
        self.built_at = built_at

    def __repr__(self) -> str:
        return f"BaseWheel({self.release})"


class Decision:
    """Whether this build uses the precompiled path, and why (one sentence a person can check)."""

    def __init__(
        self,
        use: bool,
        mode: str,
        reason: str,
        wheel_location: Optional[str] = None,
        merge_base: Optional[str] = None,
        base: Optional[str] = None,
        base_release: Optional[str] = None,
        changed_files: Optional[int] = None,
        compiled_changed: Sequence[str] = (),
        decided: bool = True,
    ) -> None:
        self.use = use
        self.mode = mode
        self.reason = reason
        self.wheel_location = wheel_location
        self.merge_base = merge_base
        self.base = base
        self.base_release = base_release
        self.changed_files = changed_files
        self.compiled_changed = list(compiled_changed)
        self.decided = decided

    def env(self) -> Dict[str, str]:
        """The environment vLLM's setup.py reads (empty for a full build)."""
        if not self.use:
            return {}
        env = {"VLLM_USE_PRECOMPILED": "1"}
        if self.wheel_location:
            env["VLLM_PRECOMPILED_WHEEL_LOCATION"] = self.wheel_location
        return env

    def details(self) -> Dict[str, Any]:
        return {
            "used": self.use,
            "mode": self.mode,
            "reason": self.reason,
            "wheel_location": redact_url(self.wheel_location) if self.wheel_location else None,
            "merge_base": self.merge_base,
            "base": redact_url(self.base) if self.base else None,
            "base_release": self.base_release,
            "changed_files": self.changed_files,
            "compiled_changed": self.compiled_changed[:50],
        }

    def __repr__(self) -> str:
        return f"Decision({self.use}: {self.reason})"


def parse_base(spec: str) -> Tuple[Optional[str], str]:
    """`main` -> (None, "main"): a ref of the repository being built; `<url>#<ref>` -> (url, ref)."""
    spec = (spec or "").strip()
    url, sep, ref = spec.rpartition("#")
    if not sep:
        url, ref = "", spec
    if not ref or (sep and not url):
        raise PrecompiledError(
            f"precompiled_base {redact_url(spec)!r} is not a ref or `<url>#<ref>`; give e.g. `main` or "
            "`https://github.com/vllm-project/vllm.git#main`"
        )
    return (url or None), ref


def _touches_compiled(path: str) -> bool:
    for prefix in COMPILED_PATHS:
        if prefix.endswith("/"):
            if path.startswith(prefix):
                return True
        elif path == prefix or (prefix == "CMakeLists.txt" and path.endswith("/CMakeLists.txt")):
            return True
    return False


def compiled_changes(paths: Sequence[str]) -> List[str]:
    """The paths among `paths` that a compiled module may depend on."""
    return [path for path in paths if _touches_compiled(path)]


def compile_inputs(inputs: Mapping[str, Any]) -> Dict[str, Any]:
    """The build inputs that decide what the compiler produces: all of them but the decision itself."""
    return {key: value for key, value in inputs.items() if key != "precompiled"}


def compiled_from_its_sources(manifest: Mapping[str, Any]) -> bool:
    """Whether a release's compiled modules match its own commit: a full build, or a precompiled one that
    `auto` decided from the diff. One forced with `always` was never checked against its sources."""
    return not manifest.get("precompiled") or (manifest.get("precompiled_details") or {}).get("mode") == "auto"


def local_base_wheels(root: str, inputs: Mapping[str, Any]) -> List[BaseWheel]:
    """Wheels of complete releases under `root` built with the same compile inputs, newest first.

    Only releases whose compiled modules match their own commit: full builds and auto-precompiled ones.
    """
    releases = os.path.join(root, "releases")
    if not os.path.isdir(releases):
        return []
    wanted = compile_inputs(inputs)
    found = []
    for name in os.listdir(releases):
        if name.startswith("."):
            continue
        try:
            manifest = read_json(os.path.join(releases, name, "manifest.json"), None)
        except ValueError:
            continue  # a corrupt manifest lends nothing; vllm_release reports it
        if not isinstance(manifest, dict) or not isinstance(manifest.get("inputs"), dict):
            continue
        wheel = (manifest.get("wheel") or {}).get("path") or ""
        commit = manifest.get("commit") or ""
        if (
            compiled_from_its_sources(manifest)
            and compile_inputs(manifest["inputs"]) == wanted
            and commit
            and os.path.isfile(wheel)
        ):
            found.append(BaseWheel(name, commit, wheel, str(manifest.get("built_at") or "")))
    return sorted(found, key=lambda base: (base.built_at, base.release), reverse=True)


def _files(count: int) -> str:
    return f"{count} file{'s' if count != 1 else ''}"


def _location(wheel: str, merge_base_sha: Optional[str]) -> str:
    if MERGE_BASE_PLACEHOLDER in wheel:
        if not merge_base_sha:
            raise PrecompiledError(
                f"precompiled_wheel {redact_url(wheel)!r} names {MERGE_BASE_PLACEHOLDER} but the merge-base is unknown"
            )
        wheel = wheel.replace(MERGE_BASE_PLACEHOLDER, merge_base_sha)
    if "://" not in wheel and not os.path.isfile(wheel):
        raise PrecompiledError(
            f"precompiled_wheel {wheel!r} is not a file on this host; give the path or URL of the base commit's wheel"
        )
    return wheel


def needs_git(mode: str, wheel: Optional[str]) -> bool:
    """Whether the decision reads the repository (auto, or a wheel location naming the merge-base)."""
    return mode == "auto" or MERGE_BASE_PLACEHOLDER in (wheel or "")


def decide(
    mode: str,
    wheel: Optional[str] = None,
    commit: Optional[str] = None,
    mirror: Optional[str] = None,
    base_commit: Optional[str] = None,
    base_label: str = "main",
    candidates: Sequence[BaseWheel] = (),
) -> Decision:
    """The decision for building `commit` (present in `mirror`, as is `base_commit`).

    `never` and `always` need no repository unless `wheel` names {merge_base}. `candidates` are the local
    base wheels (local_base_wheels); the one of the merge-base is preferred, then the newest.
    """
    if mode not in MODES:
        raise PrecompiledError(f"precompiled {mode!r} is not one of {', '.join(MODES)}")
    if mode == "never":
        return Decision(False, mode, "precompiled: never: full build")
    merged = None
    if needs_git(mode, wheel):
        if not (mirror and commit and base_commit):
            raise PrecompiledError("the precompiled decision needs the commit and the base in the mirror")
        merged = merge_base(mirror, commit, base_commit)
    if mode == "always":
        location = _location(wheel, merged) if wheel else None
        where = f"base wheel {redact_url(location)}" if location else "vLLM looks up the base wheel itself"
        return Decision(True, mode, f"precompiled: always (the diff is not checked; {where})", location, merged)
    if merged is None:
        reason = f"{(commit or '')[:12]} shares no history with {base_label} ({(base_commit or '')[:12]}): full build"
        return Decision(False, mode, reason, base=base_label)
    changed = changed_paths(mirror or "", merged, commit or "")
    compiled = compiled_changes(changed)

    def made(use: bool, reason: str, location: Optional[str] = None, lender: Optional[str] = None) -> Decision:
        return Decision(use, mode, reason, location, merged, base_label, lender, len(changed), compiled)

    since = f"{_files(len(changed))} changed since merge-base {merged[:12]} with {base_label}"
    if compiled:
        shown = ", ".join(compiled[:SHOWN_PATHS]) + (", ..." if len(compiled) > SHOWN_PATHS else "")
        return made(False, f"{since}, {len(compiled)} under {AREAS} ({shown}): full build")
    since += f", none under {AREAS}"
    if wheel:
        location = _location(wheel, merged)
        return made(True, f"{since}: precompiled (base wheel {redact_url(location)})", location)
    lender = _same_compiled_sources(mirror or "", commit or "", merged, candidates)
    if lender is not None:
        reason = f"{since}: precompiled from the wheel of release {lender.release} (same compiled sources)"
        return made(True, reason, lender.path, lender.release)
    return made(
        False,
        f"{since}, but no base wheel (no precompiled_wheel given, and no release on this host has the same "
        "compiled sources and build inputs): full build",
    )


def _same_compiled_sources(
    mirror: str, commit: str, merged: str, candidates: Sequence[BaseWheel]
) -> Optional[BaseWheel]:
    ordered = sorted(candidates, key=lambda base: base.commit != merged)  # stable: newest first otherwise
    for base in ordered[:MAX_CANDIDATES]:
        if not commit_exists(mirror, base.commit):
            continue  # installed from a wheel of a repository this mirror does not hold
        if base.commit == commit or not compiled_changes(changed_paths(mirror, base.commit, commit)):
            return base
    return None
