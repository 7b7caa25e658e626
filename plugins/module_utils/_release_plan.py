# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A release from an index (`version`) up to the host lock: its checks, found or predicted.

What names `<package>-<version>-<inputs8>` on this host is _build_lookup's (all vllm_drift's look runs); here are
the checks that refuse a release before anything is written (a wheel of another package, version, Python or
platform; a CUDA variant the driver does not run; uv's options with pip) and its prediction in check mode. The
install itself is _release_install's, under the host lock.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_budget import fit_before_build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_lookup import ReleasePlan, plan_index_release
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    BuildOptions,
    OptionError,
    canonical_package,
    pip_refuses_uv_options,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_result import result as build_result
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import Resolution
from ansible_collections.vllm_ops.dflash.plugins.module_utils._precompiled import (
    host_platform,
    wheel_info,
    wheel_python,
)

__all__ = ["SOURCE", "driver_cuda", "plan_release", "release_exists", "release_result"]

SOURCE = "release"  # manifest `source` of a release installed from an index or its wheel (git: build|wheel)
# A wheel's local version that names its torch variant (vLLM's `+cu128`, `+cpu`, `+rocm6.4`).
_VARIANT = re.compile(r"^(cu[0-9]+|cpu|rocm[0-9.]+|xpu)$")
_CUDA_VARIANT = re.compile(r"cu([0-9]+)([0-9])")  # cu128 -> CUDA 12.8, cu130 -> 13.0
_DRIVER_CUDA = re.compile(r"CUDA Version:\s*([0-9]+)\.([0-9]+)")  # nvidia-smi's header


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


def _check_release(opts: BuildOptions, python_version: str) -> None:
    if opts.wheel:
        _check_wheel(opts, python_version)
    _check_cuda(opts)


def plan_release(opts: BuildOptions, check_mode: bool, started: float) -> Union[Dict[str, Any], ReleasePlan]:
    """The release found (its result), predicted in check mode (the result), else what its install needs."""
    plan, found = plan_index_release(opts, started, check=lambda python_version: _check_release(opts, python_version))
    if plan.installer.name == "pip" and (opts.torch_backend or opts.dependency_overrides):
        raise OptionError(pip_refuses_uv_options(opts))
    if found is not None:
        return release_exists(opts, found.name, found.digest, started, found.manifest)
    if check_mode:
        return release_result(
            opts, None, name=plan.name, digest=plan.digest, started=started, changed=True, built=False, manifest=None,
            msg=f"would install {opts.label} as {plan.name}", disk=fit_before_build(opts, plan.name, check_mode=True),
        )  # fmt: skip
    return plan
