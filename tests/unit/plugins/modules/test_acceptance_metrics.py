# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""acceptance_metrics run as Ansible runs it: a subprocess reading its arguments from a JSON file."""

from __future__ import annotations

import stat

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.plugins.modules import acceptance_metrics
from ansible_collections.vllm_ops.dflash.tests.helpers import module_runner

# The shape of acceptance_gate's registered result after a pass (figures + report, see its RETURN).
REPORT = {
    "schema": 1,
    "passed": True,
    "verdict": "pass",
    "model": "qwen36",
    "metrics_model_name": "qwen36",
    "finished_at": "2026-12-01T10:00:00Z",
    "thresholds": {"min_mean_acceptance_length": 2.0, "min_draft_acceptance_rate": None, "min_drafts": 50},
    "mean_acceptance_length": 2.9953,
    "mean_acceptance_length_ci95": [2.8628, 3.1279],
    "draft_acceptance_rate": 0.4988,
    "per_position_acceptance": [0.7972, 0.6107, 0.4009, 0.1865],
    "drafts": 429,
    "tokens_per_second": 412.5,
}
GATE = {**{k: REPORT[k] for k in ("passed", "mean_acceptance_length", "drafts")}, "report": REPORT, "changed": False}


def run_module(tmp_path, check_mode=False, diff=False, **args):
    return module_runner.run_module("acceptance_metrics", tmp_path, args, check_mode=check_mode, diff=diff)[0]


@pytest.mark.slow
def test_writes_the_file_once_then_reports_no_change(tmp_path):
    path = tmp_path / "textfile" / "vllm-default.prom"
    first = run_module(tmp_path, path=str(path), gate=GATE, release="r1")
    assert first.get("failed") is not True, first.get("msg")
    assert first["changed"] is True
    assert path.read_text() == first["metrics"]
    assert (
        'dflash_gate_mean_acceptance_length{vllm_instance="default",model_name="qwen36"} 2.9953\n' in first["metrics"]
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["vllm-default.prom"]  # no temporary left behind
    second = run_module(tmp_path, path=str(path), gate=GATE, release="r1")
    assert second["changed"] is False
    third = run_module(tmp_path, path=str(path), gate=GATE, release="r2", diff=True)
    assert third["changed"] is True
    assert 'release="r1"' in third["diff"]["before"] and 'release="r2"' in third["diff"]["after"]


def test_check_mode_writes_nothing(tmp_path):
    path = tmp_path / "vllm-default.prom"
    result = run_module(tmp_path, check_mode=True, diff=True, path=str(path), gate=GATE)
    assert result["changed"] is True and result["diff"]["before"] == ""
    assert not path.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"path": "vllm.txt", "gate": GATE}, "does not end in .prom"),
        ({"gate": {"changed": False, "skipped": True, "passed": None}}, "no verdict"),
        ({"gate": GATE, "labels": {"bad-name": "x"}}, "not a valid Prometheus label name"),
    ],
)
def test_bad_input_fails_and_leaves_the_old_file(tmp_path, args, needle):
    path = tmp_path / "vllm-default.prom"
    path.write_text("# the previous gate\n")
    result = run_module(tmp_path, **{"path": str(path), **args})
    assert result["failed"] is True
    assert needle in result["msg"] and "Fix:" in result["msg"]
    assert path.read_text() == "# the previous gate\n"


def test_unwritable_directory_names_the_fix(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_module(tmp_path, path=str(blocker / "vllm.prom"), gate=GATE)
    assert result["failed"] is True and "Fix: point path at a writable directory" in result["msg"]


def test_argument_spec_matches_the_documentation():
    options = yaml.safe_load(acceptance_metrics.DOCUMENTATION)["options"]
    assert set(options) == set(acceptance_metrics.ARGUMENT_SPEC)
    for name, spec in acceptance_metrics.ARGUMENT_SPEC.items():
        documented = options[name]
        assert documented["type"] == spec["type"], name
        assert documented.get("default") == spec.get("default"), name
        assert documented.get("required", False) == spec.get("required", False), name
    assert set(yaml.safe_load(acceptance_metrics.RETURN)) == {"path", "metrics"}
