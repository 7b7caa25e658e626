# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Decide whether a vLLM build may reuse compiled libraries instead of compiling them.

vLLM's setup.py builds Python-only changes fast with `VLLM_USE_PRECOMPILED=1`: it copies the compiled
modules out of a base wheel (`VLLM_PRECOMPILED_WHEEL_LOCATION`, else the wheel of
`VLLM_PRECOMPILED_WHEEL_COMMIT` on vLLM's index, else of the merge-base with upstream main, else - when
that lookup fails - the nightly). That is only right when the ref's compiled sources are those the base
wheel was built from. `auto` therefore diffs the ref against the base wheel's own commit
(`precompiled_wheel_commit`, or what the wheel says: `vllm/_version.py`, `+g<hash>`, the release tag)
and uses the precompiled path only when nothing under COMPILED_PATHS differs; without `precompiled_wheel`
it looks for the wheel of an earlier release on this host whose commit has the ref's compiled sources.
Without a known base wheel, or when the wheel's commit is not in the repository, auto builds in full.
`always` without a wheel pins VLLM_PRECOMPILED_WHEEL_COMMIT (the merge-base with precompiled_base, as
vLLM's own lookup would take) after checking the index has it: never the nightly.
A base wheel that is not a vLLM wheel, or is for another Python or platform, is refused before a build.

One file over 600 lines on purpose: decide() and what it alone reads (the base wheel's metadata and tags,
the index, the diff against the compiled paths); vllm_build's options are _build_decision's.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import platform
import re
import zipfile
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import unquote
from urllib.request import build_opener

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_lookup import compiled_from_its_sources
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import read_json, redact_url
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import (
    changed_paths,
    commit_exists,
    merge_base,
    normalize_repo,
    resolve_commit,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled_data import (
    COMPILED_PATHS,
    MODES,
    NOT_COMPILED_PATHS,
    PrecompiledError,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import RELEASES_DIR, manifest_path

__all__ = [
    "NIGHTLY_INDEX",
    "BaseWheel",
    "Decision",
    "WheelInfo",
    "base_dest_ref",
    "base_label",
    "check_wheel",
    "compile_inputs",
    "compiled_changes",
    "decide",
    "host_platform",
    "local_base_wheels",
    "needs_git",
    "nightly_wheel",
    "same_repo",
    "wheel_info",
    "wheel_python",
]

# vLLM's wheel index: <index>/<commit>/[<variant>/]vllm/metadata.json lists the wheels of that commit.
NIGHTLY_INDEX = "https://wheels.vllm.ai"
INDEX_TIMEOUT = 30.0
AREAS = "vLLM's compiled paths"
MERGE_BASE_PLACEHOLDER = "{merge_base}"
SHOWN_PATHS = 5
MAX_CANDIDATES = 10
# Where the mirror keeps a precompiled_base fetched from another repository.
BASE_REF_PREFIX = "refs/vllm-ops/precompiled-base/"
_COMMIT_ID = re.compile(r"""^__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['"]g?([0-9a-f]{7,40})['"]""", re.MULTILINE)
_LOCAL_COMMIT = re.compile(r"(?:^|\.)g([0-9a-f]{7,40})(?:\.|$)")
_RELEASE = re.compile(r"\d+(?:\.\d+)*")

# packaging's tags (through _wheel_compat) only where a base wheel is read: a release that is built already, the
# look's question, names none (issue 30: vllm_drift's imports were most of its host CPU).
if TYPE_CHECKING:
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._vendor.packaging.tags import Tag


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
    """Whether this build uses the precompiled path, and why (one sentence a person can check).

    decide() makes it from plain values, _build_decision.decide_for from vllm_build's options (the build's one
    way to get it); every field but use/mode/reason is passed by name.

    `wheel_commit` is the commit the base wheel's compiled parts are of (auto diffs the ref against it),
    or the one `always` pins for vLLM's own lookup; `commit` the ref's.
    """

    def __init__(
        self,
        use: bool,
        mode: str,
        reason: str,
        *,
        wheel_location: Optional[str] = None,
        merge_base: Optional[str] = None,
        base: Optional[str] = None,
        base_release: Optional[str] = None,
        changed_files: Optional[int] = None,
        compiled_changed: Sequence[str] = (),
        decided: bool = True,
        commit: Optional[str] = None,
        wheel_commit: Optional[str] = None,
        wheel_commit_source: Optional[str] = None,
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
        self.commit = commit
        self.wheel_commit = wheel_commit
        self.wheel_commit_source = wheel_commit_source

    def env(self) -> Dict[str, str]:
        """The environment vLLM's setup.py reads (empty for a full build).

        Without a wheel location the commit is pinned: vLLM then fetches that commit's wheel or fails,
        where an unset or invalid VLLM_PRECOMPILED_WHEEL_COMMIT makes it fall back to the nightly wheel.
        """
        if not self.use:
            return {}
        env = {"VLLM_USE_PRECOMPILED": "1"}
        if self.wheel_location:
            env["VLLM_PRECOMPILED_WHEEL_LOCATION"] = self.wheel_location
        elif self.wheel_commit:
            env["VLLM_PRECOMPILED_WHEEL_COMMIT"] = self.wheel_commit
        return env

    def details(self) -> Dict[str, Any]:
        return {
            "used": self.use,
            "mode": self.mode,
            "reason": self.reason,
            "commit": self.commit,
            "wheel_location": redact_url(self.wheel_location) if self.wheel_location else None,
            "wheel_commit": self.wheel_commit,
            "wheel_commit_source": redact_url(self.wheel_commit_source) if self.wheel_commit_source else None,
            "merge_base": self.merge_base,
            "base": redact_url(self.base) if self.base else None,
            "base_release": self.base_release,
            "changed_files": self.changed_files,
            "compiled_changed": self.compiled_changed[:50],
        }

    def __repr__(self) -> str:
        return f"Decision({self.use}: {self.reason})"


class WheelInfo:
    """What a base wheel says about itself: its file name's version and tags and, for a file on this host,
    whether it is a vLLM wheel and the commit setuptools-scm wrote into `vllm/_version.py`."""

    def __init__(self, location: str, name: str, tags: FrozenSet[Tag], problem: Optional[str] = None) -> None:
        self.location = location
        self.name = name
        self.problem = problem  # why it is not a vLLM wheel, or None
        self.tags = tags  # packaging's Tags of the file name (none when it is not a wheel's)
        # As the name spells them (the PEP 427 fields hold no `-`): messages and the version check quote them.
        parts = name[: -len(".whl")].split("-") if tags else []
        self.dist = parts[0] if parts else ""
        self.version = parts[1] if parts else ""
        self.python_tags, self.abi_tags, self.platform_tags = (
            (parts[-3].split("."), parts[-2].split("."), parts[-1].split(".")) if parts else ([], [], [])
        )
        self.commit_id: Optional[str] = None  # from vllm/_version.py
        local = self.version.partition("+")[2]
        found = _LOCAL_COMMIT.search(local)
        self.local_commit = found.group(1) if found else None
        self.precompiled = "precompiled" in local.split(".")  # its compiled parts came from yet another wheel
        self.tag = f"v{self.version}" if _RELEASE.fullmatch(self.version) else None

    def __repr__(self) -> str:
        return f"WheelInfo({self.name})"


def wheel_info(location: str) -> WheelInfo:
    """Read a base wheel: the name of a URL, the name and contents of a file (stdlib zipfile only)."""
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_compat import (
        InvalidWheelFilename,
        parse_wheel_filename,
    )

    name = unquote(os.path.basename(location.split("?", 1)[0].split("#", 1)[0]))
    try:
        tags = parse_wheel_filename(name)[3]
    except InvalidWheelFilename:
        return WheelInfo(
            location, name, frozenset(), "is not a wheel file name (vllm-<version>-<python>-<abi>-<platform>.whl)"
        )
    info = WheelInfo(location, name, tags)
    if info.dist.lower().replace("_", "-") != "vllm":
        info.problem = f"is a wheel of {info.dist}, not of vLLM"
    elif "://" not in location:
        info.problem = _read_wheel(location, info)
    return info


def _read_wheel(path: str, info: WheelInfo) -> Optional[str]:
    if not zipfile.is_zipfile(path):
        return "is not a zip archive (a wheel is one)"
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        if "vllm/__init__.py" not in names:
            return "has no vllm/ package"
        metadata = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        project = ""
        if metadata:
            text = archive.read(metadata[0]).decode("utf-8", "replace")
            found = re.search(r"^Name:\s*(\S+)", text, re.MULTILINE)
            project = found.group(1) if found else ""
        if project.lower().replace("_", "-") != "vllm":
            return f"is no vLLM wheel: its dist-info names {project or 'no project'}, not vllm"
        if "vllm/_version.py" in names:
            found = _COMMIT_ID.search(archive.read("vllm/_version.py").decode("utf-8", "replace"))
            info.commit_id = found.group(1) if found else None
    return None


def wheel_python(info: WheelInfo) -> str:
    """The Pythons a wheel's name claims, for a message: `3.12 (cp312-cp312)`."""
    versions = ", ".join(f"{t[2]}.{t[3:]}" if len(t) > 3 else t for t in info.python_tags if t.startswith(("cp", "py")))
    return f"{versions} ({'.'.join(info.python_tags)}-{'.'.join(info.abi_tags)})"


def host_platform(machine: str) -> str:
    """This host as the platform tags see it, for a message: `linux x86_64 with glibc 2.35`."""
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_compat import host_libc

    libc = host_libc()
    return f"linux {machine}" + (f" with {libc}" if libc else "")


def check_wheel(info: WheelInfo, python_version: Optional[str], machine: Optional[str] = None) -> None:
    """Refuse a base wheel the build cannot use: not a vLLM wheel, or for another Python or platform."""
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_compat import platform_fits, python_fits

    fix = "Fix: give precompiled_wheel the path or URL of a vLLM wheel"
    if info.problem:
        raise PrecompiledError(f"precompiled_wheel {redact_url(info.location)!r} {info.problem}. {fix}")
    if python_version and not python_fits(info.tags, python_version):
        raise PrecompiledError(
            f"precompiled_wheel {info.name} is for Python {wheel_python(info)}, but the build's python is "
            f"{python_version}. {fix} for Python {'.'.join(python_version.split('.')[:2])} (or an abi3 one), or set "
            "`python` to a matching interpreter"
        )
    machine = machine or platform.machine()
    if not platform_fits(info.tags, python_version, machine):
        raise PrecompiledError(
            f"precompiled_wheel {info.name} is for {'.'.join(info.platform_tags)}, but this host is "
            f"{host_platform(machine)}. "
            f"{fix} built for linux {machine} (manylinux_*_{machine} or linux_{machine})"
        )


def _touches_compiled(path: str) -> bool:
    if path in NOT_COMPILED_PATHS:
        return False
    for prefix in COMPILED_PATHS:
        if "*" in prefix:
            if fnmatch.fnmatchcase(path, prefix):  # "*" crosses "/": any depth
                return True
        elif prefix.endswith("/"):
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


def local_base_wheels(root: str, inputs: Mapping[str, Any]) -> List[BaseWheel]:
    """Wheels of complete releases under `root` built with the same compile inputs, newest first.

    Only releases whose compiled modules match their own commit: full builds and auto-precompiled ones.
    """
    releases = os.path.join(root, RELEASES_DIR)
    if not os.path.isdir(releases):
        return []
    wanted = compile_inputs(inputs)
    found = []
    for name in os.listdir(releases):
        if name.startswith("."):
            continue
        try:
            manifest = read_json(manifest_path(os.path.join(releases, name)), None)
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


def _shown(paths: Sequence[str]) -> str:
    return ", ".join(paths[:SHOWN_PATHS]) + (", ..." if len(paths) > SHOWN_PATHS else "")


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


def needs_git(mode: str, wheel: Optional[str], wheel_commit: Optional[str] = None) -> bool:
    """Whether the decision reads the repository: auto; always without a wheel (it pins the merge-base);
    a wheel location naming the merge-base; a precompiled_wheel_commit to check."""
    if mode == "never":
        return False
    return mode == "auto" or not wheel or MERGE_BASE_PLACEHOLDER in wheel or bool(wheel_commit)


def _resolve_option_commit(mirror: Optional[str], wheel_commit: Optional[str]) -> Optional[str]:
    if not wheel_commit:
        return None
    sha = resolve_commit(mirror, wheel_commit.strip()) if mirror else None
    if sha is None:
        raise PrecompiledError(
            f"precompiled_wheel_commit {wheel_commit!r} is not a commit of the repository. Fix: give the full SHA "
            "(or a tag) of the commit the base wheel was built from, as the repository has it, or leave it unset to "
            "read the commit from the wheel"
        )
    return sha


def _wheel_commit(
    mirror: str, info: WheelInfo, template: bool, merged: Optional[str]
) -> Tuple[Optional[str], str, Optional[str]]:
    """(commit or None, where it comes from, why it cannot be used) of a base wheel, from the wheel itself."""
    if template:
        return merged, "the merge-base named by precompiled_wheel", None
    if info.commit_id:
        source, name = f"vllm/_version.py of {info.name}", info.commit_id
    elif info.local_commit:
        source, name = f"the version's +g{info.local_commit} of {info.name}", info.local_commit
    elif info.tag:
        source, name = f"tag {info.tag}, of the wheel's version {info.name}", f"refs/tags/{info.tag}"
    else:
        return None, info.name, f"{info.name} names no commit (no vllm/_version.py commit id, no +g<hash>, no release)"
    if info.precompiled:
        return (
            None,
            source,
            (
                f"{info.name} was itself built on the precompiled path, so its libraries are of another commit "
                "than its own; set precompiled_wheel_commit to the commit they were compiled from"
            ),
        )
    sha = resolve_commit(mirror, name)
    if sha is None and info.tag and not name.startswith("refs/tags/"):
        # A release wheel names upstream's commit; a repository made from the sdist, or one that rewrote
        # history, has the release only as its tag (same tree, another SHA).
        sha = resolve_commit(mirror, f"refs/tags/{info.tag}")
        if sha is not None:
            absent = f"its commit {name[:12]} is not in the repository"
            return sha, f"tag {info.tag} (the release of {info.name}; {absent})", None
    if sha is None:
        shown = info.tag if name.startswith("refs/tags/") else name
        why = f"the base wheel's commit {shown} ({source}) is not in the repository"
        return None, source, f"{why} (precompiled_wheel_commit can name the commit it was built from)"
    return sha, source, None


def nightly_wheel(commit: str, machine: str, variant: Optional[str] = None, index: Optional[str] = None) -> str:
    """The file name of the wheel vLLM's lookup would take for `commit` (as its setup.py reads the index);
    PrecompiledError when the index does not answer or lists none for this machine."""
    index = index or NIGHTLY_INDEX
    url = f"{index.rstrip('/')}/{commit}/{variant + '/' if variant else ''}vllm/metadata.json"
    fix = (
        "Fix: give precompiled_wheel (a local wheel, or the URL of the wheel built from that commit), or use "
        "precompiled: auto or never"
    )
    try:
        with build_opener().open(url, timeout=INDEX_TIMEOUT) as response:
            wheels = json.loads(response.read().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise PrecompiledError(
            f"precompiled: always: the wheel of {commit[:12]} cannot be had from {redact_url(url)} ({exc}); "
            f"vLLM's setup.py would fail the same way after the build started. {fix}"
        ) from exc
    for wheel in wheels if isinstance(wheels, list) else []:
        if isinstance(wheel, dict) and wheel.get("package_name") == "vllm" and machine in wheel.get("platform_tag", ""):
            return str(wheel.get("filename") or wheel.get("path") or "")
    raise PrecompiledError(
        f"precompiled: always: {redact_url(url)} lists no vllm wheel for {machine} (commit {commit[:12]}). {fix}"
    )


def decide(
    mode: str,
    wheel: Optional[str] = None,
    commit: Optional[str] = None,
    mirror: Optional[str] = None,
    base_commit: Optional[str] = None,
    base_label: str = "main",
    candidates: Sequence[BaseWheel] = (),
    *,
    wheel_commit: Optional[str] = None,
    python_version: Optional[str] = None,
    machine: Optional[str] = None,
    variant: Optional[str] = None,
    index: Optional[str] = None,
    check_index: bool = True,
) -> Decision:
    """The decision for building `commit` (present in `mirror`, as is `base_commit`).

    auto diffs the ref against the commit its base wheel was built from: `wheel_commit`
    (precompiled_wheel_commit), else what `wheel` says of itself (vllm/_version.py, +g<hash>, release tag);
    without `wheel`, the local base wheels `candidates` (local_base_wheels; the merge-base's first) against
    their own commits. always without `wheel` pins the merge-base (or `wheel_commit`) for vLLM's lookup and
    checks that `index` has that wheel (unless `check_index` is False: check mode reads nothing remote).
    A bad wheel or wheel_commit raises PrecompiledError, never a build. `python_version` (the build
    python's) and `machine` (default: this host's) are what the wheel must fit.
    """
    if mode not in MODES:
        raise PrecompiledError(f"precompiled {mode!r} is not one of {', '.join(MODES)}")
    if mode == "never":
        return Decision(False, mode, "precompiled: never: full build", commit=commit)
    machine = machine or platform.machine()
    location = info = None
    template = MERGE_BASE_PLACEHOLDER in (wheel or "")
    if wheel and not template:  # a bad wheel is refused before anything else is read
        location = _location(wheel, None)
        info = wheel_info(location)
        check_wheel(info, python_version, machine)
    merged = None
    if needs_git(mode, wheel, wheel_commit):
        if not (mirror and commit and base_commit):
            raise PrecompiledError("the precompiled decision needs the commit and the base in the mirror")
        merged = merge_base(mirror, commit, base_commit)
    explicit = _resolve_option_commit(mirror, wheel_commit)
    if wheel and template:
        location = _location(wheel, merged)
        info = wheel_info(location)
        check_wheel(info, python_version, machine)
    if mode == "always":
        return _always(commit, location, explicit, merged, base_label, machine, variant, index if check_index else "")
    mirror, commit = mirror or "", commit or ""

    def made(use: bool, reason: str, changed: int, compiled: Sequence[str], **fields: Any) -> Decision:
        fields.setdefault("wheel_location", location if use else None)
        return Decision(use, mode, reason, merge_base=merged, base=base_label, changed_files=changed,
                        compiled_changed=compiled, commit=commit, **fields)  # fmt: skip

    if info is not None:
        found: Optional[str]
        if explicit:
            found, source, why = explicit, "precompiled_wheel_commit", None
        else:
            found, source, why = _wheel_commit(mirror, info, template, merged)
        if found is None:
            return made(False, f"{why}: full build", 0, (), wheel_commit_source=source)
        changed = changed_paths(mirror, found, commit)
        compiled = compiled_changes(changed)
        since = f"{_files(len(changed))} changed since the base wheel's commit {found[:12]} ({source})"
        if compiled:
            reason = f"{since}, {len(compiled)} under {AREAS} ({_shown(compiled)}): full build"
            return made(False, reason, len(changed), compiled, wheel_commit=found, wheel_commit_source=source)
        reason = f"{since}, none under {AREAS}: precompiled (base wheel {redact_url(location or '')})"
        return made(True, reason, len(changed), (), wheel_commit=found, wheel_commit_source=source)
    lender = _same_compiled_sources(mirror, commit, merged, candidates)
    if lender is not None:
        base, changed = lender
        source = f"the manifest of release {base.release}"
        reason = (
            f"{_files(len(changed))} changed since the base wheel's commit {base.commit[:12]} ({source}), none under "
            f"{AREAS}: precompiled from the wheel of release {base.release} (same compiled sources)"
        )
        return made(True, reason, len(changed), (), wheel_location=base.path, base_release=base.release,
                    wheel_commit=base.commit, wheel_commit_source=source)  # fmt: skip
    if merged is None:
        reason = f"{commit[:12]} shares no history with {base_label} ({(base_commit or '')[:12]}): full build"
        return made(False, reason, 0, ())
    changed = changed_paths(mirror, merged, commit)
    compiled = compiled_changes(changed)
    since = f"{_files(len(changed))} changed since merge-base {merged[:12]} with {base_label}"
    since += f", {len(compiled)} under {AREAS} ({_shown(compiled)})" if compiled else f", none under {AREAS}"
    return made(
        False,
        f"{since}, but no base wheel (no precompiled_wheel given, and no release on this host has the same "
        "compiled sources and build inputs): full build",
        len(changed),
        compiled,
    )


def _always(
    commit: Optional[str],
    location: Optional[str],
    explicit: Optional[str],
    merged: Optional[str],
    base_label: str,
    machine: str,
    variant: Optional[str],
    index: Optional[str],
) -> Decision:
    if location:
        reason = f"precompiled: always (the diff is not checked; base wheel {redact_url(location)})"
        source = "precompiled_wheel_commit" if explicit else None
        return Decision(True, "always", reason, wheel_location=location, merge_base=merged, commit=commit,
                        wheel_commit=explicit, wheel_commit_source=source)  # fmt: skip
    pinned = explicit or merged
    if not pinned:
        raise PrecompiledError(
            f"precompiled: always without precompiled_wheel: {(commit or '')[:12]} shares no history with "
            f"{base_label}, so there is no commit whose wheel vLLM could fetch. Fix: give precompiled_wheel or "
            "precompiled_wheel_commit, or set precompiled_base to the branch the ref came from"
        )
    source = "precompiled_wheel_commit" if explicit else f"merge-base with {base_label}"
    if index == "":  # check mode
        found = f"{redact_url(NIGHTLY_INDEX)} is asked by the build, not in check mode"
    else:
        found = f"{redact_url(index or NIGHTLY_INDEX)}: {nightly_wheel(pinned, machine, variant, index)}"
    reason = (
        f"precompiled: always (the diff is not checked; the wheel of {pinned[:12]} ({source}) from "
        f"{found}; VLLM_PRECOMPILED_WHEEL_COMMIT pinned, never the nightly)"
    )
    return Decision(True, "always", reason, merge_base=merged, base=base_label, commit=commit, wheel_commit=pinned,
                    wheel_commit_source=source)  # fmt: skip


def _same_compiled_sources(
    mirror: str, commit: str, merged: Optional[str], candidates: Sequence[BaseWheel]
) -> Optional[Tuple[BaseWheel, List[str]]]:
    """The local base wheel whose commit has the ref's compiled sources, and the paths that differ."""
    ordered = sorted(candidates, key=lambda base: base.commit != merged)  # stable: newest first otherwise
    for base in ordered[:MAX_CANDIDATES]:
        if not commit_exists(mirror, base.commit):
            continue  # installed from a wheel of a repository this mirror does not hold
        changed = [] if base.commit == commit else changed_paths(mirror, base.commit, commit)
        if not compiled_changes(changed):
            return base, changed
    return None


def base_label(base_url: Optional[str], base_ref: str) -> str:
    """precompiled_base as shown to a person (credentials removed)."""
    return base_ref if base_url is None else f"{redact_url(base_url)}#{base_ref}"


def base_dest_ref(base_url: str) -> str:
    """The mirror's ref for a precompiled_base of another repository (one per URL)."""
    return BASE_REF_PREFIX + hashlib.sha256(redact_url(base_url).encode("utf-8")).hexdigest()[:8]


def same_repo(base_url: Optional[str], repo: str) -> bool:
    return base_url is None or normalize_repo(base_url) == repo
