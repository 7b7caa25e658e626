"""The controller killed at every task boundary of a rollout, then the deploy re-run (issue 28, Deliver item 3).

The rollout play of deploy_dflash.yml runs under ansible-playbook on one local host whose root, config dir and
state lie in a tmp dir: its block, rescue and batch hooks as they are; the activation (vllm_install
tasks_from activate), the serving check and record (dflash_gate serving_check / serving_record) and the gate's
record as good (the task of dflash_gate/tasks/main.yml) real, with the real vllm_release module doing every
change of `current` and state.json. Stand-ins (test equipment): the install (a release directory, its
manifest written last as vllm_build does), the config (one file), the service (a `systemctl` on PATH whose
restart makes the stand-in server load what `current` names, with a new InvocationID) and the gate's
measurement (it measures what the stand-in server runs and writes its result file). The batch hooks drain
and re-add the host (a flag file).

A callback plugin counts task starts (handlers too) and SIGKILLs ansible-playbook's process group when the
count reaches N. A first run without a kill bumps A to B and counts the boundaries T; then, for every N in
1..T, A is set up serving and good, the bump to B is killed at N, and the same deploy re-run to completion.
Asserted after each kill and after each re-run: no release is good whose gate did not pass on that release;
an undrained host serves a release that is good and passed its gate; the re-run ends with B good, serving
and the host re-added, and A's files intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.playbook import plays

ROOT = Path(__file__).resolve().parents[3]
PLAYBOOK = ROOT / "playbooks" / "deploy_dflash.yml"
GATE_TASKS = ROOT / "roles" / "dflash_gate" / "tasks" / "main.yml"
BIN = Path(sys.executable).parent
A, B = "aaaaaaaaaaaa-00000001", "bbbbbbbbbbbb-00000002"
# What the gate keeps as last good: the config (the unit's path is fixed, /etc/systemd/system: not kept here).
KEPT = [
    {
        "path": "{{ kp_etc }}/t.yaml",
        "last_good": "{{ kp_etc }}/t.yaml.last-good",
        "mode": "0644",
        "secret": False,
        "optional": False,
    }
]
RECORD_GOOD = "Record the release as good and keep its config, env and unit as the last good ones"

# What `systemctl` does for the stand-in server: its state is $KP/server.json (the release it loaded at its
# last start and that start's InvocationID); a restart loads what current names now.
SYSTEMCTL = """#!/bin/sh
state="$KP/server.json"
echo "$*" >> "$KP/systemctl.log"
case "$1" in
  show)
    [ -f "$state" ] || { [ "$3" = ActiveState ] && echo inactive || echo; exit 0; }
    if [ "$3" = ActiveState ]; then echo active; else
      "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["invocation"])' "$state"; fi ;;
  restart)
    "$PY" - "$state" "$KP/vllm/current" <<'EOF'
import json, os, sys, uuid
release = os.path.basename(os.readlink(sys.argv[2]))
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as out:
    json.dump({"release": release, "invocation": uuid.uuid4().hex}, out)
os.replace(tmp, sys.argv[1])
EOF
    ;;
  *) ;;
