# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a GPU host needs before vLLM is built or installed on it, and the fix of each missing piece.

`observe()` reads the host (standard library only: the target's system python runs it); `problems()` judges
what it read against what this deploy needs, one problem per missing piece, each naming what is wrong, the
package that fixes it for the host's package manager (apt for Debian/Ubuntu, dnf for the RHEL family) and the
variable that changes the need. Everything is gathered before any verdict, so the play fails once with all of
them, before any build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._args import INSTALLER, PYTHON, ROOT

# vLLM's requires-python: >=3.10,<3.14 (0.26-0.33).
PYTHON_MIN: Tuple[int, int] = (3, 10)
PYTHON_MAX: Tuple[int, int] = (3, 13)
# vLLM's own floor for a full build (docs: "GCC >= 11.3").
GCC_MIN: Tuple[int, ...] = (11, 3)
# The lowest driver that runs a CUDA major's toolkit at all, by NVIDIA's minor version compatibility (CUDA
# Compatibility guide, table "CUDA Toolkit and minimum required driver version"): a torch built for 12.x runs
# on any driver >= 525.60.13, one for 13.x on >= 580.65.06.
DRIVER_FLOOR: Dict[int, Tuple[int, ...]] = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}

APT = "apt"
DNF = "dnf"
# os-release ID / ID_LIKE words of each family.
_FAMILIES = {
    APT: {"debian", "ubuntu"},
    DNF: {"rhel", "fedora", "centos", "rocky", "almalinux", "ol"},
}
INSTALL_COMMAND = {APT: "apt-get install -y", DNF: "dnf install -y"}


class PrerequisiteError(Exception):
    """Options that cannot be judged (a malformed CUDA version)."""


@dataclass
class Observed:
    """What observe() read on the host; every field also settable by a test."""

    package_manager: str = ""  # apt, dnf or "" (another family: fixes name no package)
    os_name: str = ""
    python: str = ""  # the path of the python asked for, "" when not found
    python_version: Optional[Tuple[int, int]] = None
    python_has_venv: bool = False  # venv and ensurepip import: `python -m venv` makes a venv with pip
    git: str = ""
    uv: str = ""
    gcc: str = ""
    gcc_version: Optional[Tuple[int, ...]] = None
    gxx: str = ""
    nvcc: str = ""
    nvcc_version: Optional[Tuple[int, int]] = None
    driver_version: Optional[Tuple[int, ...]] = None
    disk_path: str = ""  # the root, or its nearest ancestor that exists
    disk_free_bytes: int = 0


@dataclass
class Need:
    """What this deploy needs of the host (the role's options)."""

    python: str = PYTHON
    root: str = ROOT
    git: bool = True  # a ref install clones (the build host only)
    installer: str = INSTALLER  # auto, uv, pip: without a uv, `python -m venv` with pip makes the venvs
    full_build: bool = False  # nvcc compiles vLLM's kernels here
    cuda: str = "12.9"  # the CUDA torch was built for ("" skips the driver check: a CPU host)
    min_free_gb: float = 30.0
    cuda_home: str = ""  # CUDA_HOME of the build environment, where nvcc is looked for first


@dataclass
class Problem:
    name: str
    msg: str
    packages: List[str] = field(default_factory=list)  # what vllm_prerequisites_install would install

    def as_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "msg": self.msg, "packages": list(self.packages)}


def _version(text: str, parts: int = 3) -> Optional[Tuple[int, ...]]:
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return None
    return tuple(int(g) for g in match.groups()[:parts] if g is not None)


def parse_cuda(cuda: str) -> Optional[Tuple[int, int]]:
    """'12.9' (or cu129) -> (12, 9); '' -> None."""
    cuda = cuda.strip()
    if not cuda:
        return None
    match = re.fullmatch(r"(\d+)\.(\d+)", cuda) or re.fullmatch(r"cu(\d+)(\d)", cuda)
    if not match:
        raise PrerequisiteError(
            f"vllm_prerequisites_cuda={cuda!r} is not a CUDA version: give the one torch was built for, such as "
            "12.9 or cu129 (vLLM's default wheels: 12.9), or an empty string for a host without a GPU"
        )
    return int(match.group(1)), int(match.group(2))


def package_manager(os_release: str) -> Tuple[str, str]:
    """(apt|dnf|'', PRETTY_NAME) from /etc/os-release's text."""
    values = dict(
        (key, value.strip().strip('"'))
        for key, _sep, value in (line.partition("=") for line in os_release.splitlines())
        if key
    )
    words = set((values.get("ID", "") + " " + values.get("ID_LIKE", "")).lower().split())
    for manager, family in _FAMILIES.items():
        if words & family:
            return manager, values.get("PRETTY_NAME", values.get("ID", ""))
    return "", values.get("PRETTY_NAME", values.get("ID", ""))


