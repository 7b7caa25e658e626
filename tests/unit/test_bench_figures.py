"""bench/: how the gate's own cost is counted out of a playbook's JSON callback output (issue 15 item 7)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402 (bench/ is not a package)

KEEP = "Record the release as good and keep its config, env and unit as the last good ones"


def _task(name: str, start: str, end: str) -> dict:
    return {"task": {"name": name, "duration": {"start": start, "end": end}}, "hosts": {}}


def test_the_gate_names_are_the_roles_own_tasks():
    names = run.gate_task_names()
    assert run.GATE_TASK in names
    assert "Validate the gate workload" in names and "Load the workload YAML" in names  # block members too
    assert "Restart the previous release" not in names  # the rollback is not the gate's cost
    assert KEEP in names  # the bookkeeping after a pass is the gate's cost too


def test_the_gate_seconds_are_the_union_of_its_tasks_in_every_batch():
    t = "2026-12-01T10:00:{:02d}.000000Z".format
    gate = "vllm_ops.dflash.dflash_gate : "
    report = {
        "plays": [
            {"tasks": [_task(gate + "Validate the gate workload", t(0), t(1))]},
            {
                "tasks": [
                    _task("vllm_ops.dflash.vllm_service : Wait for /health", t(1), t(10)),
                    _task(gate + run.GATE_TASK, t(10), t(14)),
                    _task(gate + KEEP, t(13), t(15)),  # overlaps: counted once
                    _task(gate + "Record what the server was started on", t(15), t(20)),  # serving_record.yml
                    _task(gate + run.GATE_TASK, t(30), t(34)),  # the second serial batch
                ]
            },
        ],
        "stats": {},
    }
    playbook = run.PlaybookRun("deploy", 40.0, report)
    assert playbook.role_seconds("dflash_gate", run.gate_task_names()) == 1 + 5 + 4
