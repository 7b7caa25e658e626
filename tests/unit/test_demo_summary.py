"""`make demo` ends with the deploy's summary line per host, not molecule's recap (issue 15 item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "tools" / "demo_summary.py"
# The tail of a real `make demo` log (2026-12-01): the summary play, then molecule's recap.
LOG = ROOT / "tests" / "unit" / "fixtures" / "demo" / "converge-tail.log"
LINE = (
    "gpu1: release 7f13c8c3ca15-f679d9b8 commit 7f13c8c3ca15: AL 4.00 (95% CI 4.00-4.00) vs none (relative rules"
    " skipped: no last good release), 9072.8 tokens/s, verdict PASS, report /var/lib/vllm-gate/default.md"
)


def _summary(log: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(log)], capture_output=True, text=True, check=False)


def test_the_summary_line_is_the_last_output():
    proc = _summary(LOG)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == LINE
    assert "SCENARIO RECAP" in LOG.read_text()  # the log itself ends in molecule's recap


def test_one_line_per_host_in_inventory_order(tmp_path):
    text = LOG.read_text()
    second = "ok: [localhost] => (item=gpu2) =>\n    msg: 'gpu2: no gate verdict: the rollout failed before the gate'\n"
    log = tmp_path / "two.log"
    log.write_text(text.replace("\nPLAY RECAP", second + "\nPLAY RECAP", 1))
    lines = _summary(log).stdout.splitlines()
    assert lines[-2:] == [LINE, "gpu2: no gate verdict: the rollout failed before the gate"]


def test_a_log_without_the_summary_fails_the_demo(tmp_path):
    log = tmp_path / "no-summary.log"
    log.write_text(
        "\n".join(line for line in LOG.read_text().splitlines() if "msg:" not in line and "=> (item" not in line)
    )
    proc = _summary(log)
    assert proc.returncode == 1
    assert "no deploy summary line" in proc.stderr and str(log) in proc.stderr


def test_the_demo_target_prints_the_summary_last():
    env = dict(os.environ, MAKEFLAGS="")
    proc = subprocess.run(["make", "-n", "-s", "demo"], cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    commands = proc.stdout.strip().splitlines()
    assert commands[-1].endswith("tests/tools/demo_summary.py .cache/demo-converge.log"), commands[-3:]
    assert any("molecule converge -s default" in c and "tee .cache/demo-converge.log" in c for c in commands)