def _run(argv: List[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout + proc.stderr if proc.returncode == 0 else ""


def _succeeds(argv: List[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def observe(
    need: Need, os_release_path: str = "/etc/os-release", driver_path: str = "/proc/driver/nvidia/version"
) -> Observed:
    """Read the host: commands on PATH, their versions, the driver, the free space under the root."""
    seen = Observed()
    try:
        with open(os_release_path, encoding="utf-8") as handle:
            seen.package_manager, seen.os_name = package_manager(handle.read())
    except OSError:
        pass
    seen.python = shutil.which(need.python) or ""
    if seen.python:
        out = _run([seen.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        version = _version(out, 2)
        seen.python_version = (version[0], version[1]) if version else None
        # Debian/Ubuntu ship venv without ensurepip (python3-venv): `python -m venv` then fails.
        seen.python_has_venv = _succeeds([seen.python, "-c", "import venv, ensurepip"])
    seen.git = shutil.which("git") or ""
    # The collection's own uv (vllm_install provisions it into <root>/tools), then the PATH's.
    tools_uv = os.path.join(need.root, "tools", "bin", "uv")
    seen.uv = tools_uv if os.access(tools_uv, os.X_OK) else shutil.which("uv") or ""
    seen.gcc = shutil.which("gcc") or ""
    if seen.gcc:
        seen.gcc_version = _version(_run([seen.gcc, "-dumpfullversion", "-dumpversion"]))
    seen.gxx = shutil.which("g++") or ""
    candidates = [os.path.join(need.cuda_home, "bin", "nvcc")] if need.cuda_home else []
    candidates += [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    seen.nvcc = next((c for c in candidates if c and os.access(c, os.X_OK)), "")
    if seen.nvcc:
        match = re.search(r"release (\d+)\.(\d+)", _run([seen.nvcc, "--version"]))
        seen.nvcc_version = (int(match.group(1)), int(match.group(2))) if match else None
    try:
        with open(driver_path, encoding="utf-8") as handle:
            seen.driver_version = _version(re.sub(r"^.*?Kernel Module", "", handle.readline()))
    except OSError:
        smi = shutil.which("nvidia-smi")
        if smi:
            seen.driver_version = _version(_run([smi, "--query-gpu=driver_version", "--format=csv,noheader"]))
    seen.disk_path = _nearest_existing(need.root)
    try:
        usage = shutil.disk_usage(seen.disk_path)
        seen.disk_free_bytes = usage.free
    except OSError:
        seen.disk_free_bytes = 0
    return seen


def _dotted(version: Optional[Tuple[int, ...]]) -> str:
    return ".".join(str(part) for part in version) if version else "unknown"


def _fix(manager: str, packages: List[str], otherwise: str) -> str:
    """'apt-get install -y git, or set vllm_prerequisites_install: true' for a known family."""
    if manager and packages:
        return f"{INSTALL_COMMAND[manager]} {' '.join(packages)}, or {otherwise}"
    return otherwise


def problems(need: Need, seen: Observed) -> List[Problem]:
    """Every missing piece of `need` on the host `seen`, in the order a deploy would meet them."""
    found: List[Problem] = []
    manager = seen.package_manager
    allow = "set vllm_prerequisites_install: true"
    minor = seen.python_version
    versioned = f"python{minor[0]}.{minor[1]}" if minor else "python3"

    if not seen.python:
        # Only a python named the way its package is (python3, python3.12): a path or another name is the user's.
        named = re.fullmatch(r"python3(\.\d+)?", need.python)
        packages = {APT: [need.python, f"{need.python}-venv"], DNF: [need.python]}.get(manager, []) if named else []
        found.append(
            Problem(
                "python",
                f"{need.python} (vllm_python) is not found on the host: "
                + _fix(manager, packages, f"set vllm_python to a python {_dotted(PYTHON_MIN)}-{_dotted(PYTHON_MAX)}"),
                packages,
            )
        )
    elif minor is None or not PYTHON_MIN <= minor <= PYTHON_MAX:
        # Another python is a choice of the user (vllm_python), never installed over the system's.
        packages = {APT: ["python3.12", "python3.12-venv"], DNF: ["python3.12"]}.get(manager, [])
        found.append(
            Problem(
                "python_version",
                f"{seen.python} is python {_dotted(minor)}; vLLM needs {_dotted(PYTHON_MIN)} to {_dotted(PYTHON_MAX)}: "
                + (f"{INSTALL_COMMAND[manager]} {' '.join(packages)} and " if manager else "install one and ")
                + "set vllm_python to it (for a full build, the same minor version as the other hosts)",
            )
        )
    elif not seen.python_has_venv and (need.installer == "pip" or not seen.uv):
        # Without a uv, the uv provisioning (and the pip installer) run `python -m venv` with pip.
        wanted = {APT: [f"{versioned}-venv"], DNF: [f"{versioned}-pip-wheel"]}.get(manager, [])
        found.append(
            Problem(
                "venv",
                f"{versioned}'s venv is missing ({seen.python} -m venv cannot make a venv with pip; the uv "
                "provisioning and the pip installer need it): "
                + _fix(manager, wanted, allow + ", or put uv on the PATH"),
                wanted,
            )
        )

    if need.git and not seen.git:
        wanted = ["git"] if manager else []
        found.append(
            Problem(
                "git",
                "git is missing (a vllm_ref install clones vLLM on the build host): "
                + _fix(manager, wanted, allow + ", or install a release or a wheel instead of a ref"),
                wanted,
            )
        )

    if need.full_build:
        compilers = {APT: ["build-essential"], DNF: ["gcc", "gcc-c++", "make"]}.get(manager, [])
        if not seen.gcc or not seen.gxx:
            missing = " and ".join(name for name, path in (("gcc", seen.gcc), ("g++", seen.gxx)) if not path)
            found.append(
                Problem(
                    "compiler",
                    f"{missing} missing (a full build compiles vLLM's C++/CUDA kernels): "
                    + _fix(manager, compilers, allow + ", or build with vllm_precompiled_wheel"),
                    compilers,
                )
            )
        elif seen.gcc_version is not None and seen.gcc_version < GCC_MIN:
            found.append(
                Problem(
                    "compiler_version",
                    f"gcc is {_dotted(seen.gcc_version)}; a full build of vLLM needs gcc >= {_dotted(GCC_MIN)}: "
                    "install a newer one (gcc-12 on Debian/Ubuntu, gcc-toolset-12 on the RHEL family) and put it first "
                    "on the PATH of vllm_build_env, or build with vllm_precompiled_wheel",
                )
            )
        cuda = parse_cuda(need.cuda)
        toolkit = f"cuda-toolkit-{cuda[0]}-{cuda[1]}" if cuda else "cuda-toolkit"
        if not seen.nvcc:
            found.append(
                Problem(
                    "cuda_toolkit",
                    "nvcc is missing (a full build needs a CUDA toolkit"
                    + (f" {cuda[0]}.{cuda[1]}, the CUDA torch was built for" if cuda else "")
                    + "; looked in CUDA_HOME of vllm_build_env, the PATH and /usr/local/cuda/bin): "
                    f"install {toolkit} from NVIDIA's CUDA repository and set vllm_build_env.CUDA_HOME, "
                    "or build with vllm_precompiled_wheel",
                )
            )
        elif cuda and seen.nvcc_version and seen.nvcc_version[0] != cuda[0]:
            found.append(
                Problem(
                    "cuda_toolkit_version",
                    f"{seen.nvcc} is CUDA {_dotted(seen.nvcc_version)} but torch was built for CUDA "
                    f"{cuda[0]}.{cuda[1]} (vllm_prerequisites_cuda): torch refuses to build extensions with another "
                    f"CUDA major; install {toolkit} and set vllm_build_env.CUDA_HOME to it",
                )
            )

    cuda = parse_cuda(need.cuda)
    if cuda:
        floor = DRIVER_FLOOR.get(cuda[0])
        if seen.driver_version is None:
            found.append(
                Problem(
                    "driver",
                    "no NVIDIA driver is loaded (/proc/driver/nvidia/version and nvidia-smi are missing): install "
                    f"the NVIDIA driver{' >= ' + _dotted(floor) if floor else ''} for CUDA {cuda[0]}.{cuda[1]} "
                    "(and reboot), or set vllm_prerequisites_cuda: '' for a host without a GPU",
                )
            )
        elif floor and seen.driver_version < floor:
            found.append(
                Problem(
                    "driver_version",
                    f"the NVIDIA driver is {_dotted(seen.driver_version)}; torch built for CUDA {cuda[0]}.{cuda[1]} "
                    f"needs >= {_dotted(floor)}: upgrade the driver (and reboot), or install a vLLM/torch built for "
                    "an older CUDA and set vllm_prerequisites_cuda to it",
                )
            )

    needed = int(need.min_free_gb * 1024**3)
    if seen.disk_free_bytes < needed:
        found.append(
            Problem(
                "disk",
                f"{seen.disk_path} has {seen.disk_free_bytes / 1024**3:.1f} GiB free, a release under {need.root} "
                f"needs {need.min_free_gb:g} GiB (vllm_prerequisites_min_free_gb): free space there, or set "
                "vllm_root to a larger file system, or lower vllm_keep_releases",
            )
        )
    return found


def installable(found: List[Problem]) -> List[str]:
    """The packages that fix the problems a package can fix, each once, in order."""
    packages: List[str] = []
    for problem in found:
        packages += [name for name in problem.packages if name not in packages]
    return packages


def summary(found: List[Problem]) -> str:
    """One message for the failure: every problem, each with its fix."""
    return f"{len(found)} prerequisite(s) missing on this host, nothing was built or changed: " + "; ".join(
        f"({index}) {problem.msg}" for index, problem in enumerate(found, start=1)
    )
