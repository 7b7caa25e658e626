# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the build host offers a build: the interpreter, the installer, MAX_JOBS, cache directories, disk space.

Read from the host, never assumed: which python and torch the build sees, how many compile jobs its
CPUs and memory bear, and where caches live (under `<root>/cache/`, on the file system of the releases
so that uv can hardlink one copy of each package into every release).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Callable, Dict, Mapping, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import INSTALLERS, OptionError
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import run as run_command
from ansible_collections.vllm_ops.dflash.plugins.module_utils._installer import Installer

__all__ = [
    "GIB",
    "MEMORY_PER_JOB",
    "TOOLS_UV",
    "cache_env",
    "derive_max_jobs",
    "find_installer",
    "find_python",
    "max_jobs",
    "no_space_hint",
    "probe_python",
]

GIB = 1024**3
# vllm#8878: one nvcc/cicc job of vLLM's kernels can take several GiB; builds with MAX_JOBS = cores OOM.
MEMORY_PER_JOB = 4 * GIB
# The uv the vllm_install role provisions (a venv with a pinned uv) when the host has none.
TOOLS_UV = os.path.join("tools", "bin", "uv")
# What a full disk says in an error or a log tail (no_space_hint).
_NO_SPACE = ("No space left on device", "[Errno 28]", "ENOSPC", "Disk quota exceeded")

# The torch part only when asked: importing importlib.metadata is most of the probe's cost (~60 ms of CPU,
# paid by every host's look; see bench/README.md "Fleet at real size").
_PROBE = """
import sys
print('%d.%d.%d' % sys.version_info[:3])
if sys.argv[1:] == ['torch']:
    try:
        import importlib.metadata as metadata
        print(metadata.version('torch'))
    except Exception:
        print('')
"""


def find_python(python: str) -> str:
    found = shutil.which(python)
    if not found:
        raise OptionError(f"python {python!r} not found on the host; install it or set `python` to an interpreter path")
    return os.path.abspath(found)


def probe_python(python: str, with_torch: bool) -> Tuple[str, Optional[str]]:
    """The interpreter's version, and (with_torch) the torch version it sees, or None."""
    result = run_command([python, "-c", _PROBE, *(["torch"] if with_torch else [])], 60, watchdog=False)
    if not result.ok:
        raise OptionError(
            f"{python} does not run ({result.log_tail or result.rc}); set `python` to a working interpreter"
        )
    lines = [*result.stdout.splitlines(), "", ""]
    return lines[0].strip(), ((lines[1].strip() or None) if with_torch else None)


def find_installer(
    requested: str, root: str, which: Callable[..., Optional[str]] = shutil.which, path: Optional[str] = None
) -> Installer:
    """The installer a build uses: pip, or uv - the collection's own (`<root>/tools/bin/uv`), else one on PATH.

    `auto` takes uv when there is one. The collection's uv comes first, so every host of a fleet that the
    role provisioned uses the same uv whatever else is on PATH.
    """
    if requested not in INSTALLERS:
        raise OptionError(f"installer {requested!r} is not one of {', '.join(INSTALLERS)}")
    if requested == "pip":
        return Installer("pip")
    provisioned = os.path.join(root, TOOLS_UV)
    uv = provisioned if os.access(provisioned, os.X_OK) else which("uv", path=path)
    if uv:
        return Installer("uv", os.path.abspath(uv))
    if requested == "uv":
        raise OptionError(
            f"installer 'uv' requested but `uv` is not on PATH nor at {provisioned}; run the vllm_install role "
            "(it provisions uv there), install uv, or use installer: pip"
        )
    return Installer("pip")


def _cpu_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))  # the CPUs this process may use (cgroups, taskset)
    return max(1, os.cpu_count() or 1)


def _available_memory(meminfo: str, cgroup: str) -> Optional[int]:
    """MemAvailable in bytes, lowered to the cgroup v2 limit's headroom when a container sets one."""
    available = None
    with contextlib.suppress(OSError, ValueError), open(meminfo, encoding="ascii") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(cgroup, "memory.max"), encoding="ascii") as handle:
            limit = handle.read().strip()
        if limit != "max":
            with open(os.path.join(cgroup, "memory.current"), encoding="ascii") as handle:
                headroom = max(0, int(limit) - int(handle.read().strip()))
            available = headroom if available is None else min(available, headroom)
    return available


def derive_max_jobs(
    cpus: Optional[int] = None, meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup"
) -> Tuple[int, str]:
    """MAX_JOBS for a host: min(CPUs, available memory / MEMORY_PER_JOB), at least 1, and why."""
    cpus = cpus or _cpu_count()
    available = _available_memory(meminfo, cgroup)
    if available is None:
        return cpus, f"{cpus} CPUs (available memory unknown)"
    by_memory = available // MEMORY_PER_JOB
    jobs = max(1, min(cpus, by_memory))
    return jobs, (
        f"min({cpus} CPUs, {available / GIB:.1f} GiB available / {MEMORY_PER_JOB // GIB} GiB per job = {by_memory})"
        + (", at least 1" if by_memory < 1 else "")
    )


def max_jobs(build_env: Mapping[str, str], environ: Mapping[str, str]) -> Dict[str, str]:
    """MAX_JOBS of the build and where it came from: `{"value", "source"}` (build_env, environment, derived)."""
    if "MAX_JOBS" in build_env:
        return {"value": build_env["MAX_JOBS"], "source": "build_env"}
    if "MAX_JOBS" in environ:
        return {"value": environ["MAX_JOBS"], "source": "the environment of the module"}
    jobs, why = derive_max_jobs()
    return {"value": str(jobs), "source": f"derived: {why}"}


def cache_env(
    root: str, installer: str, env: Mapping[str, str], which: Callable[..., Optional[str]] = shutil.which
) -> Dict[str, str]:
    """Cache directories under `<root>/cache/` for what this build uses, unless `env` already names one.

    The installer's cache (uv or pip), and ccache/sccache when on PATH: vLLM's setup.py hands them to CMake
    as compiler launchers by itself. They speed builds up and change no output, so they are no build input.
    uv links from its cache into each release (UV_LINK_MODE=hardlink: the cache sits on the releases' file
    system), so releases that share packages (torch ...) share their disk blocks.
    """
    cache = os.path.join(root, "cache")
    added: Dict[str, str] = {}
    wanted = [("UV_CACHE_DIR", "uv")] if installer == "uv" else [("PIP_CACHE_DIR", "pip")]
    for tool, variable in (("ccache", "CCACHE_DIR"), ("sccache", "SCCACHE_DIR")):
        if which(tool, path=env.get("PATH")):
            wanted.append((variable, tool))
    added.update({variable: os.path.join(cache, sub) for variable, sub in wanted if variable not in env})
    if installer == "uv" and "UV_LINK_MODE" not in env:
        added["UV_LINK_MODE"] = "hardlink"
    return added


def no_space_hint(root: str, text: str) -> str:
    """'; no space left on device ...' when `text` (a log tail, an error) says so or the root's file system is full."""
    free = None
    with contextlib.suppress(OSError):
        stat = os.statvfs(root if os.path.isdir(root) else os.path.dirname(root))
        free = stat.f_bavail * stat.f_frsize
    if not (any(sign in text for sign in _NO_SPACE) or (free is not None and free < 64 * 1024**2)):
        return ""
    left = f" ({free / 1024**2:.0f} MiB free)" if free is not None else ""
    return (
        f"; no space left on device on the file system of {root}{left}. Fix: free space there (old releases: "
        f"vllm_release action=prune; caches: {os.path.join(root, 'cache')}) or give `root` a larger disk, then re-run"
    )