esac
"""

# The kill: at the N-th task start (handlers counted), SIGKILL the process group of ansible-playbook, forks too.
KILLER = """
import os
import signal

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "killpoint"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.count = 0
        self.at = int(os.environ.get("KILL_AT", "0"))
        self.log = os.environ["KILL_LOG"]

    def _start(self, task):
        self.count += 1
        with open(self.log, "a") as out:
            out.write(f"{self.count}\\t{task.get_name()}\\n")
        if self.count == self.at:
            os.killpg(os.getpgid(os.getpid()), signal.SIGKILL)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._start(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._start(task)

    def v2_runner_on_ok(self, result):
        if result._result.get("changed"):
            with open(self.log, "a") as out:
                out.write(f"changed\\t{self.count}\\n")
"""


def _stand_ins(task: dict) -> dict:
    """A role import of the rollout block, as the real role file or as a stand-in of the same name."""
    name = task.get("name")
    if name == "Install and verify from the fleet's wheel":
        release = "{{ vllm_root }}/releases/" + B
        tasks = [
            {"name": "Make the release directory", "ansible.builtin.file": {"path": release, "state": "directory"}},
            {"name": "Install the wheel", "ansible.builtin.copy": {"content": "B\n", "dest": release + "/wheel"}},
            {  # written last, as vllm_build does: a directory without it is an unfinished build
                "name": "Write the manifest",
                "ansible.builtin.copy": {
                    "content": json.dumps({"schema": 1, "commit": "b" * 40}),
                    "dest": release + "/manifest.json",
                },
            },
            {
                "name": "Publish the install result",
                "ansible.builtin.set_fact": {"vllm_install_result": {"release": B, "release_name": B, "changed": True}},
            },
        ]
    elif name == "Preflight the drafter and template the config":
        tasks = [
            {
                "name": "Template the config",
                "ansible.builtin.copy": {"content": "model: b\n", "dest": "{{ vllm_config_dir }}/t.yaml"},
                "register": "kp_config",
                "notify": "vllm config changed",
            },
            {
                "name": "Publish the config result",
                "ansible.builtin.set_fact": {"dflash_config_result": {"changed": "{{ kp_config is changed }}"}},
            },
        ]
    elif name == "Run the service and wait until it is ready":
        tasks = [{"name": "Restart vLLM when something changed", "ansible.builtin.meta": "flush_handlers"}]
    elif name == "Gate on the acceptance length":
        (record,) = [t for t in yaml.safe_load(GATE_TASKS.read_text())[0]["block"] if t.get("name") == RECORD_GOOD]
        measure = (
            "import json, os, sys; kp = os.environ['KP']; run = json.load(open(kp + '/server.json'))['release']; "
            "os.makedirs(kp + '/gate-results', exist_ok=True); "
            "json.dump({'release': run, 'passed': True}, open(kp + '/gate-results/' + run + '.json', 'w')); "
            "print(run)"
        )
        tasks = [
            {
                "name": "Read which release is serving and which was last good",
                "vllm_ops.dflash.vllm_release": {"root": "{{ vllm_root }}", "action": "status"},
                "register": "dflash_gate_serving",
            },
            {  # what the stand-in server runs is what is measured
                "name": "Measure the acceptance",
                "ansible.builtin.command": {"argv": [sys.executable, "-c", measure]},
                "register": "kp_measured",
            },
            {
                "name": "Publish the gate result",
                "ansible.builtin.set_fact": {
                    "dflash_gate_result": {
                        "changed": False,
                        "mean_acceptance_length": 3.0,
                        "drafts": 40,
                        "summary": "measured {{ kp_measured.stdout }}",
                    }
                },
            },
            {
                **record,
                "module_defaults": {"group/vllm_ops.dflash.vllm_root": {"root": "{{ vllm_root }}"}},
                # Over the role's (its vars/main.yml, loaded with serving_check): the unit's path is fixed.
                "vars": {"vllm_kept_files": KEPT},
            },
        ]
    else:  # the real role file (activate, serving_check, serving_record)
        return task
    return {"name": name, "block": tasks}


def _rescue(task: dict) -> dict:
    """The rescue's rollback: back to the last good release (real vllm_release), then fail the host."""
    if task.get("name") != "Roll back this host":
        return task
    return {
        "name": task["name"],
        "block": [
            {
                "name": "Read the last good release",
                "vllm_ops.dflash.vllm_release_info": {"root": "{{ vllm_root }}"},
                "register": "kp_state",
            },
            {
                "name": "Go back to the last good release",
                "vllm_ops.dflash.vllm_release": {
                    "root": "{{ vllm_root }}",
                    "action": "rollback",
                    "release": "{{ kp_state.last_good }}",
                },
            },
            {"name": "Restart onto it", "ansible.builtin.command": "systemctl restart vllm-t.service"},
            {"name": "Fail the host", "ansible.builtin.fail": {"msg": "rolled back: {{ dflash_rollback_reason }}"}},
        ],
    }


def _rollout_play() -> dict:
    rollout = plays(PLAYBOOK.name)["Roll out vLLM with DFlash"]  # tasks/rollout.yml opened up
    play = dict(rollout, hosts="gpu_hosts")
    play["tasks"] = [
        dict(task, block=[_stand_ins(t) for t in task["block"]], rescue=[_rescue(t) for t in task["rescue"]])
        if "block" in task
        else task
        for task in rollout["tasks"]
        if "ansible.builtin.include_role" not in task  # monitoring: off
    ]
    play["handlers"] = [
        {
            "name": "Restart the stand-in server",
            "ansible.builtin.command": "systemctl restart vllm-t.service",
            "listen": ["vllm release changed", "vllm config changed"],
        }
    ]
    return play


class Host:
    """One local host in tmp: the deploy's files, the stand-ins, and how to run (and kill) the rollout."""

    def __init__(self, tmp: Path, hooks: bool = True) -> None:
        self.tmp, self.root, self.etc = tmp, tmp / "vllm", tmp / "etc"
        bin_dir = tmp / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "systemctl").write_text(SYSTEMCTL)
        (bin_dir / "systemctl").chmod(0o755)
        (tmp / "callbacks").mkdir()
        (tmp / "callbacks" / "killpoint.py").write_text(KILLER)
        collection = tmp / "ac" / "ansible_collections" / "vllm_ops"
        collection.mkdir(parents=True)
        (collection / "dflash").symlink_to(ROOT)  # this worktree's roles and modules
        hook = tmp / "hook.yml"
        hook.write_text(
            yaml.safe_dump(
                [
                    {
                        "name": "Drain or re-add the host",
                        "ansible.builtin.file": {
                            "path": str(tmp / "drained"),
                            "state": "{{ 'touch' if dflash_batch_phase == 'pre' else 'absent' }}",
                        },
                    }
                ]
            )
        )
        (tmp / "play.yml").write_text(yaml.safe_dump([_rollout_play()], sort_keys=False))
        etc = str(self.etc)
        host_vars = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "vllm_root": str(self.root),
            "vllm_config_dir": etc,
            "vllm_instance": "t",
            # Without them (the default) the host is never drained.
            "dflash_batch_pre_tasks": str(hook) if hooks else "",
            "dflash_batch_post_tasks": str(hook) if hooks else "",
            "dflash_gate_min_mean_acceptance_length": 2.0,
            "kp_etc": etc,
            # A deploy lock (where the playbook takes one) left by a killed controller holds until its lease
            # ends: 1 s, so the re-run breaks it (an operator waits for the lease, or removes the file).
            "dflash_deploy_lock_lease": 1,
        }
        (tmp / "hosts.yml").write_text(yaml.safe_dump({"gpu_hosts": {"hosts": {"gpu1": host_vars}}}))
        self.env = dict(
            os.environ,
            PATH=f"{bin_dir}:{os.environ['PATH']}",
            KP=str(tmp),
            PY=sys.executable,
            KILL_LOG=str(tmp / "tasks.log"),
            ANSIBLE_CALLBACK_PLUGINS=str(tmp / "callbacks"),
            ANSIBLE_CALLBACKS_ENABLED="killpoint",
            ANSIBLE_COLLECTIONS_PATH=str(tmp / "ac"),
            ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-local"),
            ANSIBLE_REMOTE_TEMP=str(tmp / "ansible-remote"),
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_RETRY_FILES_ENABLED="0",
        )

    def set_up_a(self) -> None:
        """A built, current, serving and good (its gate passed), the host in the balancer."""
        release = self.root / "releases" / A
        release.mkdir(parents=True)
        (release / "wheel").write_text("A\n")
        (release / "manifest.json").write_text(json.dumps({"schema": 1, "commit": "a" * 40}))
        (self.root / "current").symlink_to(f"releases/{A}")
        self.etc.mkdir()
        (self.etc / "t.yaml").write_text("model: a\n")
        (self.tmp / "gate-results").mkdir()
        (self.tmp / "gate-results" / f"{A}.json").write_text(json.dumps({"release": A, "passed": True}))
        state = {"schema": 1, "current": A, "previous": None, "releases": {A: {"commit": "a" * 40, "status": "good"}}}
        (self.root / "state.json").write_text(json.dumps(state))
        (self.tmp / "server.json").write_text(json.dumps({"release": A, "invocation": "first"}))
        serving = {"release": A, "invocation": "first", "inputs": "-"}
        (self.root / "serving-t.json").write_text(json.dumps(serving))
        self.a_files = self.files_of(A)

    def files_of(self, release: str) -> dict:
        base = self.root / "releases" / release
        return {str(p.relative_to(base)): hashlib.sha256(p.read_bytes()).hexdigest() for p in base.rglob("*")}

    def deploy(self, kill_at: int = 0) -> subprocess.CompletedProcess:
        argv = [str(BIN / "ansible-playbook"), "-i", str(self.tmp / "hosts.yml"), str(self.tmp / "play.yml")]
        (self.tmp / "tasks.log").unlink(missing_ok=True)
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            cwd=self.tmp,
            env=dict(self.env, KILL_AT=str(kill_at)),
            start_new_session=True,  # its own process group: the kill takes it and its forks, not pytest
            timeout=600,
        )

    def tasks_started(self) -> list:
        lines = (self.tmp / "tasks.log").read_text().splitlines()
        return [line.split("\t", 1)[1] for line in lines if not line.startswith("changed\t")]

    def changed_tasks(self) -> list:
        """The counts of the tasks that reported a change (1-based, as the kill counts)."""
        lines = (self.tmp / "tasks.log").read_text().splitlines()
        return sorted({int(line.split("\t")[1]) for line in lines if line.startswith("changed\t")})

    def serving(self) -> str:
        return json.loads((self.tmp / "server.json").read_text())["release"]

    def gated(self, release: str) -> bool:
        path = self.tmp / "gate-results" / f"{release}.json"
        return path.is_file() and json.loads(path.read_text()) == {"release": release, "passed": True}

    def good(self) -> list:
        releases = json.loads((self.root / "state.json").read_text())["releases"]
        return sorted(name for name, entry in releases.items() if entry.get("status") == "good")

    def check(self, when: str, serving_checked: bool = True) -> dict:
        """The invariants that hold at any moment; returns state.json's releases."""
        releases = json.loads((self.root / "state.json").read_text())["releases"]
        good = self.good()
        assert all(self.gated(name) for name in good), f"{when}: good without a passed gate: {good}"
        drained = (self.tmp / "drained").exists()
        serving = self.serving()
        if serving_checked and not drained:  # in the balancer: what it serves passed its gate and is good
            assert serving in good and self.gated(serving), f"{when}: the undrained host serves {serving}"
        assert self.files_of(A) == self.a_files, f"{when}: A's files changed"
        return releases


