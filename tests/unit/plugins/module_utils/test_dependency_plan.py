"""The python-only bump's dependency plan (_dependency_plan): uv's dry run read, a venv's distributions read,
and the difference that makes the bump's venv what a fresh install gets."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import BuildError, canonical_package
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_paths import Paths
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import StatusFile
from ansible_collections.vllm_ops.dflash.plugins.module_utils._builder import Builder, BuilderOptions
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import Deadline
from ansible_collections.vllm_ops.dflash.plugins.module_utils._dependency_plan import (
    DependencyPlan,
    PlanError,
    difference,
    installed,
    planned_uv,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._installer import Installer

# What uv 0.13.9 printed on stderr for a dry run of a local wheel into an empty venv (the fixture engine's).
UV_DRY_RUN = """\
Using Python 3.11.7 environment at: /opt/vllm/build/x/dependency-plan/venv
Resolved 3 packages in 1ms
Would download 2 packages
Would install 3 packages
 + httpx2==2.17.0
 + PyYAML==6.0.4
 + vllm @ file:///opt/vllm/wheels/x/vllm-0.1.dev7+ge54c43d9d-cp38-abi3-linux_x86_64.whl
"""


def test_uvs_plan_is_read_by_canonical_name():
    assert planned_uv(UV_DRY_RUN) == {
        "httpx2": "2.17.0",
        "pyyaml": "6.0.4",
        "vllm": "@ file:///opt/vllm/wheels/x/vllm-0.1.dev7+ge54c43d9d-cp38-abi3-linux_x86_64.whl",
    }


@pytest.mark.parametrize(
    "output",
    [
        "Resolved 0 packages in 1ms\nAudited 0 packages in 1ms\n",  # nothing it would install
        " + httpx2==2.17.0\n",  # a plan line without the summary: not the format read here
        "Would install 1 package\n + httpx2\n",  # no version
    ],
)
def test_a_plan_that_is_not_uvs_format_is_an_error(output):
    with pytest.raises(PlanError, match="uv's dry run names no package"):
        planned_uv(output)


def test_the_installed_distributions_are_read_from_their_metadata(tmp_path):
    for directory, metadata in {
        "PyYAML-6.0.3.dist-info": "Metadata-Version: 2.1\nName: PyYAML\nVersion: 6.0.3\n\nName: not-a-header\n",
        "typing_extensions-4.12.2.dist-info": "Name: typing_extensions\nVersion: 4.12.2\n",
        "broken-1.0.dist-info": "Summary: no name\n",  # no Name/Version: not counted
        "yaml": "Name: not-a-dist-info\nVersion: 1\n",
    }.items():
        (tmp_path / directory).mkdir()
        (tmp_path / directory / "METADATA").write_text(metadata)
    assert installed(str(tmp_path)) == {"pyyaml": "6.0.3", "typing-extensions": "4.12.2"}
    assert installed(str(tmp_path / "missing")) == {}


def test_the_difference_pins_what_moved_and_removes_what_is_no_longer_wanted():
    planned = {"vllm": "0.2", "httpx2": "2.17.0", "httpcore2": "2.17.0", "idna": "3.21", "new-dep": "1.0"}
    held = {"vllm": "0.1", "httpx2": "2.16.2", "httpcore2": "2.16.2", "idna": "3.21", "old-dep": "0.9", "pip": "24"}
    pins, removed = difference(planned, held, {"pip": "24"}, "vLLM")
    # The package is the bump's own; idna is as planned; pip is what the empty venv holds too.
    assert pins == ["httpcore2==2.17.0", "httpx2==2.17.0", "new-dep==1.0"]
    assert removed == ["old-dep"]
    assert difference(planned, dict(planned), {}, "vllm") == ([], [])


def test_canonical_names_compare_as_pep_503_says():
    assert canonical_package("Typing.Extensions") == canonical_package("typing_extensions") == "typing-extensions"


def fake_uv(tmp_path: Path, dry_run_output: str, rc: int = 0) -> Path:
    """A `uv` that makes a venv (a site-packages, nothing in it) and answers a dry run with `dry_run_output`
    on stderr and `rc`; any other command fails (the plan must not install when it cannot be read)."""
    script = tmp_path / "uv"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = venv ]; then for a; do v="$a"; done; mkdir -p "$v/lib/python3.11/site-packages"; exit 0; fi\n'
        'case "$*" in *--dry-run*) cat "$0.out" >&2; exit "$(cat "$0.rc")";; esac\n'
        'echo unexpected: "$*" >&2; exit 99\n'
    )
    script.chmod(0o755)
    (tmp_path / "uv.out").write_text(dry_run_output)
    (tmp_path / "uv.rc").write_text(str(rc))
    return script


def builder_for(tmp_path: Path, uv: Path, seconds: float = 60.0) -> Builder:
    root = tmp_path / "root"
    paths = Paths(str(root), "abc-123")
    os.makedirs(os.path.dirname(paths.log), exist_ok=True)
    options = BuilderOptions(build_env={}, pip_args=["--no-index"], build_timeout=seconds, build_isolation=True,
                             system_site_packages=False)  # fmt: skip
    status = StatusFile(str(root), None, "main", enabled=False)
    return Builder(options, paths, Deadline(seconds), Installer("uv", str(uv)), sys.executable, status, {})


def bump_venv(tmp_path: Path, held: Dict[str, str]) -> Path:
    venv = tmp_path / "bump-venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    for name, version in held.items():
        (site / f"{name}-{version}.dist-info").mkdir(parents=True)
        (site / f"{name}-{version}.dist-info" / "METADATA").write_text(f"Name: {name}\nVersion: {version}\n")
    return venv


WHEEL = "/opt/vllm/wheels/abc/vllm-0.2-py3-none-any.whl"


@pytest.mark.parametrize(
    ("output", "rc", "refusal"),
    [
        ("error: No solution found when resolving dependencies\n", 1, "failed with exit code 1"),
        ("Would install 1 package\n + idna==3.21\n", 0, "would install vllm not at all"),
        ("Would install 2 packages\n + idna==3.21\n + vllm==0.1\n", 0, "would install vllm 0.1"),
        (f"Would install 2 packages\n + tool @ https://x/tool.whl\n + vllm @ file://{WHEEL}\n", 0,
         "takes tool from a URL: no version to pin"),
    ],
)  # fmt: skip
def test_a_plan_that_cannot_be_read_or_applied_is_a_refusal_and_changes_nothing(tmp_path, output, rc, refusal):
    builder = builder_for(tmp_path, fake_uv(tmp_path, output, rc))
    venv = bump_venv(tmp_path, {"vllm": "0.2", "idna": "3.20"})
    plan = DependencyPlan(builder, WHEEL)
    try:
        with pytest.raises(PlanError, match=refusal):
            plan.settle(str(venv), "vllm", "0.2")
    finally:
        plan.close()
    assert installed(str(venv / "lib" / "python3.11" / "site-packages")) == {"vllm": "0.2", "idna": "3.20"}
    assert not os.path.exists(plan.directory)  # the empty venv is gone
    log = Path(builder.paths.log).read_text()
    assert output.splitlines()[0] in log  # what uv said is in the build log


def test_a_plan_equal_to_the_venv_installs_nothing(tmp_path):
    output = f"Would install 2 packages\n + idna==3.21\n + vllm @ file://{WHEEL}\n"
    builder = builder_for(tmp_path, fake_uv(tmp_path, output))
    venv = bump_venv(tmp_path, {"vllm": "0.2", "idna": "3.21"})
    plan = DependencyPlan(builder, WHEEL)
    try:
        assert plan.settle(str(venv), "vllm", "0.2") == {"planned": 2, "installed": [], "removed": []}
    finally:
        plan.close()


def test_a_dry_run_that_outlives_the_deadline_fails_the_build(tmp_path):
    uv = fake_uv(tmp_path, "")
    uv.write_text("#!/bin/sh\nexec sleep 30\n")
    builder = builder_for(tmp_path, uv, seconds=1.0)
    plan = DependencyPlan(builder, WHEEL)
    try:
        with pytest.raises(BuildError, match="timed out: build_timeout=1s"):
            plan.settle(str(bump_venv(tmp_path, {"vllm": "0.2"})), "vllm", "0.2")
    finally:
        plan.close()
