"""The host environment of a build: interpreter, installer, MAX_JOBS, caches (no build runs here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_host import (
    _PROBE,
    TOOLS_UV,
    cache_env,
    derive_max_jobs,
    find_installer,
    max_jobs,
    probe_python,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import OptionError


def _meminfo(tmp_path: Path, available_kib: int) -> str:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       99999999 kB\nMemFree:  1 kB\nMemAvailable:   {available_kib} kB\n")
    return str(path)


@pytest.mark.parametrize(
    ("cpus", "available_gib", "jobs"),
    [(16, 20.5, 5), (2, 24, 2), (64, 256, 64), (8, 3.9, 1), (8, 0, 1)],
)
def test_max_jobs_is_bounded_by_cpus_and_memory(tmp_path, cpus, available_gib, jobs):
    meminfo = _meminfo(tmp_path, int(available_gib * 1024 * 1024))
    derived, why = derive_max_jobs(cpus=cpus, meminfo=meminfo, cgroup=str(tmp_path / "no-cgroup"))
    assert derived == jobs
    assert why.startswith(f"min({cpus} CPUs, {available_gib:.1f} GiB available / 4 GiB per job")
    assert ("at least 1" in why) is (available_gib < 4)


def test_max_jobs_honours_a_cgroup_memory_limit_and_unknown_memory(tmp_path):
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text(str(10 * 1024**3) + "\n")
    (cgroup / "memory.current").write_text(str(2 * 1024**3) + "\n")
    meminfo = _meminfo(tmp_path, 64 * 1024 * 1024)
    assert derive_max_jobs(cpus=32, meminfo=meminfo, cgroup=str(cgroup))[0] == 2  # 8 GiB of headroom
    (cgroup / "memory.max").write_text("max\n")
    assert derive_max_jobs(cpus=32, meminfo=meminfo, cgroup=str(cgroup))[0] == 16
    assert derive_max_jobs(cpus=3, meminfo=str(tmp_path / "none"), cgroup=str(tmp_path / "none")) == (
        3,
        "3 CPUs (available memory unknown)",
    )


def test_cache_env_per_installer_and_compiler_cache(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    env = {"PATH": str(tools)}
    assert cache_env("/opt/vllm", "pip", env) == {"PIP_CACHE_DIR": "/opt/vllm/cache/pip"}
    # uv links each package from its cache into the release (same file system): releases share blocks
    assert cache_env("/opt/vllm", "uv", env) == {"UV_CACHE_DIR": "/opt/vllm/cache/uv", "UV_LINK_MODE": "hardlink"}
    for tool in ("ccache", "sccache"):
        (tools / tool).write_text("#!/bin/sh\n")
        (tools / tool).chmod(0o755)
    assert cache_env("/opt/vllm", "uv", dict(env, UV_LINK_MODE="copy")) == {
        "UV_CACHE_DIR": "/opt/vllm/cache/uv",
        "CCACHE_DIR": "/opt/vllm/cache/ccache",
        "SCCACHE_DIR": "/opt/vllm/cache/sccache",
    }
    assert cache_env("/opt/vllm", "pip", dict(env, PIP_CACHE_DIR="/x", CCACHE_DIR="/y")) == {
        "SCCACHE_DIR": "/opt/vllm/cache/sccache"
    }


def test_torch_version_is_probed_only_without_build_isolation(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "torch-2.9.0.dist-info").mkdir(parents=True)
    (site / "torch-2.9.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.9.0\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    version = ".".join(str(part) for part in sys.version_info[:3])
    assert probe_python(sys.executable, with_torch=True) == (version, "2.9.0")
    assert probe_python(sys.executable, with_torch=False) == (version, None)


def test_max_jobs_is_derived_only_when_the_user_did_not_set_it():
    derived = max_jobs({}, {})
    assert derived["source"].startswith("derived: min(") and int(derived["value"]) >= 1
    assert max_jobs({"MAX_JOBS": "3"}, {"MAX_JOBS": "7"}) == {"value": "3", "source": "build_env"}
    assert max_jobs({}, {"MAX_JOBS": "7"}) == {"value": "7", "source": "the environment of the module"}


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_auto_takes_the_collections_uv_first_then_path_then_pip(tmp_path):
    root = tmp_path / "root"
    on_path = _executable(tmp_path / "bin" / "uv")
    empty = str(tmp_path / "empty")
    assert find_installer("auto", str(root), path=empty).name == "pip"
    found = find_installer("auto", str(root), path=str(on_path.parent))
    assert (found.name, found.executable) == ("uv", str(on_path))
    provisioned = _executable(root / TOOLS_UV)
    for path in (empty, str(on_path.parent)):  # the role's pinned uv wins over whatever PATH holds
        assert find_installer("auto", str(root), path=path).executable == str(provisioned)
    assert find_installer("pip", str(root), path=str(on_path.parent)).name == "pip"


def test_uv_requested_but_missing_names_both_places(tmp_path):
    with pytest.raises(OptionError, match=r"installer .uv. requested but `uv` is not on PATH nor at .*tools/bin/uv"):
        find_installer("uv", str(tmp_path), path=str(tmp_path / "empty"))
    with pytest.raises(OptionError, match="installer 'conda' is not one of auto, uv, pip"):
        find_installer("conda", str(tmp_path))


def test_the_probe_reads_package_metadata_only_when_torch_is_asked_for():
    # importlib.metadata is most of the probe's CPU, and every host's look runs the probe (bench-fleet).
    for args, imported in (([], False), (["torch"], True)):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", _PROBE, *args], capture_output=True, text=True, check=True
        )
        assert proc.stdout.splitlines()[0] == ".".join(str(part) for part in sys.version_info[:3])
        assert len(proc.stdout.splitlines()) == (2 if imported else 1)
        assert ("importlib.metadata" in proc.stderr) is imported
