# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_ops.dflash fleet benchmark at real size (issue 17 part 4; see bench/README.md): N = 3 and N = 6.

For each fleet size, in one run: N systemd test hosts as `make bench` starts them (bench/run.py's Bench), a
wheel padded to 300 MB (the fixture engine's VLLM_FIXTURE_PAD_MB; the real 0.26.0 wheel is 304 MB), a
deploy from clean, one plain `ansible.builtin.copy` of that wheel to one host, the deploy's own mechanism
(dflash_wheel_distribution, peer by default) to one host alone, a no-op deploy; the hosts are removed
before the next size. Ratios:

  wheel distribution / one copy      the deploy's distribution tasks to N hosts (union of their intervals) over
                                     one plain copy (the goal's reading) and over the same mechanism to one host
  no-op at N = 6 / no-op at N = 3    wall clock of the no-op deploys (median of NOOP_RUNS), beside the same
                                     ratio of the floor, a play of one `ping` per host (the least a look can
                                     cost), and of the look's remote step alone: one `vllm_drift` call per
                                     host with the arguments the no-op's look sent, nothing on the controller
  builds per distinct build input    hosts that compiled a release / distinct releases

The no-op's CPU per host (issue 30: controller <= 0.3 s, hosts <= 0.45 s) is the median no-op of the whole
fleet less the median of the same no-op on half of it (`--limit`), run between them, per host added.

    .venv/bin/python bench/fleet.py [--sizes 3 6] [--pad-mb 300] [--forks F] [--distribution peer|controller] [--keep]
"""

from __future__ import annotations

import argparse
import atexit
import json
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import RESULTS, Bench, PlaybookRun, _interval, _run, _union_seconds, log, machine, save

DEPLOY = "vllm_ops.dflash.deploy_dflash"
COPY_TASK = "Copy the fleet's wheel to this host"
FETCH_TASK = "Fetch the wheel to the controller"
IDLE_SECONDS = 3.0
NOOP_RUNS = 3  # no-op and floor alternate; a single run moves by +-30 % on 2 shared cores
# A play of one task per host (`{args}` is JSON, which is YAML).
ONE_STEP_PLAY = """- name: {play}
  hosts: gpu_hosts
  gather_facts: false
  tasks:
    - name: {task}
      {module}: {args}
"""
# The least any look at every host costs: one remote step per host, nothing else.
FLOOR_PLAY = ONE_STEP_PLAY.format(
    play="The floor, one remote step per host", task="One remote step", module="ansible.builtin.ping", args="{}"
)
# The no-op's one remote step per host, run alone with the arguments the look sent (look_step_play): what the
# look costs without the renders, validations and facts around it on the controller.
LOOK_TASK = "Would a deploy change this host"
BUILD_FACT_TASK = "Keep the fleet's build for the rollout"
# The deploy's distribution, either path (deploy_dflash.yml); the controller path's fetch is reported apart.
PEER_TASKS = (
    "Make the fleet's wheel directory",
    "Serve the fleet's wheel from the build host",
    "Download the fleet's wheel from the build host",
    "Stop serving the fleet's wheel",
)
DISTRIBUTION_TASKS = (*PEER_TASKS, COPY_TASK)
ONE_COPY_PLAY = """- name: One copy of the fleet's wheel to one host
  hosts: {host}
  gather_facts: false
  tasks:
    - name: {task}
      ansible.builtin.copy:
        src: {wheel}
        dest: /opt/vllm/wheels/bench-one-copy/
        mode: "0644"
"""
# The peer mechanism to one host alone: the deploy's four tasks, as the deploy runs them.
ONE_PULL_PLAY = """- name: The fleet's wheel pulled by one host from the build host
  hosts: {client}
  gather_facts: false
  tasks:
    - name: {tasks[0]}
      ansible.builtin.file:
        path: /opt/vllm/wheels/bench-one-pull
        state: directory
        mode: "0755"
    - name: {tasks[1]}
      vllm_ops.dflash.vllm_wheel_serve:
        path: {wheel}
        address: {address}
        timeout: 600
      register: server
      delegate_to: {server}
    - name: {tasks[2]}
      ansible.builtin.get_url:
        url: "{{{{ server.url }}}}"
        dest: /opt/vllm/wheels/bench-one-pull/{name}
        checksum: "sha256:{sha256}"
        mode: "0644"
        timeout: 30
    - name: {tasks[3]}
      vllm_ops.dflash.vllm_wheel_serve:
        state: stopped
        pid: "{{{{ server.pid }}}}"
        token: "{{{{ server.token }}}}"
      delegate_to: {server}
"""


def disk_and_memory() -> str:
    disk = shutil.disk_usage("/")
    mem = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        mem[key] = int(value.split()[0]) // 1024
    return f"disk free {disk.free / 1024**3:.1f} GiB, memory available {mem['MemAvailable'] / 1024:.1f} GiB"


def host_cpu_seconds(bench: Bench) -> float:
    """CPU the fleet's containers used so far (their cgroups: v1 cpuacct, else v2 cpu.stat), in seconds."""
    total = 0.0
    for name in bench.names:
        path = _run(["podman", "inspect", name, "--format", "{{.State.CgroupPath}}"]).strip().lstrip("/")
        v1 = Path("/sys/fs/cgroup/cpuacct") / path / "cpuacct.usage"
        if v1.exists():
            total += int(v1.read_text()) / 1e9
            continue
        stat = dict(line.split() for line in (Path("/sys/fs/cgroup") / path / "cpu.stat").read_text().splitlines())
        total += int(stat["usage_usec"]) / 1e6
    return total


def measured_noop(bench: Bench, label: str, *args: str) -> Tuple[PlaybookRun, Dict[str, float]]:
    """The no-op deploy, and the CPU it cost: the controller (ansible-playbook and the processes it waited
    for; not ssh's ControlPersist masters, which detach) and the hosts (their containers' cgroups, less what
    they use idle over as long)."""
    idle_from = host_cpu_seconds(bench)
    time.sleep(IDLE_SECONDS)  # what the hosts burn doing nothing (systemd, the idle fixture server)
    idle_rate = (host_cpu_seconds(bench) - idle_from) / IDLE_SECONDS
    hosts_before = host_cpu_seconds(bench)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = bench.playbook(label, DEPLOY, *args)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    controller = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    hosts = host_cpu_seconds(bench) - hosts_before - idle_rate * run.wall
    size = len(bench.names)
    return run, {
        "controller_cpu_seconds": round(controller, 2),
        "hosts_cpu_seconds": round(hosts, 2),
        "hosts_idle_cpu_per_second": round(idle_rate, 3),
        "cpu_seconds_per_host": round((controller + hosts) / size, 2),
    }


def look_step_play(noop: PlaybookRun) -> str:
    """The look's remote step alone, with the arguments the no-op's look sent to every host (they must be the same)."""
    sent = {json.dumps(result["invocation"]["module_args"], sort_keys=True) for result in noop.results(LOOK_TASK)}
    if len(sent) != 1 or "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" in next(iter(sent)):
        raise RuntimeError(f"{noop.label}: the look sent {len(sent)} different argument sets, or masked ones")
    args = {key: value for key, value in json.loads(sent.pop()).items() if value is not None}
    return ONE_STEP_PLAY.format(
        play="The look's remote step alone", task=LOOK_TASK, module="vllm_ops.dflash.vllm_drift", args=json.dumps(args)
    )


def one_fleet(size: int, pad_mb: int, forks: int, distribution: str, keep: bool, work: Path) -> Dict[str, Any]:
    bench = Bench(size, compile_seconds=1, keep=keep, work=work, build_env={"VLLM_FIXTURE_PAD_MB": str(pad_mb)})
    # Ansible runs a task on at most `forks` hosts at once (default 5): fewer than the fleet, and every
    # per-host task of the look and the wheel's copy go in waves.
    bench.env["ANSIBLE_FORKS"] = str(forks or size)
    bench.work.mkdir(parents=True, exist_ok=True)
    bench.inventory = bench.work / "inventory.yml"
    atexit.register(bench.cleanup)
    how = ("-e", f"dflash_wheel_distribution={distribution}")
    try:
        log(f"N={size}: starting hosts ({disk_and_memory()})")
        bench.start_hosts()
        bench.prepare_hosts()
        bench.write_inventory()
        first = bench.playbook(f"n{size}-deploy-1-clean", DEPLOY, *how)
        build = first.results(BUILD_FACT_TASK)[0]["ansible_facts"]["dflash_fleet_build"]
        server = next(name for name in bench.names if _built_here(bench, name))
        # The plain copy's source on the controller: taken out of the container (not measured).
        wheel = bench.work / "wheels" / "one-copy" / Path(build["wheel"]).name
        wheel.parent.mkdir(parents=True, exist_ok=True)
        _run(["podman", "cp", f"{server}:{build['wheel']}", str(wheel)])
        client = next(name for name in reversed(bench.names) if name != server)
        play = bench.work / "one-copy.yml"
        play.write_text(ONE_COPY_PLAY.format(host=client, task=COPY_TASK, wheel=wheel))
        one = bench.playbook(f"n{size}-one-copy", str(play))
        pull = bench.work / "one-pull.yml"
        pull.write_text(
            ONE_PULL_PLAY.format(
                client=client,
                server=server,
                address=bench.addresses[server],
                wheel=build["wheel"],
                name=wheel.name,
                sha256=build["wheel_sha256"],
                tasks=PEER_TASKS,
            )
        )
        one_pull = bench.playbook(f"n{size}-one-pull", str(pull))
        floor_play = bench.work / "floor.yml"
        floor_play.write_text(FLOOR_PLAY)
        noops, floors, steps, halves = [], [], [], []
        look_play = bench.work / "look-step.yml"
        half = ("--limit", ",".join(bench.names[: size // 2]))
        for index in range(NOOP_RUNS):
            floors.append(bench.playbook(f"n{size}-floor-{index}", str(floor_play)).wall)
            noops.append(measured_noop(bench, f"n{size}-deploy-{index + 2}-noop", *how))
            # The same no-op on half the fleet, between two of the whole: the CPU a host adds, side by side.
            halves.append(measured_noop(bench, f"n{size}-half-noop-{index}", *how, *half)[1])
            if index == 0:
                look_play.write_text(look_step_play(noops[0][0]))
            steps.append(bench.playbook(f"n{size}-look-step-{index}", str(look_play)).wall)
        noop, noop_cpu = sorted(noops, key=lambda run_cpu: run_cpu[0].wall)[NOOP_RUNS // 2]
        added = size - size // 2
        builds, holders = bench.builds()
        log(f"N={size}: measured ({disk_and_memory()})")
        figures = figures_of(size, first, one, one_pull if distribution == "peer" else one, noop, wheel)
        return {
            "forks": int(bench.env["ANSIBLE_FORKS"]),
            "distribution": distribution,
            **figures,
            "noop_cpu": noop_cpu,
            # Medians of the whole fleet's no-ops less those of half of it, per host added.
            "noop_cpu_per_host": {
                part: round(
                    (statistics.median(cpu[part] for _run, cpu in noops) - statistics.median(h[part] for h in halves))
                    / added,
                    2,
                )
                for part in ("controller_cpu_seconds", "hosts_cpu_seconds")
            },
            "noop_runs_seconds": [round(pair[0].wall, 1) for pair in noops],
            "noop_changed_all": [pair[0].changed() for pair in noops],
            "floor_seconds": round(statistics.median(floors), 2),
            "floor_runs_seconds": [round(wall, 2) for wall in floors],
            "look_step_seconds": round(statistics.median(steps), 2),
            "look_step_runs_seconds": [round(wall, 2) for wall in steps],
            "builds_per_release": builds,
            "hosts_per_release": holders,
            "builds_per_input": round(sum(builds.values()) / len(builds), 2) if builds else None,
        }
    finally:
        bench.cleanup()
        shutil.rmtree(bench.work / "wheels", ignore_errors=True)  # 300 MB per release


def _built_here(bench: Bench, host: str) -> bool:
    return any(manifest["source"] == "build" for manifest in bench.manifests(host))


def _ratio(part: float, whole: float) -> Optional[float]:
    return round(part / whole, 2) if whole else None


def figures_of(
    size: int, first: PlaybookRun, one: PlaybookRun, same: PlaybookRun, noop: PlaybookRun, wheel: Path
) -> Dict[str, Any]:
    """The distribution (every distribution task of the deploy, all batches) against one plain copy and
    against the same mechanism to one host (`same`: the pull play under peer, the plain copy otherwise)."""
    distribution = _union_seconds([_interval(task) for name in DISTRIBUTION_TASKS for task in first.tasks(name)])
    one_copy = one.task_seconds(COPY_TASK)
    one_same = _union_seconds([_interval(task) for name in DISTRIBUTION_TASKS for task in same.tasks(name)])
    moved = [
        result
        for name in ("Download the fleet's wheel from the build host", COPY_TASK)
        for result in first.results(name)
        if not result.get("skipped")
    ]
    return {
        "hosts": size,
        "wheel_mb": round(wheel.stat().st_size / 1e6, 1),
        "distribution_seconds": round(distribution, 1),
        "copies": len(moved),
        "one_copy_seconds": round(one_copy, 1),
        "one_same_seconds": round(one_same, 1),
        "distribution_per_copy": _ratio(distribution, one_copy),
        "distribution_per_same": _ratio(distribution, one_same),
        "fetch_seconds": round(first.task_seconds(FETCH_TASK), 1),
        "deploy_seconds": round(first.wall, 1),
        "noop_seconds": round(noop.wall, 1),
        "noop_changed": noop.changed(),
        "noop_look": noop.breakdown(top=12)["slowest_tasks"],
        "slowest_tasks": first.breakdown()["slowest_tasks"],
    }


def _six_over_three(by_size: Dict[int, Dict[str, Any]], key: str) -> str:
    return f"{by_size[6][key] / by_size[3][key]:.2f} ({by_size[6][key]} s / {by_size[3][key]} s)"


def report(fleets: List[Dict[str, Any]], seconds: float) -> str:
    by_size = {fleet["hosts"]: fleet for fleet in fleets}
    lines = []
    for fleet in fleets:
        lines.append(
            f"N={fleet['hosts']} (forks {fleet['forks']}, {fleet['distribution']}): wheel {fleet['wheel_mb']} MB; "
            f"distribution / one plain copy {fleet['distribution_per_copy']} (goal <= 1.5): "
            f"{fleet['distribution_seconds']} s for {fleet['copies']} copies / {fleet['one_copy_seconds']} s; "
            f"over the same mechanism to one host {fleet['distribution_per_same']} ({fleet['one_same_seconds']} s); "
            "fetch to the controller "
            f"{fleet['fetch_seconds']} s; deploy {fleet['deploy_seconds']} s; no-op {fleet['noop_seconds']} s "
            f"(changed {fleet['noop_changed']}; CPU: controller {fleet['noop_cpu']['controller_cpu_seconds']} s, hosts "
            f"{fleet['noop_cpu']['hosts_cpu_seconds']} s; runs {fleet['noop_runs_seconds']}; per host, against "
            f"half the fleet alternated: controller {fleet['noop_cpu_per_host']['controller_cpu_seconds']} s "
            f"(goal <= 0.3), hosts {fleet['noop_cpu_per_host']['hosts_cpu_seconds']} s (goal <= 0.45)); "
            f"floor (one ping per host) {fleet['floor_seconds']} s (runs {fleet['floor_runs_seconds']}); "
            f"the look's remote step alone {fleet['look_step_seconds']} s (runs {fleet['look_step_runs_seconds']}); "
            f"builds per input {fleet['builds_per_input']} (goal == 1), "
            f"hosts per release {sorted(fleet['hosts_per_release'].values())}"
        )
    if 3 in by_size and 6 in by_size:
        lines.append(
            f"no-op at N=6 / at N=3: {_six_over_three(by_size, 'noop_seconds')} (goal <= 1.2; medians of "
            f"{NOOP_RUNS}); the floor's: {_six_over_three(by_size, 'floor_seconds')}; the look's remote step "
            f"alone: {_six_over_three(by_size, 'look_step_seconds')}"
        )
    lines.append(f"fleet bench took {seconds:.0f} s on {machine()}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 6], help="fleet sizes, one after the other")
    parser.add_argument("--pad-mb", type=int, default=300, help="MiB of random bytes added to the wheel")
    parser.add_argument("--forks", type=int, default=0, help="ansible forks (default: the fleet size)")
    parser.add_argument(
        "--distribution", choices=["peer", "controller"], default="peer", help="dflash_wheel_distribution"
    )
    parser.add_argument("--keep", action="store_true", help="leave the last fleet's containers running")
    args = parser.parse_args(argv)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    work = RESULTS / f"fleet-{stamp}"
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda number, frame: sys.exit(128 + number))
    Bench(1, 1, False, work=work).check_prerequisites()
    started = time.monotonic()
    fleets = []
    try:
        for size in args.sizes:
            fleets.append(
                one_fleet(
                    size,
                    args.pad_mb,
                    args.forks,
                    args.distribution,
                    args.keep and size == args.sizes[-1],
                    work / f"n{size}",
                )
            )
    except (RuntimeError, subprocess.SubprocessError) as exc:
        log(f"FAILED: {exc}")
        log(f"playbook outputs: {work}")
        return 1
    text = report(fleets, time.monotonic() - started)
    print(text)
    save(
        work,
        {"date": stamp, "machine": machine(), "seconds": round(time.monotonic() - started, 1), "fleets": fleets},
        text,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
