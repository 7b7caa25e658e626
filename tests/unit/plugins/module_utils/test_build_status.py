"""build-status.json: stages, ticks from the log, durations; nothing written in check mode; no secret."""

from __future__ import annotations

import json
import os
import time

from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import StatusFile


def test_status_file_stages_ticks_and_durations(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("[t] $ pip wheel .\n  Building wheel for vllm: started\r  Building wheel for vllm: still running\n")
    status = StatusFile(str(tmp_path), "run-7", "main")
    status.stage("resolve", "resolving main")
    time.sleep(0.05)
    status.stage("build", log_path=str(log))
    status.tick()
    data = json.loads((tmp_path / "build-status.json").read_text())
    assert (data["run_id"], data["ref"], data["stage"], data["pid"]) == ("run-7", "main", "build", os.getpid())
    assert data["last_line"] == "Building wheel for vllm: still running"
    assert data["stage_seconds"]["resolve"] >= 0.05 and data["elapsed"] >= 0.05
    assert set(status.durations()) == {"resolve", "build"}
    StatusFile(str(tmp_path / "check"), None, "main", enabled=False).stage("resolve")
    assert not (tmp_path / "check").exists()


def test_status_file_never_shows_a_secret(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("fetching https://ci:tok123@git.example.com/x.git with HF=hf_abcdef\n")
    status = StatusFile(str(tmp_path), "run-8", "main", secrets=["hf_abcdef"])
    status.stage("build", log_path=str(log))
    status.tick()
    text = (tmp_path / "build-status.json").read_text()
    assert "tok123" not in text and "hf_abcdef" not in text
    assert json.loads(text)["last_line"] == "fetching https://git.example.com/x.git with HF=********"
