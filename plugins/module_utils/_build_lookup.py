# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which release the build options name on this host, and whether it is built: vllm_drift's look.

The part of vllm_build's run that only reads: the options checked, the ref resolved (or, for `version`, the
release's inputs from this host's interpreter and installer), the release named and looked for. What it does not
find, the run (_build_run) predicts in check mode or builds.

Apart from the prediction and the build so that the look's module, which AnsiballZ ships to every host with every
core it imports, carries only this part (issue 30: the build's cores, then the decision's and packaging's tags,
were most of what the look shipped and its hosts imported).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_host import (
    find_installer,
    find_python,
    probe_python,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_names import inputs_hash, named, release_name
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    BuildError,
    BuildOptions,
    OptionError,
    canonical_package,
    option_secrets,
    recorded_build_env,
    recorded_pip_args,
    validate,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_paths import read_manifest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import StatusFile
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import linked_out, redact_url, sha256_file
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import Deadline
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import (
    GitError,
    Resolution,
    mirror_path,
    normalize_repo,
    resolve_remote,
    resolve_short_sha,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._installer import Installer
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import RELEASES_DIR, WHEELS_DIR, release_path

__all__ = [
    "Found",
    "Lookup",
    "ReleasePlan",
    "Resolved",
    "check_expected",
    "compiled_from_its_sources",
    "existing",
    "lookup",
    "plan_index_release",
    "resolve",
    "short_sha_msg",
    "wheel_decided",
]


class Found(NamedTuple):
    """A release the options name that is built here: its name, inputs digest and manifest."""

    name: str
    digest: str
    manifest: Dict[str, Any]


class Resolved(NamedTuple):
    """What the run of a git ref knows when the release is not there yet: all a build starts from."""

    repo: str
    python: str
    installer: Installer
    inputs: Dict[str, Any]
    mirror: str
    resolution: Resolution
    deadline: Deadline
    started: float


class ReleasePlan(NamedTuple):
    """A release from an index (`version`): what names it here, and all its install starts from."""

    python: str
    installer: Installer
    inputs: Dict[str, Any]
    digest: str
    name: str
    deadline: Deadline
    started: float


class Lookup(NamedTuple):
    """What the build options name on this host, read only: vllm_drift's question."""

    release_name: Optional[str]  # None: not built, and its name waits on the precompiled decision or the short SHA
    commit: Optional[str]
    built: bool  # the release is there, complete: a run would change nothing
    msg: str  # "<name> exists", or what a run would do


def compiled_from_its_sources(manifest: Mapping[str, Any]) -> bool:
    """Whether a release's compiled modules match its own commit: a full build, or a precompiled one that
    `auto` decided from the diff. One forced with `always` was never checked against its sources."""
    return not manifest.get("precompiled") or (manifest.get("precompiled_details") or {}).get("mode") == "auto"


def wheel_decided(opts: BuildOptions) -> bool:
    """auto with a wheel built elsewhere that carries its building host's decision (`wheel_precompiled`)."""
    return bool(opts.wheel and opts.precompiled == "auto" and opts.wheel_precompiled is not None)


def short_sha_msg(repo: str, ref: str) -> str:
    """What a run does with a short SHA the host's mirror does not hold yet."""
    return f"would fetch {redact_url(repo)} to resolve the short SHA {ref!r}, then build"


def _variants(opts: BuildOptions) -> List[bool]:
    """The precompiled variants of a commit this run accepts, in the order it looks for them.

    auto accepts a full build, and a precompiled one only if auto decided it (from the diff): one forced with
    `always` may hold compiled modules that do not match the commit's sources. A wheel built elsewhere with its
    decision (`wheel_precompiled`) is that variant alone.
    """
    if wheel_decided(opts):
        return [bool(opts.wheel_precompiled)]
    return {"never": [False], "always": [True]}.get(opts.precompiled, [False, True])


def existing(opts: BuildOptions, commit: str, inputs: Mapping[str, Any]) -> Optional[Found]:
    """An already built release of `commit` that this run accepts."""
    for use in _variants(opts):
        digest, name = named(commit, inputs, use)
        manifest = read_manifest(release_path(opts.root, name))
        if manifest is None:
            continue
        if opts.precompiled == "auto" and not compiled_from_its_sources(manifest):
            continue
        return Found(name, digest, manifest)
    return None


def check_expected(opts: BuildOptions, commit: Optional[str], repo: str) -> None:
    expected = opts.expected_commit
    if expected and commit and not commit.startswith(expected):
        raise BuildError(
            f"ref {opts.ref!r} of {redact_url(repo)} resolves to {commit}, not the expected_commit {expected}; "
            "the ref moved: update expected_commit or pin ref to the expected SHA"
        )


# The directories of `root` a build deletes in (src/: a half mirror): a link that leads out of `root` would
# make it delete there.
_OWN_DIRS = ("build", RELEASES_DIR, WHEELS_DIR, "src")


def _refuse_linked_dirs(root: str) -> None:
    """Refuse a root whose build/, releases/, wheels/ or src/ lies outside it (a symlink to a scratch disk): every
    build deletes debris and half releases in them, which would then be whatever else lives there."""
    for name in _OWN_DIRS:
        path = os.path.join(root, name)
        if os.path.lexists(path) and linked_out(root, path):
            raise OptionError(
                f"{path} leads out of {root} (to {os.path.realpath(path)}); vllm_build deletes the debris of "
                f"earlier builds in it, so it would delete what else lives there. Nothing was changed. Fix: make "
                f"{path} a directory of its own (mount the disk there, or bind-mount a directory of it), or "
                "point root at the disk"
            )


def resolve(opts: BuildOptions, started: float) -> Tuple[Resolved, Optional[Found]]:
    """A git ref resolved on this host and the release it names, if built; raises GitError and BuildError."""
    _refuse_linked_dirs(opts.root)
    deadline = Deadline(opts.build_timeout)
    repo = normalize_repo(opts.repo)
    python = find_python(opts.python)
    installer = find_installer(opts.installer, opts.root)
    # Compiled modules depend on torch's ABI. Without isolation the build compiles against the venv's
    # torch: the interpreter's, which the venv sees through system site packages, else the one the
    # commit's build requirements install (the commit is in the name). With isolation they pin it.
    python_version, torch = probe_python(python, with_torch=not opts.build_isolation and opts.system_site_packages)
    inputs = {
        "python": python,
        "python_version": python_version,
        "installer": installer.name,
        # Recorded without credentials, and hashed so: a rotated token names no new release.
        "build_env": recorded_build_env(opts.build_env),
        "build_isolation": opts.build_isolation,
        "system_site_packages": opts.system_site_packages,
        "pip_args": recorded_pip_args(opts.pip_args),
        "torch": torch,
        # ... and on the GPU architectures compiled for (unset: the build host's GPUs).
        "torch_cuda_arch_list": opts.build_env.get("TORCH_CUDA_ARCH_LIST", os.environ.get("TORCH_CUDA_ARCH_LIST")),
    }
    mirror = mirror_path(opts.root, repo)
    resolution = resolve_remote(repo, opts.ref, min(deadline.remaining(), 120.0))
    check_expected(opts, resolution.commit, repo)
    if resolution.commit is None:  # short SHA: read an existing mirror (no lock needed to read)
        resolution.commit = resolve_short_sha(mirror, opts.ref, repo)
        check_expected(opts, resolution.commit, repo)
    found = existing(opts, resolution.commit, inputs) if resolution.commit else None
    return Resolved(repo, python, installer, inputs, mirror, resolution, deadline, started), found


def plan_index_release(
    opts: BuildOptions, started: float, check: Optional[Callable[[str], None]] = None
) -> Tuple[ReleasePlan, Optional[Found]]:
    """The release from an index that `version` names on this host (the interpreter, installer, index, variant,
    a given wheel's content), and it if built. `check` (vllm_build's, _release_plan) refuses the options for this
    interpreter's version first; the look checks nothing more than it reads."""
    deadline = Deadline(opts.build_timeout)
    python = find_python(opts.python)
    python_version = probe_python(python, with_torch=False)[0]
    if check is not None:
        check(python_version)
    installer = find_installer(opts.installer, opts.root)
    inputs = {
        "python": python,
        "python_version": python_version,
        "installer": installer.name,
        "build_env": recorded_build_env(opts.build_env),
        "system_site_packages": opts.system_site_packages,
        "pip_args": recorded_pip_args(opts.pip_args),
        "package": canonical_package(opts.package),
        "version": opts.version,
        "torch_backend": opts.torch_backend,
        "dependency_overrides": list(opts.dependency_overrides),
        "wheel_sha256": sha256_file(opts.wheel) if opts.wheel else None,
    }
    digest = inputs_hash(inputs)
    name = release_name(None, digest, version=opts.version, package=opts.package)
    manifest = read_manifest(release_path(opts.root, name))
    found = Found(name, digest, manifest) if manifest is not None else None
    return ReleasePlan(python, installer, inputs, digest, name, deadline, started), found


def lookup(opts: BuildOptions) -> Lookup:
    """Whether the release the options name is built here, changing nothing and predicting nothing.

    Raises BuildError (bad options, an unreachable repo, an unknown ref, expected_commit mismatch) as the run would.
    """
    validate(opts)
    started = time.monotonic()
    if opts.version:
        plan, found = plan_index_release(opts, started)
        if found is not None:
            return Lookup(found.name, found.manifest.get("commit"), True, f"{found.name} exists")
        return Lookup(plan.name, None, False, f"would install {opts.label} as {plan.name}")
    try:
        resolved, found = resolve(opts, started)
    except GitError as exc:
        scrub = StatusFile(
            opts.root, opts.run_id, opts.label, enabled=False, secrets=sorted(option_secrets(vars(opts)))
        )
        raise BuildError(scrub.scrub(str(exc))) from exc
    commit = resolved.resolution.commit
    if found is not None:
        return Lookup(found.name, commit, True, f"{found.name} exists")
    if commit is None:
        return Lookup(None, None, False, short_sha_msg(resolved.repo, opts.ref))
    variants = _variants(opts)
    if len(variants) == 1:
        name = named(commit, resolved.inputs, variants[0])[1]
        return Lookup(name, commit, False, f"would build {name}")
    return Lookup(None, commit, False, f"would build {commit[:12]} (its name waits on precompiled: auto's decision)")
