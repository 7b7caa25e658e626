"""deploy_dflash.yml's batches and their hooks (issue 27 item 5): drain a host before it changes, re-add it after
its gate, a batch at a time, never every other host at once by default.

The rollout play of the real playbook runs under ansible-playbook on local hosts, each role import of its
block and rescue replaced by a task that logs its name (the rescue's rollback fails, as the real one does):
what is checked is the play's own order, batches and conditions, with the playbook's hook includes as they are.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.playbook import opened, task_file

ROOT = Path(__file__).resolve().parents[3]
PLAYBOOK = ROOT / "playbooks" / "deploy_dflash.yml"
# The play as written (its one task includes tasks/rollout.yml) and the tasks that include runs.
ROLLOUT = next(play for play in yaml.safe_load(PLAYBOOK.read_text()) if play["name"] == "Roll out vLLM with DFlash")
ROLLOUT_TASKS = opened(ROLLOUT["tasks"])
HOSTS = [f"gpu{i}" for i in range(1, 9)]


def stubbed(task: dict, fail_on: str) -> dict:
    """A role import becomes one task that prints 'STEP <host> <task name>'; the gate fails on fail_on."""
    if "ansible.builtin.import_role" not in task:
        return task
    stub = {"name": task["name"], "ansible.builtin.debug": {"msg": f"STEP {{{{ inventory_hostname }}}} {task['name']}"}}
    if task["name"] == "Run the service and wait until it is ready":
        stub["tags"] = ["vllm_service", "service"]  # the tags of vllm_service's tasks (the bare one until 1.0.0)
    if task["name"] == "Gate on the acceptance length":
        stub["failed_when"] = f"inventory_hostname == '{fail_on}'"
    if task["name"] == "Roll back this host":
        stub["failed_when"] = True  # the real rollback fails the host after restoring it
    return stub


def run_rollout(
    tmp_path: Path, fail_on: str = "", args: tuple = (), **extra: object
) -> tuple[list[str], subprocess.CompletedProcess]:
    # The play with its include as written (tags and all); the included file's per-host block with its stubs, its
    # other tasks as they are, but monitoring (a role, off).
    play = dict(ROLLOUT, hosts="gpu_hosts")
    tasks = [
        dict(
            task,
            block=[stubbed(t, fail_on) for t in task["block"]],
            rescue=[stubbed(t, fail_on) for t in task["rescue"]],
        )
        if "block" in task
        else task
        for task in ROLLOUT_TASKS
        if "ansible.builtin.include_role" not in task
    ]
    (included,) = [task_file(task, tmp_path) for task in play["tasks"]]
    assert included is not None
    included.parent.mkdir(parents=True, exist_ok=True)
    included.write_text(yaml.safe_dump(tasks, sort_keys=False))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play], sort_keys=False))
    hook = tmp_path / "hook.yml"
    hook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Log the hook",
                    "ansible.builtin.debug": {
                        "msg": "STEP {{ inventory_hostname }} hook-{{ dflash_batch_phase }}"
                        " batch={{ ansible_play_batch | join(',') }}"
                    },
                }
            ]
        )
    )
    (tmp_path / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "gpu_hosts": {
                    # each host its own root: the deploy lock (real) is per host, and never under /opt/vllm here
                    "hosts": {key: {"vllm_root": str(tmp_path / key)} for key in HOSTS},
                    "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
                }
            }
        )
    )
    extra = {"dflash_batch_pre_tasks": str(hook), "dflash_batch_post_tasks": str(hook), **extra}
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(tmp_path / "hosts.yml"),
            str(tmp_path / "play.yml"),
            "-e",
            yaml.safe_dump({k: v for k, v in extra.items() if v is not None}, default_flow_style=True),
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_FORKS="8"),
    )
    steps = [
        line.split('"msg": "STEP ', 1)[1].rstrip('"') for line in proc.stdout.splitlines() if '"msg": "STEP ' in line
    ]
    return steps, proc


def steps_of(lines: list[str], host: str) -> list[str]:
    return [line.split(" ", 1)[1].split(" batch=")[0] for line in lines if line.split(" ", 1)[0] == host]


@pytest.mark.slow
def test_each_host_is_drained_before_it_changes_and_re_added_after_its_gate(tmp_path):
    lines, proc = run_rollout(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in HOSTS:
        steps = steps_of(lines, host)
        assert steps[0] == "hook-pre", steps
        assert steps[-1] == "hook-post", steps
        assert steps.index("Run the service and wait until it is ready") < steps.index("Gate on the acceptance length")
        assert steps.count("hook-pre") == steps.count("hook-post") == 1
    # Batches: the canary alone, then a quarter of the 8 hosts at a time (never the other 7 at once).
    batches = [line.split(" batch=")[1] for line in lines if " hook-pre " in line + " "]
    assert list(dict.fromkeys(batches)) == ["gpu1", "gpu2,gpu3", "gpu4,gpu5", "gpu6,gpu7", "gpu8"]


@pytest.mark.slow
def test_a_host_whose_gate_failed_is_rolled_back_and_stays_drained(tmp_path):
    lines, proc = run_rollout(tmp_path, fail_on="gpu2", dflash_max_fail_percentage=100)
    assert proc.returncode == 2
    assert steps_of(lines, "gpu2")[0] == "hook-pre"
    assert steps_of(lines, "gpu2")[-1] == "Roll back this host"
    assert "hook-post" not in steps_of(lines, "gpu2")
    assert steps_of(lines, "gpu3")[-1] == "hook-post"  # the others go on (max_fail_percentage 100 here)


@pytest.mark.slow
def test_a_failed_drain_fails_the_host_with_nothing_changed(tmp_path):
    hook = tmp_path / "bad-hook.yml"
    hook.write_text(yaml.safe_dump([{"name": "Drain", "ansible.builtin.fail": {"msg": "the balancer said no"}}]))
    lines, proc = run_rollout(tmp_path, dflash_batch_pre_tasks=str(hook))
    assert proc.returncode == 2
    assert "the balancer said no" in proc.stdout
    assert lines == []  # not installed, configured, restarted, nor rolled back: the canary failed first


@pytest.mark.slow
@pytest.mark.parametrize("tag", ["vllm_service", "service"])  # the role's tag, and its bare one until 1.0.0
def test_the_hooks_run_under_any_tags(tmp_path, tag):
    lines, proc = run_rollout(tmp_path, args=("--tags", tag), dflash_serial=[1, "100%"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in HOSTS:
        assert steps_of(lines, host) == ["hook-pre", "Run the service and wait until it is ready", "hook-post"]


@pytest.mark.slow
def test_no_hook_by_default(tmp_path):
    lines, proc = run_rollout(
        tmp_path, dflash_batch_pre_tasks=None, dflash_batch_post_tasks=None, dflash_serial=[1, "100%"]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [line for line in lines if "hook-" in line]
    assert len(steps_of(lines, "gpu8")) == 7  # every step of the block, nothing else


FAKE_SOCAT = """#!/bin/sh
# HAProxy's runtime API as the example uses it: 'set server' answers an empty line, 'show stat' is CSV whose
# scur (5th field) for vllm/gpu1 counts down from 2 over successive calls.
read -r line
echo "$line" >> "$LOG"
case "$line" in
  "show stat")
    n=$(cat "$COUNT" 2>/dev/null || echo 2)
    echo "# pxname,svname,qcur,qmax,scur,smax"
    echo "vllm,gpu10,0,0,7,9"
    echo "vllm,gpu1,0,0,$n,9"
    if [ "$n" -gt 0 ]; then echo $((n - 1)) > "$COUNT"; fi
    ;;
  "set server nosuch/"*) echo "No such backend." ;;
  "set server "*) echo "" ;;
  *) echo "Unknown command" ;;
