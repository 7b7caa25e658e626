# Print <root>/build-status.json with "alive": whether its pid (the build module) still runs, and the
# build log's last lines when it does not. Run by vllm_install's poll loop on the target (python3 -c).
import json
import os
import sys

try:
    with open(sys.argv[1]) as handle:
        status = json.load(handle)
except (OSError, ValueError):
    sys.exit(0)  # no status (yet): prints nothing
pid = status.get("pid")
started = status.get("pid_start")  # the build's start time (ticks after boot): (pid, pid_start) is the build
alive = True
if isinstance(pid, int) and pid > 0:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        alive = False
    except PermissionError:
        pass  # runs, as another user
    if alive:
        try:  # a zombie (killed, not yet reaped by async_wrapper) has stopped building too
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rpartition(")")[2].split()
            alive = fields[0] != "Z"
            # The pid runs, but another process than the build that died: the kernel gave the pid out again.
            if alive and isinstance(started, int) and int(fields[19]) != started:
                alive = False
                status["pid_reused"] = True
        except (OSError, IndexError, ValueError):
            pass
status["alive"] = alive
if not alive and status.get("log_path"):
    try:
        with open(status["log_path"], "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - 8192))
            status["log_tail"] = handle.read().decode("utf-8", "replace").splitlines()[-30:]
    except OSError:
        status["log_tail"] = []
print(json.dumps(status))
