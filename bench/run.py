# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_ops.dflash benchmarks: each figure is a RATIO measured in one run (see bench/README.md).

Starts N systemd test hosts (podman, the image of tests/testhost/, fixed addresses on podman's default
network), prepares them like the molecule scenarios (fixture engine repo, wheelhouse, drafter config),
runs deploy_dflash.yml and the modules against them over SSH with pipelining (the connection a real
GPU host gets), prints the ratios, writes them to bench/results/<UTC>/ and removes its containers.

    .venv/bin/python bench/run.py [--hosts 3] [--compile-seconds 20] [--keep]
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COLLECTIONS = ROOT / ".cache" / "ac"
WHEELHOUSE = ROOT / ".cache" / "wheelhouse"
RESULTS = ROOT / "bench" / "results"
IMAGE = os.environ.get("TESTHOST_IMAGE", "localhost/vllm-ops-testhost:bookworm")
GATE_TASK = "Measure the acceptance under the pinned workload, against the last good release"
# The gate's own cost: every task of its entry point and of the workload check the deploy runs before any
# change (names read from the role, so a task added there is counted), not the service's restart and ready
# check that come before it.
GATE_TASK_FILES = ("main.yml", "workload.yml")
BUILD_RESULT_TASK = "Collect the build result"
SLOW_CC_PATH = "/usr/local/bin/bench-slow-cc"
# Fixed addresses on podman's default network (10.88.0.0/16), apart from the molecule scenarios' 10.88.31.x.
ADDRESS_PREFIX = "10.88.33."
FIRST_ADDRESS = 11
BENCH_LABEL = "vllm-ops-bench"
SSH_KEY = Path(os.environ.get("TESTHOST_KEY_DIR", "/var/tmp/vllm-ops-testhost")) / "id_ed25519"
SSH_ARGS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
CONNECTION = "ssh with pipelining"
# Bench equipment: gcc that takes BENCH_COMPILE_SECONDS per translation unit (linking is not slowed), so
# that compiling the fixture engine's three C extensions costs what a real build's kernels cost: time.
# Set through vllm_build_env (CC), like MAX_JOBS or TORCH_CUDA_ARCH_LIST would be.
SLOW_CC = """#!/bin/sh
case " $* " in *" -c "*) sleep "${BENCH_COMPILE_SECONDS:-30}" ;; esac
exec gcc "$@"
"""
# Actions that never reach a host: they cost the controller milliseconds.
CONTROLLER_ACTIONS = frozenset(
    [
        "set_fact",
        "debug",
        "assert",
        "fail",
        "meta",
        "include_tasks",
        "include_role",
        "import_tasks",
        "import_role",
        "include_vars",
        "add_host",
        "group_by",
        "pause",
        "set_stats",
        "validate_argument_spec",
    ]
)
LOCALHOST = ("localhost", "127.0.0.1")
READ_MANIFESTS = """
import glob, json, sys
found = []
for path in sorted(glob.glob(sys.argv[1] + "/releases/*/manifest.json")):
    with open(path) as handle:
        found.append(json.load(handle))
print(json.dumps(found))
"""