def whole_bump(tmp: Path, hooks: bool = True) -> tuple:
    """The bump A -> B without a kill: the names of the task starts, and the kill points.

    A kill before task N leaves what tasks 1..N-1 wrote: the same files as a kill before N-1 unless task N-1
    changed something. So N = 1 and every N after a task that reported a change (each distinct state a kill
    can leave), which keeps the run to minutes; KILL_EVERY=1 in the environment takes every N.
    """
    whole = Host(tmp, hooks=hooks)
    whole.set_up_a()
    proc = whole.deploy()
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    boundaries = whole.tasks_started()
    releases = whole.check("after the whole bump")
    assert releases[B]["status"] == "good" and whole.serving() == B
    assert os.readlink(whole.root / "current") == f"releases/{B}"
    assert not (whole.tmp / "drained").exists()
    assert len(boundaries) > 10, boundaries
    if os.environ.get("KILL_EVERY"):
        return boundaries, list(range(1, len(boundaries) + 1))
    return boundaries, sorted({1, *(k + 1 for k in whole.changed_tasks() if k < len(boundaries))})


@pytest.mark.slow
def test_the_rollout_killed_at_every_task_boundary_then_re_run(tmp_path):
    boundaries, points = whole_bump(tmp_path / "whole")
    findings = []
    for n in points:
        host = Host(tmp_path / f"kill-{n}")
        host.set_up_a()
        killed = host.deploy(kill_at=n)
        assert killed.returncode == -signal.SIGKILL, f"kill at {n} ({boundaries[n - 1]}): rc {killed.returncode}"
        assert len(host.tasks_started()) == n
        where = f"killed at {boundaries[n - 1]}"
        try:
            host.check(where)
            rerun = host.deploy()
            after = f"the re-run after a kill at {boundaries[n - 1]}"
            assert rerun.returncode == 0, f"{after}: rc {rerun.returncode}\n{rerun.stdout[-3000:]}"
            releases = host.check(after)
            assert releases[B]["status"] == "good", f"{after}: B is {releases[B]}"
            assert host.serving() == B, f"{after}: the server runs {host.serving()}"
            assert os.readlink(host.root / "current") == f"releases/{B}", after
            assert not (host.tmp / "drained").exists(), f"{after}: the host was left drained"
        except AssertionError as error:
            findings.append(str(error).splitlines()[0])
    assert not findings, "\n".join(findings)


