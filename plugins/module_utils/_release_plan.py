# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A release from an index (`version`) up to the host lock: its checks, its inputs and name, found or predicted.

What names `<package>-<version>-<inputs8>` on this host (the interpreter, installer, index, variant, a given
wheel's content) and the checks that refuse a release before anything is written (a wheel of another package,
version, Python or platform; a CUDA variant the driver does not run). The install itself is _release_install's,
under the host lock; vllm_drift's look runs only this part (_build_lookup says why it is apart).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple, Union

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_budget import fit_before_build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_host import (
    find_installer,
    find_python,
    probe_python,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_names import inputs_hash, release_name
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    BuildOptions,
    OptionError,
    canonical_package,
    pip_refuses_uv_options,
    recorded_build_env,
    recorded_pip_args,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_paths import read_manifest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_result import result as build_result
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import sha256_file
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import Deadline
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import Resolution
from ansible_collections.vllm_ops.dflash.plugins.module_utils._installer import Installer
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import (
    host_platform,
    wheel_info,
    wheel_python,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import release_path

__all__ = ["SOURCE", "ReleasePlan", "driver_cuda", "plan_release", "release_exists", "release_result"]

SOURCE = "release"  # manifest `source` of a release installed from an index or its wheel (git: build|wheel)
# A wheel's local version that names its torch variant (vLLM's `+cu128`, `+cpu`, `+rocm6.4`).
_VARIANT = re.compile(r"^(cu[0-9]+|cpu|rocm[0-9.]+|xpu)$")
_CUDA_VARIANT = re.compile(r"cu([0-9]+)([0-9])")  # cu128 -> CUDA 12.8, cu130 -> 13.0
_DRIVER_CUDA = re.compile(r"CUDA Version:\s*([0-9]+)\.([0-9]+)")  # nvidia-smi's header


class ReleasePlan(NamedTuple):
    """A release from an index that is not there yet: all its install starts from."""

    python: str
    installer: Installer
    inputs: Dict[str, Any]
    digest: str
    name: str
    deadline: Deadline
    started: float


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


def release_result(opts: BuildOptions, commit: Optional[str], **kwargs: Any) -> Dict[str, Any]:
    result = build_result(opts, Resolution(opts.label, commit, "release"), **kwargs)
    manifest: Mapping[str, Any] = kwargs.get("manifest") or {}
    result.update(
        requested_ref=None,
        source=SOURCE,
        package=canonical_package(opts.package),
        version=manifest.get("version") or opts.version,
    )
    return result


def release_exists(
    opts: BuildOptions, name: str, digest: str, started: float, manifest: Mapping[str, Any]
) -> Dict[str, Any]:
    """The result when the release is there already (nothing changed)."""
    return release_result(
        opts, manifest.get("commit"), name=name, digest=digest, started=started, changed=False, built=False,
        manifest=manifest, msg=f"{name} exists",
    )  # fmt: skip


def plan_release(opts: BuildOptions, check_mode: bool, started: float) -> Union[Dict[str, Any], ReleasePlan]:
    """The release found (its result), predicted in check mode (the result), else what its install needs."""
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
    found = read_manifest(release_path(opts.root, name))
    if found is not None:
        return release_exists(opts, name, digest, started, found)
    if check_mode:
        return release_result(
            opts, None, name=name, digest=digest, started=started, changed=True, built=False, manifest=None,
            msg=f"would install {opts.label} as {name}", disk=fit_before_build(opts, name, check_mode=True),
        )  # fmt: skip
    return ReleasePlan(python, installer, inputs, digest, name, deadline, started)
