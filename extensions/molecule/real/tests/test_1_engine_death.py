"""kill -9 of real vLLM's engine core under the role's unit: the API server exits, the unit restarts it, and it
serves again within a measured bound.

Nothing of the unit may outlive SIGKILL: the unit's cgroup.procs is read while systemd is in stop-sigkill.
Without CAP_SYS_ADMIN (a test host before 2026-12-06) systemd in a container on a cgroup v1/hybrid machine got
no cgroup-empty notification and waited TimeoutStopSec (vllm_shutdown_timeout + 30 s) before it restarted,
logging "Processes still around after SIGKILL" with cgroup.procs empty; the test asserts that such a wait
comes only on a cgroup v1 host."""

from __future__ import annotations

import time

from deploy_helper import service_pid
from helpers.polling import wait_for
from real_helper import UNIT, engine_core_pid, journal_cursor, journal_since, serves, unit_property

# Measured on the 2-core machine beside the other lanes (README.md, Tests): RestartSec (10 s) and a 30-100 s
# start (40.3 s in all on 2026-12-06; 109 s with the 60 s wait above); the bound leaves room for a busier machine.
READY_AGAIN_BOUND_S = 300


def test_a_killed_engine_core_is_restarted_and_serves_again_within_the_bound(host):
    main, restarts = service_pid(host), int(unit_property(host, "NRestarts"))
    cursor = journal_cursor(host)
    killed_at = time.monotonic()
    host.check_output(f"kill -9 {engine_core_pid(host)}")
    # While systemd waits in stop-sigkill, what is left in the unit's cgroup (cgroup v1: the name=systemd
    # hierarchy; v2: the unified one). On cgroup v2 the state may pass too fast to be seen.
    left = None
    for _ in range(120):
        if unit_property(host, "SubState") == "stop-sigkill":
            time.sleep(2)
            left = host.check_output(
                "cat $(find /sys/fs/cgroup/systemd /sys/fs/cgroup -maxdepth 6 -type d -path '*/system.slice/"
                f"{UNIT}' 2>/dev/null | head -n 1)/cgroup.procs"
            )
            break
        if service_pid(host) not in (0, main):
            break
        time.sleep(0.5)
    wait_for(lambda: service_pid(host) not in (0, main), "a new main process", READY_AGAIN_BOUND_S)
    restarted_s = time.monotonic() - killed_at
    wait_for(lambda: serves(host), "served again (/health and a completion)", READY_AGAIN_BOUND_S)
    ready_s = time.monotonic() - killed_at
    print(f"kill -9 of VLLM::EngineCore: restarted after {restarted_s:.1f} s, serving again after {ready_s:.1f} s")
    assert ready_s <= READY_AGAIN_BOUND_S
    assert int(unit_property(host, "NRestarts")) == restarts + 1
    journal = journal_since(host, cursor)
    print(journal[-6000:])
    assert "Scheduled restart job" in journal
    print("in stop-sigkill, the unit's cgroup.procs:", repr(left))
    # SIGKILL took every process of the unit: whatever systemd then waits for, it is not a process
    assert left in (None, ""), f"processes of the unit outlived SIGKILL: {left}"
    if "Processes still around after SIGKILL" in journal:
        # systemd's wait for a cgroup-empty notification that a container on cgroup v1 never gets
        assert host.check_output("stat -fc %T /sys/fs/cgroup") == "tmpfs", "a wait on cgroup v2: the unit's doing"