@pytest.mark.slow
def test_without_a_drain_hook_a_kill_between_restart_and_gate_leaves_the_ungated_release_serving(tmp_path):
    """The window the drain hook closes: no hook (the default), the controller killed after the restart onto
    B and before the gate's record leaves B serving not good (its gate unfinished or unrecorded) until a
    re-run gates it or rolls it back. Nothing is ever marked good without its gate; outside that window A,
    good, serves."""
    boundaries, points = whole_bump(tmp_path / "whole", hooks=False)
    restart = boundaries.index("Restart the stand-in server") + 1  # 1-based, as the kill counts
    record = boundaries.index(RECORD_GOOD) + 1
    ungated = []
    for n in points:
        host = Host(tmp_path / f"kill-{n}", hooks=False)
        host.set_up_a()
        killed = host.deploy(kill_at=n)
        assert killed.returncode == -signal.SIGKILL, f"kill at {n} ({boundaries[n - 1]}): rc {killed.returncode}"
        host.check(f"killed at {boundaries[n - 1]}", serving_checked=False)
        if host.serving() not in host.good():
            assert host.serving() == B  # measured or not, not yet good
            ungated.append(n)
        else:
            assert host.serving() == (B if n > record else A), boundaries[n - 1]  # B once recorded good
    # Killed before task n: the restart (task `restart`) ran and the record (task `record`) did not.
    assert ungated == [n for n in points if restart < n <= record], [boundaries[n - 1] for n in ungated]
