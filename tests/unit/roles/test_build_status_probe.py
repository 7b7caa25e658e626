"""vllm_install's poll loop sees a dead build (issue 14 item 8): files/build_status.py on the target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROLE = Path(__file__).resolve().parents[3] / "roles" / "vllm_install"
SCRIPT = (ROLE / "files" / "build_status.py").read_text()


def probe(status_path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(status_path)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout) if out.stdout.strip() else {}


def test_a_running_build_is_alive(tmp_path):
    status = tmp_path / "build-status.json"
    status.write_text(json.dumps({"run_id": "r", "pid": os.getpid(), "stage": "build", "log_path": None}))
    assert probe(status)["alive"] is True


def test_a_dead_build_is_reported_with_its_log_tail(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: the pid is free
    log = tmp_path / "build.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    status = tmp_path / "build-status.json"
    status.write_text(json.dumps({"run_id": "r", "pid": gone.pid, "stage": "build", "log_path": str(log)}))
    result = probe(status)
    assert result["alive"] is False and result["stage"] == "build"
    assert result["log_tail"] == [f"line {i}" for i in range(70, 100)]


def test_a_zombie_build_is_dead(tmp_path):
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _attempt in range(6000):  # exited, not reaped yet (at most a minute on a busy machine)
            if Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the child did not exit")
        status = tmp_path / "build-status.json"
        status.write_text(json.dumps({"run_id": "r", "pid": zombie.pid, "stage": "build"}))
        assert probe(status)["alive"] is False
    finally:
        zombie.wait()


def _start_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[19])


def test_a_reused_pid_is_not_taken_for_the_build(tmp_path):
    """Issue 28, case 19a: the build died and its pid went to another process; the role polled that
    stranger for build_timeout + 300 s. The status names (pid, start time): a later start is not the build."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        status = tmp_path / "build-status.json"
        build = {"run_id": "r", "pid": stranger.pid, "stage": "build", "log_path": None}
        status.write_text(json.dumps(dict(build, pid_start=_start_of(stranger.pid) - 1)))  # started earlier
        result = probe(status)
        assert result["alive"] is False and result["pid_reused"] is True
        status.write_text(json.dumps(dict(build, pid_start=_start_of(stranger.pid))))  # the same process
        assert probe(status)["alive"] is True
    finally:
        stranger.kill()
        stranger.wait()


def test_the_status_file_records_the_pid_and_its_start(tmp_path):
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_status import StatusFile

    StatusFile(str(tmp_path), "r", "main").stage("resolve")
    data = json.loads((tmp_path / "build-status.json").read_text())
    assert (data["pid"], data["pid_start"]) == (os.getpid(), _start_of(os.getpid()))


def test_no_status_yet_prints_nothing(tmp_path):
    assert probe(tmp_path / "missing.json") == {}


def test_the_poll_loop_stops_on_a_dead_build():
    (wrapper,) = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())  # the file's one block (tags, root)
    block = next(t for t in wrapper["block"] if "block" in t)
    follow = next(t for t in block["block"] if t["name"].startswith("Follow the build"))
    assert "build_status.py" in follow["ansible.builtin.command"]["argv"][2]
    assert "not vllm_install_status.alive" in follow["loop_control"]["break_when"][0]
    died = next(t for t in block["block"] if t["name"] == "Stop following a build that died")
    assert died["ansible.builtin.include_tasks"] == "build_died.yml"
