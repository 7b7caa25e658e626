"""deploy_dflash.yml: the canary is a deterministic choice (issue 14 item 12)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from helpers.playbook import plays

PLAYBOOK = Path(__file__).resolve().parents[3] / "playbooks" / "deploy_dflash.yml"
PLAYS = plays(PLAYBOOK.name)  # the build and rollout plays' included task files opened up
INVENTORY = ["gpu1", "gpu2", "gpu3", "gpu4"]


def play_hosts(play: str, deploy: list, **extra: object) -> list:
    groups = {"gpu_hosts": INVENTORY, "dflash_deploy": deploy}
    templar = Templar(loader=DataLoader(), variables={"groups": groups, **extra})
    return list(templar.template(trust_as_template(PLAYS[play]["hosts"])))


@pytest.mark.parametrize("play", ["Build vLLM once for the fleet", "Roll out vLLM with DFlash"])
@pytest.mark.parametrize(
    ("deploy", "extra", "expected"),
    [
        (["gpu2", "gpu1"], {}, ["gpu1", "gpu2"]),  # group_by's order is the order hosts finished the look
        (["gpu4", "gpu3", "gpu1"], {}, ["gpu1", "gpu3", "gpu4"]),
        (["gpu3", "gpu2"], {}, ["gpu2", "gpu3"]),  # gpu1 unchanged: the first host to deploy leads
        (["gpu2", "gpu1", "gpu3"], {"dflash_canary": "gpu3"}, ["gpu3", "gpu1", "gpu2"]),
        (["gpu2", "gpu1"], {"dflash_canary": "gpu4"}, ["gpu1", "gpu2"]),  # a canary with nothing to deploy
        ([], {}, []),
    ],
)
def test_the_rollout_goes_in_inventory_order_canary_first(play, deploy, extra, expected):
    assert play_hosts(play, deploy, **extra) == expected


def rendered_serial(**extra: object) -> object:
    templar = Templar(loader=DataLoader(), variables=dict(extra))
    return templar.template(trust_as_template(PLAYS["Roll out vLLM with DFlash"]["serial"]))


def test_the_first_batch_is_one_host_then_a_quarter():
    # rendered, not compared as text: a rewording of the expression that keeps the batches still passes
    assert rendered_serial() == [1, "25%"]
    assert rendered_serial(dflash_serial=[2, "50%"]) == [2, "50%"]


# ---------------------------------------------------------------- the rescue's decision (issue 14 item 1)

ROLLBACK = Path(__file__).resolve().parents[3] / "roles" / "dflash_rollback" / "tasks" / "main.yml"


ROLLBACK_VARS = yaml.safe_load((ROLLBACK.parents[1] / "vars" / "main.yml").read_text())


def rescue_decision(
    current, last_good, fallback="", changed=False, config_differs=False, explicit="", reason="x", failed="", gate=False
):
    facts = {}
    variables = {
        "dflash_rollback_rescue": trust_as_template(ROLLBACK_VARS["dflash_rollback_rescue"]),
        "dflash_rollback_reason": reason,
        "dflash_rollback_failed_release": failed,
        "dflash_rollback_gate_failed": gate,
        "dflash_rollback_state": {"current": current, "last_good": last_good},
        "dflash_rollback_fallback": fallback,
        "dflash_rollback_needed": changed,
        # skipped (no rc) for an operator's rollback
        "dflash_rollback_config_diff": {"rc": 1 if config_differs else 0} if reason else {"skipped": True},
    }
    if explicit:
        variables["dflash_rollback_to"] = explicit
    (wrapper,) = yaml.safe_load(ROLLBACK.read_text())  # one block: the tags and module_defaults of the file
    for task in wrapper["block"]:
        if "ansible.builtin.set_fact" in task:
            templar = Templar(loader=DataLoader(), variables={**variables, **facts})
            for name, expression in task["ansible.builtin.set_fact"].items():
                facts[name] = templar.template(trust_as_template(expression.strip()))
    return facts["dflash_rollback_target"], bool(facts["dflash_rollback_required"])


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # a run died after activating B: current B, never gated; nothing changed in the re-run
        ({"current": "B", "last_good": "A", "fallback": "B"}, ("A", True)),
        # the same, B marked failed since
        ({"current": "B", "last_good": "A", "fallback": "B", "changed": True}, ("A", True)),
        # the preflight refused: current is the last good release, config untouched -> nothing to undo
        ({"current": "A", "last_good": "A", "fallback": "A"}, ("A", False)),
        # a config templated by a run that died, the release unchanged
        ({"current": "A", "last_good": "A", "fallback": "A", "config_differs": True}, ("A", True)),
        # no good release anywhere (gates disabled): never stop the server that serves
        ({"current": "A", "last_good": None, "fallback": "A"}, ("A", False)),
        # no good release on record (state.json moved aside), B served unfinished and its gate failed now:
        # B is no fallback (issue 28 case 4)
        ({"current": "B", "last_good": None, "fallback": "B", "failed": "B", "gate": True}, ("", True)),
        # the same B, but a refusal before its gate: nothing changed, B keeps serving
        ({"current": "B", "last_good": None, "fallback": "B", "failed": "B"}, ("B", False)),
        # a first deploy: nothing served before, this run activated B
        ({"current": "B", "last_good": None, "fallback": "", "changed": True}, ("", True)),
        ({"current": "B", "last_good": "A", "explicit": "C"}, ("C", True)),
        # playbooks/rollback.yml: vllm_release's rollback picks the previous release, even from a good current
        ({"current": "A", "last_good": "A", "fallback": "A", "reason": ""}, ("", True)),
        ({"current": "A", "last_good": "A", "explicit": "B", "reason": ""}, ("B", True)),
    ],
    ids=[
        "died-after-activation",
        "marked-failed",
        "refused",
        "config-of-a-dead-run",
        "no-gates",
        "no-good-release-gate-failed",
        "no-good-release-refused",
        "first",
        "explicit",
        "operator",
        "operator-named",
    ],
)
def test_the_rescue_goes_back_to_the_last_good_release(kwargs, expected):
    assert rescue_decision(**kwargs) == expected


# ---------------------------------------------------------------- the summary (issue 15 item 4)


def summary_lines(deploy: list, unchanged: list, hostvars: dict) -> list:
    task = PLAYS["Gate summary"]["tasks"][0]
    groups = {"gpu_hosts": INVENTORY, "dflash_deploy": deploy, "dflash_unchanged": unchanged}
    templar = Templar(loader=DataLoader(), variables={"groups": groups, "hostvars": hostvars})
    items = templar.template(trust_as_template(task["loop"]))
    lines = []
    for item in items:
        templar = Templar(loader=DataLoader(), variables={"groups": groups, "hostvars": hostvars, "item": item})
        lines.append(templar.template(trust_as_template(task["ansible.builtin.debug"]["msg"])))
    return lines


def test_the_summary_has_a_line_for_every_host_the_run_reached():
    hostvars = {
        "gpu1": {"vllm_install_drift": {"current": "r1", "current_status": "good"}},
        "gpu2": {"dflash_gate_result": {"summary": "release r2 commit c2: AL 3.10 ..., verdict PASS, report /r.md"}},
        "gpu3": {"dflash_gate_result": {"msg": "boom"}},
        "gpu4": {},
    }
    # gpu4 failed the look (in neither group): the run never reached it
    assert summary_lines(["gpu3", "gpu2"], ["gpu1"], hostvars) == [
        "gpu1: release r1 unchanged (good): nothing deployed, no new gate run",
        "gpu2: release r2 commit c2: AL 3.10 ..., verdict PASS, report /r.md",
        "gpu3: no gate verdict: boom",
    ]


# ---------------------------------------------------------------- the fleet's wheel: pulled, or copied (issue 17)

ROLLOUT_BLOCK = next(
    t for t in PLAYS["Roll out vLLM with DFlash"]["tasks"] if t["name"] == "Install, configure, serve and gate"
)
ROLLOUT_INSTALL = ROLLOUT_BLOCK["block"][0]
ROLLOUT_TASKS = {task["name"]: task for task in PLAYS["Roll out vLLM with DFlash"]["tasks"]}


def test_the_rollout_holds_the_deploy_lock_from_before_the_install_to_after_the_rescue():
    """Issue 28 case 3: taken outside the block (a lock another deploy holds fails the host with no rollback of
    that deploy's work), released in the block's always (after the gate's record, or after the rescue)."""
    names = list(ROLLOUT_TASKS)
    assert names.index("Take this host's deploy lock") < names.index("Install, configure, serve and gate")
    take = ROLLOUT_TASKS["Take this host's deploy lock"]["vllm_ops.dflash.vllm_deploy_lock"]
    (release,) = ROLLOUT_TASKS["Install, configure, serve and gate"]["always"]
    release = release["vllm_ops.dflash.vllm_deploy_lock"]
    assert release["state"] == "absent" and release["holder"] == take["holder"]
    assert (release["root"], release["instance"]) == (take["root"], take["instance"])


PULLED = {"dest": "/opt/vllm/wheels/fleet/vllm-1.whl", "changed": True}
COPIED = {"dest": "/opt/vllm/wheels/fleet/vllm-1.whl", "changed": True, "checksum": "x"}
SKIPPED = {"skipped": True, "changed": False}


@pytest.mark.parametrize(
    ("pulled", "copied", "expected"),
    [
        (PULLED, SKIPPED, PULLED["dest"]),  # peer
        (SKIPPED, COPIED, COPIED["dest"]),  # controller
        ({"failed": True, "msg": "refused"}, COPIED, COPIED["dest"]),  # the pull failed, the controller copied
        (None, COPIED, COPIED["dest"]),  # the server never started: no pull at all
        (None, None, ""),  # check mode of a release to build: nothing staged
    ],
)
def test_the_rollout_installs_the_wheel_that_reached_the_host(pulled, copied, expected):
    variables = {}
    if pulled is not None:
        variables["dflash_fleet_wheel_pulled"] = pulled
    if copied is not None:
        variables["dflash_fleet_wheel_copied"] = copied
    templar = Templar(loader=DataLoader(), variables=variables)
    assert templar.template(trust_as_template(ROLLOUT_INSTALL["vars"]["vllm_wheel"])) == expected


BUILD_TASKS = {task["name"]: task for task in PLAYS["Build vLLM once for the fleet"]["tasks"]}
PULL_BLOCK = BUILD_TASKS["Pull the wheel from the build host"]


def test_the_peer_server_is_stopped_whatever_happens_and_the_pull_is_checked():
    (stop,) = PULL_BLOCK["always"]
    assert stop["vllm_ops.dflash.vllm_wheel_serve"]["state"] == "stopped"
    download = next(task for task in PULL_BLOCK["block"] if "ansible.builtin.get_url" in task)
    assert download["ansible.builtin.get_url"]["checksum"] == "sha256:{{ dflash_fleet_build.wheel_sha256 }}"


@pytest.mark.parametrize(
    ("via", "failed_hosts", "host", "fetch", "copy"),
    [
        ("peer", [], "gpu1", False, False),
        ("peer", ["gpu2"], "gpu1", True, False),  # the fetch runs once (on the first host) for gpu2's copy
        ("peer", ["gpu2"], "gpu2", True, True),
        ("controller", [], "gpu1", True, True),
    ],
)
def test_the_controller_path_runs_where_it_is_chosen_or_the_pull_failed(via, failed_hosts, host, fetch, copy):
    hosts = ["gpu1", "gpu2"]
    hostvars = {name: ({"dflash_fleet_wheel_pull_failed": True} if name in failed_hosts else {}) for name in hosts}
    variables = {
        "dflash_fleet_wheel_via": via,
        "ansible_check_mode": False,
        "dflash_fleet_build": {"changed": True},
        "ansible_play_hosts": hosts,
        "hostvars": hostvars,
        **hostvars[host],
    }
    templar = Templar(loader=DataLoader(), variables=variables)

    def runs(task: str) -> bool:
        return all(templar.evaluate_conditional(trust_as_template(c)) for c in BUILD_TASKS[task]["when"])

    assert runs("Fetch the wheel to the controller") is fetch
    assert runs("Copy the fleet's wheel to this host") is copy


# ---------------------------------------------------------------- the controller path is checked (issue 28 case 2)


@pytest.mark.slow
@pytest.mark.parametrize("tampered", [False, True], ids=["intact", "tampered"])
def test_the_wheel_copied_through_the_controller_is_checked_against_the_build(tmp_path, tampered):
    import hashlib
    import json
    import os
    import subprocess
    import sys

    wheel = tmp_path / "vllm-1.0-py3-none-any.whl"
    wheel.write_bytes(b"the build's wheel")
    built_sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if tampered:  # altered after the build: the peer pull refused it, the controller path copied it
        wheel.write_bytes(b"the build's wheel, with a .pth that runs on every python start")
    names = ["Read the sha256 of the wheel copied to this host", "Check the copied wheel against the build's sha256"]
    tasks = [BUILD_TASKS[name] for name in names]
    play = {
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars": {
            "dflash_fleet_wheel_copied": {"dest": str(wheel), "changed": True},
            "dflash_fleet_build": {"wheel": "/opt/vllm/wheels/r/" + wheel.name, "wheel_sha256": built_sha},
            "dflash_build_host": "gpu1",
            "dflash_fleet_wheel_dir": str(tmp_path / "cache"),
        },
        "tasks": tasks,
    }
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    env = dict(
        os.environ,
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_NOCOLOR="1",
    )
    ansible_playbook = str(Path(sys.executable).parent / "ansible-playbook")
    proc = subprocess.run(
        [ansible_playbook, "-i", "localhost,", "play.yml"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
        cwd=tmp_path,
    )
    if not tampered:
        assert proc.returncode == 0, proc.stdout[-3000:]
        return
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert f"not the build's {built_sha}" in proc.stdout and "Nothing was installed" in proc.stdout, json.dumps(
        proc.stdout[-3000:]
    )


# ---------------------------------------------------------------- a no-op run parses only the look (issue 30 item 2)

WRITTEN = {play["name"]: play for play in yaml.safe_load(PLAYBOOK.read_text())}


@pytest.mark.parametrize(
    ("play", "task_file"),
    [("Build vLLM once for the fleet", "tasks/fleet_build.yml"), ("Roll out vLLM with DFlash", "tasks/rollout.yml")],
)
def test_the_build_and_the_rollout_are_included_under_any_tags(play, task_file):
    # Included, so parsed only when a host reaches the play; tagged always, so the include runs under any --tags
    # and its tasks are filtered by their own tags, as they were when written in the play.
    (include,) = WRITTEN[play]["tasks"]
    assert include["ansible.builtin.include_tasks"] == {"file": task_file}
    assert include["tags"] == ["always"]
    assert "apply" not in include["ansible.builtin.include_tasks"]  # no tags handed on to the included tasks


@functools.lru_cache(maxsize=1)
def listed_tasks() -> str:
    """`ansible-playbook --list-tasks` of the deploy playbook: what a run parses before the first play."""
    listed = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(PLAYBOOK), "--list-tasks"],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(PLAYBOOK.parents[1] / ".cache" / "ac")),
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    return listed.stdout