esac
"""


def run_example(tmp_path: Path, **lb_vars: object) -> tuple[list[str], subprocess.CompletedProcess]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "socat").write_text(FAKE_SOCAT)
    (bin_dir / "socat").chmod(0o755)
    hook = tmp_path / "lb-drain.yml"
    hook.write_text((ROOT / "playbooks" / "hooks" / "lb-drain.yml.example").read_text())
    play = [
        {
            "hosts": "gpu1",
            "gather_facts": False,
            "vars": {"lb_haproxy_host": "gpu1", "lb_drain_delay": 0, "lb_drain_retries": 5, **lb_vars},
            "tasks": [
                {"ansible.builtin.include_tasks": str(hook), "vars": {"dflash_batch_phase": "pre"}},
                {"ansible.builtin.include_tasks": str(hook), "vars": {"dflash_batch_phase": "post"}},
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "hosts.yml").write_text(
        yaml.safe_dump(
            {"all": {"hosts": {"gpu1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}
        )
    )
    log = tmp_path / "socat.log"
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(tmp_path / "hosts.yml"),
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=dict(
            os.environ,
            PATH=f"{bin_dir}:{os.environ['PATH']}",
            LOG=str(log),
            COUNT=str(tmp_path / "count"),
            ANSIBLE_NOCOLOR="1",
        ),
    )
    return (log.read_text().splitlines() if log.exists() else []), proc


@pytest.mark.slow
def test_the_hook_example_drains_waits_for_sessions_and_re_adds(tmp_path):
    calls, proc = run_example(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # drain, then 'show stat' until gpu1 (not gpu10) has no session left, then ready
    assert calls == [
        "set server vllm/gpu1 state drain",
        "show stat",
        "show stat",
        "show stat",
        "set server vllm/gpu1 state ready",
    ]


@pytest.mark.slow
def test_the_hook_example_fails_when_haproxy_refuses(tmp_path):
    calls, proc = run_example(tmp_path, lb_backend="nosuch")
    assert proc.returncode == 2
    assert "No such backend." in proc.stdout
    assert calls == ["set server nosuch/gpu1 state drain"]  # no wait, no ready: the pre hook fails the host


def test_the_hook_example_is_one_file_for_both_phases():
    tasks = yaml.safe_load((ROOT / "playbooks" / "hooks" / "lb-drain.yml.example").read_text())
    assert all(next(iter(k for k in task if k != "name")).startswith("ansible.builtin.") for task in tasks)
    text = (ROOT / "playbooks" / "hooks" / "lb-drain.yml.example").read_text()
    assert "dflash_batch_phase == 'pre'" in text and "state drain" not in text  # the state comes from the phase
