"""The python-only bump's dependency plan (_dependency_plan): uv's dry run read, a venv's distributions read,
and the difference that makes the bump's venv what a fresh install gets."""

from __future__ import annotations

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._dependency_plan import (
    PlanError,
    canonical,
    difference,
    installed,
    planned_uv,
)

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
    assert canonical("Typing.Extensions") == canonical("typing_extensions") == "typing-extensions"