def log(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _run(argv: Sequence[str], env: Optional[Dict[str, str]] = None, timeout: float = 900) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if proc.returncode != 0:
        output = f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{output}")
    return proc.stdout


def _parse_time(stamp: str) -> float:
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def _union_seconds(intervals: List[Tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def _interval(task: Dict[str, Any]) -> Tuple[float, float]:
    """A task's [first start, last end] over its hosts, as the JSON callback records it."""
    duration = task["task"].get("duration") or {}
    if not (duration.get("start") and duration.get("end")):
        return (0.0, 0.0)
    return _parse_time(duration["start"]), _parse_time(duration["end"])


def _remote_steps(task: Dict[str, Any]) -> int:
    """Module runs on a host that one task costs in sequence: 0 for controller-only actions, skips and
    localhost delegation, one per loop item otherwise; hosts of a batch run in parallel (the maximum).
    (Counted by action, not by duration: over SSH with pipelining a remote step can take 0.2 s.)"""
    steps = 0
    for result in task["hosts"].values():
        delegated = (result.get("_ansible_delegated_vars") or {}).get("ansible_delegated_host")
        local = result.get("action", "").rsplit(".", 1)[-1] in CONTROLLER_ACTIONS or delegated in LOCALHOST
        if local or result.get("skipped"):
            continue
        items = result.get("results")
        steps = max(steps, sum(not item.get("skipped") for item in items) if isinstance(items, list) else 1)
    return steps


def gate_task_names(tasks_dir: Path = ROOT / "roles" / "dflash_gate" / "tasks") -> List[str]:
    """Names of the dflash_gate tasks that make its cost (GATE_TASK_FILES; block members too)."""
    names: List[str] = []
    pending = [task for name in GATE_TASK_FILES for task in yaml.safe_load((tasks_dir / name).read_text())]
    while pending:
        task = pending.pop(0)
        names.append(task["name"])
        pending[:0] = task.get("block", []) + task.get("rescue", []) + task.get("always", [])
    return names


def _span(task: Dict[str, Any]) -> float:
    start, end = _interval(task)
    return end - start


class PlaybookRun:
    """One ansible-playbook run with the JSON callback: wall time, per-task intervals and results."""

    def __init__(self, label: str, wall: float, report: Dict[str, Any]) -> None:
        self.label = label
        self.wall = wall
        self.report = report

    def tasks(self, name: str) -> List[Dict[str, Any]]:
        """Every task named `name` (a role's tasks are named `<role> : <name>`), one entry per serial batch."""
        return [
            task
            for play in self.report["plays"]
            for task in play["tasks"]
            if task["task"]["name"] == name or task["task"]["name"].endswith(" : " + name)
        ]

    def task_seconds(self, name: str) -> float:
        return _union_seconds([_interval(task) for task in self.tasks(name)])

    def role_seconds(self, role: str, names: Sequence[str]) -> float:
        """Union of the intervals of `role`'s tasks named `names` (`<collection>.<role> : <name>`), all batches."""
        return _union_seconds(
            [
                _interval(task)
                for play in self.report["plays"]
                for task in play["tasks"]
                if " : " in task["task"]["name"]
                and task["task"]["name"].split(" : ", 1)[0].endswith("." + role)
                and task["task"]["name"].split(" : ", 1)[1] in names
            ]
        )

    def results(self, name: str) -> List[Dict[str, Any]]:
        return [result for task in self.tasks(name) for result in task["hosts"].values()]

    def changed(self) -> int:
        return sum(stats.get("changed", 0) for stats in self.report["stats"].values())

    def steps(self) -> Tuple[int, float]:
        """Remote steps the run made in sequence (see _remote_steps), and the mean seconds of one."""
        counted = [(_remote_steps(task), _span(task)) for play in self.report["plays"] for task in play["tasks"]]
        steps = sum(count for count, _span_seconds in counted)
        seconds = sum(span for count, span in counted if count)
        return steps, (seconds / steps if steps else 0.0)

    def breakdown(self, top: int = 8) -> Dict[str, Any]:
        """Tasks that ran per host (`ok` counts changed ones too), and the slowest tasks over all batches."""
        seconds: Dict[str, float] = {}
        for play in self.report["plays"]:
            for task in play["tasks"]:
                name = task["task"]["name"]
                seconds[name] = seconds.get(name, 0.0) + _span(task)
        slowest = sorted(seconds.items(), key=lambda item: item[1], reverse=True)[:top]
        return {
            "tasks_per_host": {host: stats.get("ok", 0) for host, stats in self.report["stats"].items()},
            "slowest_tasks": {name: round(sec, 1) for name, sec in slowest},
        }


class Bench:
    def __init__(
        self,
        hosts: int,
        compile_seconds: int,
        keep: bool,
        work: Optional[Path] = None,
        build_env: Optional[Dict[str, str]] = None,
    ) -> None:
        self.names = [f"vllm-bench-{os.getpid()}-{i}" for i in range(1, hosts + 1)]
        self.addresses = dict(zip(self.names, host_addresses(hosts)))
        self.compile_seconds = compile_seconds
        self.keep = keep
        self.build_env = build_env or {}  # added to the inventory's vllm_build_env (bench/fleet.py: the pad)
        self.stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.work = work or RESULTS / self.stamp  # playbook outputs (JSON callback) are kept with the figures
        self.work.mkdir(parents=True, exist_ok=True)
        self.inventory = self.work / "inventory.yml"
        self.env = dict(
            os.environ,
            ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
            ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
            ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
            ANSIBLE_FORCE_COLOR="0",
            ANSIBLE_HOST_KEY_CHECKING="False",
            ANSIBLE_PIPELINING="True",  # = ansible.cfg [connection] pipelining, as in the molecule scenarios
            MOLECULE_PROJECT_DIRECTORY=str(ROOT),
        )
        self.removed = False

    # -- hosts -----------------------------------------------------------------------------------
    def check_prerequisites(self) -> None:
        problems = []
        if not shutil.which("podman"):
            problems.append("podman is missing: run `make testhost`")
        elif subprocess.run(["podman", "image", "exists", IMAGE], check=False).returncode != 0:
            problems.append(f"the test host image {IMAGE} is missing: run `make testhost`")
        if not SSH_KEY.exists():
            problems.append(f"the test hosts' SSH key {SSH_KEY} is missing: run `make testhost`")
        if not (WHEELHOUSE / ".done").exists():
            problems.append(f"{WHEELHOUSE} is missing: run `make wheelhouse`")
        if problems:
            raise SystemExit("bench: " + "; ".join(problems))
        link = COLLECTIONS / "ansible_collections" / "vllm_ops" / "dflash"
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(ROOT, link)

    def remove_stale_hosts(self) -> None:
        """Containers of an earlier bench run that died without cleanup (SIGKILL) would hold the fixed
        addresses: remove those, recognised by the bench's label; anything else on them is an error."""
        listing = _run(["podman", "ps", "-a", "--filter", f"label={BENCH_LABEL}", "--format", "{{.Names}}"])
        for stale in listing.split():
            log(f"removing {stale}, left over by an earlier bench run")
            subprocess.run(["podman", "rm", "-f", "-t", "2", stale], capture_output=True, check=False)
        ids = _run(["podman", "ps", "-q"]).split()
        if ids:
            inspect = json.loads(_run(["podman", "inspect", *ids]))
            wanted = set(self.addresses.values())
            for container in inspect:
                for network in (container.get("NetworkSettings") or {}).get("Networks", {}).values():
                    if network.get("IPAddress") in wanted:
                        raise SystemExit(
                            f"bench: {container['Name']} holds {network['IPAddress']}, an address the bench "
                            f"needs ({ADDRESS_PREFIX}{FIRST_ADDRESS}..): stop it first"
                        )

    def start_hosts(self) -> None:
        self.remove_stale_hosts()
        for name in self.names:
            argv = ["podman", "run", "-d", "--name", name, "--hostname", name, "--label", BENCH_LABEL]
            # CAP_SYS_ADMIN: systemd sets up the unit's sandbox (ProtectSystem, PrivateTmp), as on a GPU host
            _run([*argv, "--ip", self.addresses[name], "--systemd=always", "--cap-add", "SYS_ADMIN", IMAGE])
        for name in self.names:
            booted = time.monotonic() + 30
            while time.monotonic() < booted:
                argv = ["podman", "exec", name, "systemctl", "is-system-running"]
                state = subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()
                if state in ("running", "degraded"):
                    break
                time.sleep(0.5)
            with tempfile.NamedTemporaryFile("w", delete=False) as handle:
                handle.write(SLOW_CC)
            _run(["podman", "cp", handle.name, f"{name}:{SLOW_CC_PATH}"])
            os.unlink(handle.name)
            self.sh(name, f"chmod 755 {SLOW_CC_PATH}")
        for name in self.names:
            self.wait_for_ssh(name)

    def wait_for_ssh(self, name: str, timeout: float = 60) -> None:
        argv = ["ssh", *SSH_ARGS.split(), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-i", str(SSH_KEY)]
        argv += [f"root@{self.addresses[name]}", "true"]
        deadline = time.monotonic() + timeout
        while True:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: no SSH at {self.addresses[name]} after {timeout:.0f} s: {proc.stderr}")
            time.sleep(1)

    def prepare_hosts(self) -> None:
        """What extensions/molecule/shared/prepare.yml gives a test host, with `podman cp` (one tar
        stream per tree: faster than Ansible's copy, which goes file by file; not measured)."""
        copies = [
            (ROOT / "tests" / "fixtures" / "engine", "/srv/fixture/engine"),
            (ROOT / "tests" / "helpers" / "engine_repo.py", "/srv/fixture/engine_repo.py"),
            (WHEELHOUSE, "/srv/wheelhouse"),
            (ROOT / "extensions" / "molecule" / "shared" / "files" / "tiny-dflash", "/srv/models/tiny-dflash"),
        ]
        for name in self.names:
            self.sh(name, "mkdir -p /srv/fixture /srv/models")
            for source, dest in copies:
                _run(["podman", "cp", str(source), f"{name}:{dest}"])
            self.sh(name, "cd /srv/fixture && python3 engine_repo.py --source engine --bare /srv/vllm-engine.git")

    def cleanup(self) -> None:
        """Removes every container of this run by name (names carry the bench's pid), also one whose
        `podman run` failed half-way; idempotent (atexit, and again after a signal)."""
        if self.removed:
            return
        if self.keep:
            hosts = " ".join(f"{name}={self.addresses[name]}" for name in self.names)
            log(f"--keep: containers {hosts} left running; inventory {self.inventory}")
            return
        subprocess.run(["podman", "rm", "-f", "-i", "-t", "2", *self.names], capture_output=True, check=False)
        self.removed = True

    def sh(self, host: str, command: str) -> str:
        return _run(["podman", "exec", host, "sh", "-c", command])

    def write_inventory(self) -> None:
        group_vars = {
            # The molecule scenarios' connection (extensions/molecule/default/molecule.yml).
            "ansible_connection": "ssh",
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(SSH_KEY),
            "ansible_ssh_common_args": SSH_ARGS,
            "ansible_python_interpreter": "/usr/bin/python3",
            "vllm_repo": "/srv/vllm-engine.git",
            "vllm_ref": "main",
            "vllm_pip_args": ["--no-index", "--find-links", "/srv/wheelhouse"],
            # The test hosts reach no index: uv is not provisioned there (as in molecule.yml), pip builds.
            "vllm_uv_provision": False,
            # No GPU on the bench hosts: no driver to check.
            "vllm_prerequisites_cuda": "",
            "vllm_prerequisites_min_free_gb": 1,
            "vllm_build_timeout": 600,
            "vllm_build_poll": 2,
            "vllm_build_env": {
                "CC": SLOW_CC_PATH,
                "BENCH_COMPILE_SECONDS": str(self.compile_seconds),
                **self.build_env,
            },
            "vllm_model": "fixture/tiny-qwen3",
            "vllm_served_model_name": "tiny",
            "vllm_api_key": "fixture-secret-key-do-not-print",
            "vllm_speculative_config": {
                "method": "dflash",
                "model": "/srv/models/tiny-dflash",
                "num_speculative_tokens": 7,
                "rejection_sample_method": "synthetic",
                "synthetic_acceptance_length": 4.0,
            },
            "dflash_config_drafter_config": "/srv/models/tiny-dflash/config.json",
            "vllm_ready_timeout": 60,
            "dflash_gate_requests": 12,
            "dflash_gate_max_tokens": 64,
            "dflash_gate_min_drafts": 20,
            # As in molecule.yml: tokens/s of the fixture on 2 shared cores swing by a third between two runs, so
            # the throughput *rule* would fail bumps at random; tokens/s is still measured (figure 4 prices it).
            "dflash_gate_disabled_rules": ["throughput"],
            "dflash_controller_wheel_dir": str(self.work / "wheels"),
        }
        hosts = {name: {"ansible_host": self.addresses[name]} for name in self.names}
        inventory = {"gpu_hosts": {"hosts": hosts, "vars": group_vars}}
        self.inventory.write_text(json.dumps(inventory, indent=2))

    # -- measurements ------------------------------------------------------------------------------
    def playbook(self, label: str, playbook: str, *args: str) -> PlaybookRun:
        argv = [str(BIN / "ansible-playbook"), "-i", str(self.inventory), playbook, *args]
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=900, check=False)
        wall = time.monotonic() - started
        (self.work / f"{label}.json").write_text(proc.stdout)
        if proc.returncode != 0:
            output = f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
            raise RuntimeError(f"{label}: ansible-playbook failed ({proc.returncode}):\n{output}")
        log(f"{label}: {wall:.1f} s")
        return PlaybookRun(label, wall, json.loads(proc.stdout))

    def module(self, label: str, host: str, module: str, args: Dict[str, Any]) -> Dict[str, Any]:
        argv = [str(BIN / "ansible"), "-i", str(self.inventory), host, "-m", module, "-a", json.dumps(args)]
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=900, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{label}: {module} failed:\n{proc.stdout[-6000:]}{proc.stderr[-3000:]}")
        report = json.loads(proc.stdout)
        return report["plays"][0]["tasks"][0]["hosts"][host]

    def manifests(self, host: str, root: str = "/opt/vllm") -> List[Dict[str, Any]]:
        return json.loads(_run(["podman", "exec", host, "python3", "-c", READ_MANIFESTS, root]))

    def clock(self) -> int:
        return int(self.sh(self.names[0], "date +%s").strip())

    def restarts_since(self, since: int) -> int:
        command = (
            f"journalctl -u vllm-default.service --since @{since} -o cat --no-pager"
            " | grep -c '^Started vllm-default.service' || true"
        )
        return sum(int(self.sh(host, command).strip() or 0) for host in self.names)

    def builds(self) -> Tuple[Dict[str, int], Dict[str, int]]:
        """Release name -> hosts that compiled it (source=build, not the fleet's wheel), and hosts that have it.

        A host that named the fleet's wheel differently would show up as a release nobody built."""
        built: Dict[str, int] = {}
        holders: Dict[str, int] = {}
        for host in self.names:
            for manifest in self.manifests(host):
                built[manifest["name"]] = built.get(manifest["name"], 0) + (manifest["source"] == "build")
                holders[manifest["name"]] = holders.get(manifest["name"], 0) + 1
        return built, holders


def host_addresses(count: int) -> List[str]:
    if not 1 <= count <= 254 - FIRST_ADDRESS:
        raise SystemExit(f"bench: --hosts must be 1..{254 - FIRST_ADDRESS}")
    return [f"{ADDRESS_PREFIX}{FIRST_ADDRESS + index}" for index in range(count)]


# Figure 1's rounds: the no-op and the gather_facts play alternated, each ratio of medians. One run of each
# swings by 0.1-0.2 s on this 2-core machine (bench/README.md), as much as a change to the look moves it.
NOOP_ROUNDS = 3


def no_op(bench: Bench, label: str, facts_play: str) -> Tuple[PlaybookRun, Dict[str, Any]]:
    """A deploy where nothing changed, side by side with the gather_facts play: figure 1 (the median no-op run)."""
    since, builds_before = bench.clock(), bench.builds()[0]
    gathers: List[PlaybookRun] = []
    runs: List[PlaybookRun] = []
    for index in range(NOOP_ROUNDS):
        gathers.append(bench.playbook(f"{label}-gather-facts-{index + 1}", facts_play))
        runs.append(bench.playbook(f"{label}-{index + 1}", "vllm_ops.dflash.deploy_dflash"))
    gather_wall = statistics.median(run.wall for run in gathers)
    run = sorted(runs, key=lambda item: item.wall)[len(runs) // 2]
    steps, per_step = run.steps()
    return run, {
        "ratio": round(run.wall / gather_wall, 2),
        "sequential_remote_steps": steps,
        "seconds_per_remote_step": round(per_step, 2),
        "goal": "<= 2.0",
        "deploy_seconds": round(run.wall, 1),
        "gather_facts_seconds": round(gather_wall, 1),
        "deploy_runs": [round(item.wall, 2) for item in runs],
        "gather_facts_runs": [round(item.wall, 2) for item in gathers],
        "connection": CONNECTION,
        "builds": sum(bench.builds()[0].values()) - sum(builds_before.values()),
        "restarts": bench.restarts_since(since),
        "changed_tasks": sum(item.changed() for item in runs),
    }


def measure(bench: Bench) -> Dict[str, Any]:
    deploy = "vllm_ops.dflash.deploy_dflash"
    figures: Dict[str, Any] = {}

    first = bench.playbook("deploy-1-clean", deploy)
    facts_play = bench.work / "gather_facts.yml"
    facts_play.write_text("- name: Facts only\n  hosts: gpu_hosts\n  gather_facts: true\n  tasks: []\n")

    noop, figures["noop"] = no_op(bench, "deploy-2-noop", str(facts_play))

    for host in bench.names:  # one more commit on the deployed branch (same SHA everywhere: fixed dates)
        bench.sh(host, "python3 /srv/fixture/engine_repo.py bump /srv/vllm-engine.git main -m 'bench bump' >/dev/null")
    since = bench.clock()
    bump = bench.playbook("deploy-3-bump-warm", deploy)
    warm = next(r for r in bump.results(BUILD_RESULT_TASK) if r.get("built"))
    clean = bench.module(
        "bump-from-clean",
        bench.names[0],
        "vllm_ops.dflash.vllm_build",
        {
            "repo": "/srv/vllm-engine.git",
            "ref": "main",
            "root": "/opt/vllm-clean",
            "pip_args": ["--no-index", "--find-links", "/srv/wheelhouse"],
            "build_env": {"CC": SLOW_CC_PATH, "BENCH_COMPILE_SECONDS": str(bench.compile_seconds)},
            "build_timeout": 600,
            "run_id": "bench-clean",
        },
    )
    if warm["commit"] != clean["commit"] or not clean.get("built"):
        raise RuntimeError(f"the clean build is not the same bump: {warm['commit']} vs {clean.get('commit')}")
    figures["bump"] = {
        "ratio": round(warm["duration"] / clean["duration"], 2),
        "goal": "<= 0.2",
        "warm_build_seconds": warm["duration"],
        "clean_build_seconds": clean["duration"],
        "warm_stages": warm["stage_seconds"],
        "clean_stages": clean["stage_seconds"],
        "warm_precompiled_reason": warm["precompiled_reason"],
        "clean_precompiled_reason": clean["precompiled_reason"],
        "compile_seconds_per_unit": bench.compile_seconds,
        "deploy_seconds": round(bump.wall, 1),
        "restarts": bench.restarts_since(since),
    }

    # After a python-only bump the other hosts hold the fleet's precompiled wheel: still one look each.
    figures["noop_after_bump"] = no_op(bench, "deploy-4-noop-after-bump", str(facts_play))[1]

    builds, holders = bench.builds()
    figures["builds_per_input"] = {
        "ratio": round(sum(builds.values()) / len(builds), 2),
        "goal": "== 1 (each distinct build input built once)",
        "hosts": len(bench.names),
        "builds_per_release": builds,
        "hosts_per_release": holders,
    }
    figures["breakdown"] = {run.label: run.breakdown() for run in (first, noop, bump)}
    names = gate_task_names()
    figures["gate"] = {
        label: {
            "ratio": round(run.role_seconds("dflash_gate", names) / run.wall, 3),
            "gate_seconds": round(run.role_seconds("dflash_gate", names), 1),
            "measure_seconds": round(run.task_seconds(GATE_TASK), 1),
            "deploy_seconds": round(run.wall, 1),
        }
        for label, run in (("first", first), ("noop", noop), ("bump", bump))
    }
    figures["gate"]["goal"] = "<= 0.10 (first and bump)"
    figures["gate"]["measures"] = gate_measures(bump)
    return figures


def gate_measures(run: PlaybookRun) -> Dict[str, Any]:
    """What the gate measured in `run` on each host: the new measures must all be there, and the comparison
    with the last good release must have run (a bump has one), or the figure does not price them."""
    measured: Dict[str, Any] = {}
    done = [(host, r) for task in run.tasks(GATE_TASK) for host, r in task["hosts"].items() if not r.get("skipped")]
    for host, result in done:
        report = result.get("report") or {}
        checks = (report.get("relative") or {}).get("checks") or []
        measured[host] = {
            "workload_sha256": ((report.get("workload") or {}).get("sha256") or "")[:12],
            "positions": len(result.get("per_position_acceptance") or []),
            "tokens_per_second": result.get("tokens_per_second"),
            "fingerprints": len(report.get("fingerprints") or {}),
            "baseline_release": (report.get("relative") or {}).get("baseline_release"),
            "relative_rules": {check["rule"]: check["status"] for check in checks},
        }
    missing = [h for h, m in measured.items() if not (m["positions"] and m["fingerprints"] and m["baseline_release"])]
    if not measured or missing:
        raise RuntimeError(f"the gate of {run.label} lacks a new measure or the comparison: {measured}")
    return measured


def machine() -> str:
    mem = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f", {int(line.split()[1]) / 1024**2:.0f} GiB"
    return f"{platform.machine()}, {os.cpu_count()} cores{mem}, {platform.platform()}"


def _measures_line(measures: Dict[str, Any]) -> str:
    first = next(iter(measures.values()))
    rules = ", ".join(f"{rule} {status}" for rule, status in sorted(first["relative_rules"].items()))
    return (
        f"{len(measures)} hosts; workload {first['workload_sha256']}, {first['positions']} positions, "
        f"{first['tokens_per_second']} tokens/s, {first['fingerprints']} greedy fingerprints, vs last good "
        f"{first['baseline_release']} ({rules})"
    )


def report(figures: Dict[str, Any], seconds: float) -> str:
    noop, bump, builds, gate = figures["noop"], figures["bump"], figures["builds_per_input"], figures["gate"]
    after = figures["noop_after_bump"]
    lines = [
        f"1. no-op deploy / gather_facts play    {noop['ratio']:>5}  (goal <= 2.0)  "
        f"{noop['deploy_seconds']} s / {noop['gather_facts_seconds']} s; builds={noop['builds']} "
        f"restarts={noop['restarts']} changed={noop['changed_tasks']}",
        f"   the no-op ran {noop['sequential_remote_steps']} remote task steps in sequence, "
        f"{noop['seconds_per_remote_step']} s each on this connection ({noop['connection']})",
        f"   medians of {len(noop['deploy_runs'])} alternated: no-op {noop['deploy_runs']} s, "
        f"gather_facts {noop['gather_facts_runs']} s",
        f"   after the bump (precompiled wheel on every host): {after['ratio']} ({after['deploy_seconds']} s; "
        f"builds={after['builds']} restarts={after['restarts']} changed={after['changed_tasks']}, "
        f"{after['sequential_remote_steps']} remote steps; no-op {after['deploy_runs']} s, "
        f"gather_facts {after['gather_facts_runs']} s)",
        f"2. bump warm / same bump from clean    {bump['ratio']:>5}  (goal <= 0.2)  "
        f"{bump['warm_build_seconds']} s / {bump['clean_build_seconds']} s "
        f"(compile {bump['compile_seconds_per_unit']} s per unit); restarts={bump['restarts']}",
        f"   warm: {bump['warm_precompiled_reason']}",
        f"3. builds per distinct build input     {builds['ratio']:>5}  (goal == 1)     "
        f"{sum(builds['builds_per_release'].values())} builds, {len(builds['builds_per_release'])} releases, "
        f"{builds['hosts']} hosts; hosts per release {sorted(builds['hosts_per_release'].values())}",
        f"4. gate / whole deploy (bump)          {gate['bump']['ratio']:>5}  (goal <= 0.10) "
        f"{gate['bump']['gate_seconds']} s / {gate['bump']['deploy_seconds']} s (of it measuring "
        f"{gate['bump']['measure_seconds']} s); first deploy {gate['first']['ratio']} "
        f"({gate['first']['gate_seconds']} s / {gate['first']['deploy_seconds']} s), no-op {gate['noop']['ratio']}",
        f"   measured in the bump: {_measures_line(gate['measures'])}",
        f"bench took {seconds:.0f} s on {machine()}",
    ]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=3, help="systemd test hosts (>= 3 for figure 3)")
    parser.add_argument("--compile-seconds", type=int, default=20, help="cost of one C translation unit")
    parser.add_argument("--keep", action="store_true", help="leave the containers running (debugging)")
    args = parser.parse_args(argv)
    bench = Bench(args.hosts, args.compile_seconds, args.keep)
    bench.check_prerequisites()
    atexit.register(bench.cleanup)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda number, frame: sys.exit(128 + number))
    started = time.monotonic()
    log(f"starting {args.hosts} test hosts ({IMAGE}); work dir {bench.work}")
    bench.start_hosts()
    bench.prepare_hosts()
    bench.write_inventory()
    log("hosts ready")
    try:
        figures = measure(bench)
    except Exception as exc:  # any failure: say what, keep what the playbooks printed, remove the hosts
        log(f"FAILED: {exc}")
        log(f"playbook outputs: {bench.work}")
        return 1
    seconds = time.monotonic() - started
    text = report(figures, seconds)
    print(text)
    result = {
        "date": bench.stamp,
        "machine": machine(),
        "connection": CONNECTION,
        "seconds": round(seconds, 1),
        "figures": figures,
    }
    save(bench.work, result, text)
    return 0


def save(work: Path, result: Dict[str, Any], text: str) -> None:
    """figures.json and figures.txt beside the playbook outputs."""
    (work / "figures.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    (work / "figures.txt").write_text(text + "\n")
    log(f"results: {work}/figures.json")


if __name__ == "__main__":
    sys.exit(main())
