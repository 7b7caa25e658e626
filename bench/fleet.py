# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_ops.dflash fleet benchmark at real size (issue 17 part 4; see bench/README.md): N = 3 and N = 6.

For each fleet size, in one run: N systemd test hosts as `make bench` starts them (bench/run.py's Bench), a
wheel padded to 300 MB (the fixture engine's VLLM_FIXTURE_PAD_MB; the real 0.26.0 wheel is 304 MB), a
deploy from clean, one copy of that wheel to one host (the same copy module, alone), a no-op deploy; the
hosts are removed before the next size. Ratios:

  wheel distribution / one copy      the deploy's copy tasks to N hosts (union of their intervals) over one copy
  no-op at N = 6 / no-op at N = 3    wall clock of the no-op deploys
  builds per distinct build input    hosts that compiled a release / distinct releases

    .venv/bin/python bench/fleet.py [--sizes 3 6] [--pad-mb 300] [--forks F] [--keep]
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import RESULTS, Bench, PlaybookRun, log, machine, save

DEPLOY = "vllm_ops.dflash.deploy_dflash"
COPY_TASK = "Copy the fleet's wheel to this host"
FETCH_TASK = "Fetch the wheel to the controller"
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


def disk_and_memory() -> str:
    disk = shutil.disk_usage("/")
    mem = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        mem[key] = int(value.split()[0]) // 1024
    return f"disk free {disk.free / 1024**3:.1f} GiB, memory available {mem['MemAvailable'] / 1024:.1f} GiB"


def one_fleet(size: int, pad_mb: int, forks: int, keep: bool, work: Path) -> Dict[str, Any]:
    bench = Bench(size, compile_seconds=1, keep=keep, work=work, build_env={"VLLM_FIXTURE_PAD_MB": str(pad_mb)})
    # Ansible runs a task on at most `forks` hosts at once (default 5): fewer than the fleet, and every
    # per-host task of the look and the wheel's copy go in waves.
    bench.env["ANSIBLE_FORKS"] = str(forks or size)
    bench.work.mkdir(parents=True, exist_ok=True)
    bench.inventory = bench.work / "inventory.yml"
    atexit.register(bench.cleanup)
    try:
        log(f"N={size}: starting hosts ({disk_and_memory()})")
        bench.start_hosts()
        bench.prepare_hosts()
        bench.write_inventory()
        first = bench.playbook(f"n{size}-deploy-1-clean", DEPLOY)
        wheels = sorted((bench.work / "wheels").glob("*/*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"expected one fleet wheel on the controller, found {wheels}")
        wheel = wheels[0]
        play = bench.work / "one-copy.yml"
        play.write_text(ONE_COPY_PLAY.format(host=bench.names[-1], task=COPY_TASK, wheel=wheel))
        one = bench.playbook(f"n{size}-one-copy", str(play))
        noop = bench.playbook(f"n{size}-deploy-2-noop", DEPLOY)
        builds, holders = bench.builds()
        log(f"N={size}: measured ({disk_and_memory()})")
        return {"forks": int(bench.env["ANSIBLE_FORKS"]), **figures_of(size, first, one, noop, wheel, builds, holders)}
    finally:
        bench.cleanup()
        shutil.rmtree(bench.work / "wheels", ignore_errors=True)  # 300 MB per release


def figures_of(
    size: int,
    first: PlaybookRun,
    one: PlaybookRun,
    noop: PlaybookRun,
    wheel: Path,
    builds: Dict[str, int],
    holders: Dict[str, int],
) -> Dict[str, Any]:
    distribution = first.task_seconds(COPY_TASK)
    one_copy = one.task_seconds(COPY_TASK)
    copies = [result for result in first.results(COPY_TASK) if not result.get("skipped")]
    return {
        "hosts": size,
        "wheel_mb": round(wheel.stat().st_size / 1e6, 1),
        "distribution_seconds": round(distribution, 1),
        "distribution_batches": len(first.tasks(COPY_TASK)),
        "copies": len(copies),
        "one_copy_seconds": round(one_copy, 1),
        "distribution_per_copy": round(distribution / one_copy, 2) if one_copy else None,
        "fetch_seconds": round(first.task_seconds(FETCH_TASK), 1),
        "deploy_seconds": round(first.wall, 1),
        "noop_seconds": round(noop.wall, 1),
        "noop_changed": noop.changed(),
        "builds_per_release": builds,
        "hosts_per_release": holders,
        "builds_per_input": round(sum(builds.values()) / len(builds), 2) if builds else None,
        "slowest_tasks": first.breakdown()["slowest_tasks"],
    }


def report(fleets: List[Dict[str, Any]], seconds: float) -> str:
    by_size = {fleet["hosts"]: fleet for fleet in fleets}
    lines = []
    for fleet in fleets:
        lines.append(
            f"N={fleet['hosts']} (forks {fleet['forks']}): wheel {fleet['wheel_mb']} MB; distribution / one copy "
            f"{fleet['distribution_per_copy']}"
            f" (goal <= 1.5): {fleet['distribution_seconds']} s for {fleet['copies']} copies in "
            f"{fleet['distribution_batches']} batch(es) / {fleet['one_copy_seconds']} s; fetch to the controller "
            f"{fleet['fetch_seconds']} s; deploy {fleet['deploy_seconds']} s; no-op {fleet['noop_seconds']} s "
            f"(changed {fleet['noop_changed']}); builds per input {fleet['builds_per_input']} (goal == 1), "
            f"hosts per release {sorted(fleet['hosts_per_release'].values())}"
        )
    if 3 in by_size and 6 in by_size:
        ratio = by_size[6]["noop_seconds"] / by_size[3]["noop_seconds"]
        lines.append(
            f"no-op at N=6 / at N=3: {ratio:.2f} (goal <= 1.2): {by_size[6]['noop_seconds']} s / "
            f"{by_size[3]['noop_seconds']} s"
        )
    lines.append(f"fleet bench took {seconds:.0f} s on {machine()}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 6], help="fleet sizes, one after the other")
    parser.add_argument("--pad-mb", type=int, default=300, help="MiB of random bytes added to the wheel")
    parser.add_argument("--forks", type=int, default=0, help="ansible forks (default: the fleet size)")
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
                one_fleet(size, args.pad_mb, args.forks, args.keep and size == args.sizes[-1], work / f"n{size}")
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