def test_a_run_parses_the_rollout_s_roles_only_when_a_host_reaches_them():
    listed = listed_tasks()
    assert "vllm_ops.dflash.vllm_install : Would a deploy change this host" in listed  # the look: parsed
    assert "Install, configure, serve and gate each host" in listed  # the include itself
    # What the included files hold, and the roles only they import: not parsed.
    for name in (
        "Take this host's deploy lock",
        "Check the hosts' prerequisites",
        "dflash_rollback :",
        "prerequisites :",
    ):
        assert name not in listed, name


def test_the_look_has_no_task_but_the_playbook_s_checks_the_drift_and_the_queue():
    # Every task of the look is a round of the strategy in every no-op run, most of them one worker per host:
    # the roles' checks are vllm_drift's refusals and their look entry points have no task (bench/README.md).
    look = listed_tasks().split("  play #2")[0].split("    tasks:\n", 1)[1]
    tasks = {line.strip().split("\t")[0] for line in look.splitlines() if line.strip()}
    assert {task for task in tasks if "Validating arguments against arg spec 'main'" not in task} == {
        "Check the types and choices of the playbook's variables",
        "Check the batches",
        "vllm_ops.dflash.vllm_install : Would a deploy change this host",
        "Queue the hosts a deploy would change, and say why",
    }
    # the shared role's validation only (the imports' own are off: rolespec_validate false)
    assert {task.split(" : ")[0] for task in tasks if "Validating arguments" in task} == {"vllm_ops.dflash.vllm"}
