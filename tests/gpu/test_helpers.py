# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The proof's helpers: unit_exec.py (a rendered unit run without systemd) and make_release.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_release  # noqa: E402
import unit_exec  # noqa: E402

# A stand-in server: /health answers 200, /env returns its environment and working directory as JSON.
# With IGNORE_TERM=1 it ignores SIGTERM; with CHILD=1 it starts a child in its process group.
SERVER = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    if os.environ.get("IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("CHILD") == "1":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open("child.pid", "w").write(str(child.pid))
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "argv": sys.argv}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    print("serving", flush=True)
    HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive(pid: int) -> bool:
    """Running, not a zombie: the helper's servers are reparented, and PID 1 may not reap them."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def write_unit(tmp_path: Path, exec_start: str, env_file_lines: str = "", extra: str = "") -> Path:
    env_file = tmp_path / "etc" / "test.env"
    env_file.parent.mkdir(parents=True, exist_ok=True)
    env_file.write_text(env_file_lines)
    unit = tmp_path / "vllm-test.service"
    unit.write_text(
        textwrap.dedent(
            f"""\
            # comment
            [Unit]
            Description=test
            Environment=NOT_SERVICE=1

            [Service]
            Type=exec
            User=vllm
            EnvironmentFile={env_file}
            Environment=HOME=/var/lib/vllm XDG_CACHE_HOME=/var/cache/vllm "QUOTED=a b"
            ExecStart={exec_start}
            WorkingDirectory=/var/lib/vllm
            StateDirectory=vllm
            CacheDirectory=vllm
            TimeoutStopSec=2
            KillSignal=SIGTERM
            {extra}
            """
        )
    )
    return unit


def test_parse_unit_reads_the_service_section_only():
    settings = unit_exec.parse_unit(
        "[Unit]\nEnvironment=A=1\n[Service]\n; note\nEnvironment=B=2\nExecStart=/bin/x \\\n  --flag\nEnvironment=C=3\n"
    )
    assert settings == {"Environment": ["B=2", "C=3"], "ExecStart": ["/bin/x  --flag"]}
    assert unit_exec.exec_start(settings) == ["/bin/x", "--flag"]


@pytest.mark.parametrize(
    ("exec_starts", "message"),
    [
        ([], "exactly one ExecStart"),
        (["/bin/a", "/bin/b"], "exactly one ExecStart"),
        (["/bin/a $HOME"], "does not expand"),
        (["/bin/a %i"], "does not expand"),
    ],
)
def test_exec_start_refuses_what_it_cannot_run_as_written(exec_starts, message):
    with pytest.raises(unit_exec.UnitError, match=message):
        unit_exec.exec_start({"ExecStart": exec_starts})


def test_exec_start_prefixes_do_not_reach_argv():
    assert unit_exec.exec_start({"ExecStart": ["-/usr/bin/vllm serve"]}) == ["/usr/bin/vllm", "serve"]


def test_environment_file_overrides_environment_and_paths_move_under_the_state_root(tmp_path):
    env_file = tmp_path / "x.env"
    env_file.write_text("# managed\nHOME=/var/lib/other\nHF_TOKEN='secret'\n\nTOKENIZERS_PARALLELISM=false\n")
    settings = {
        "Environment": ["HOME=/var/lib/vllm XDG_CACHE_HOME=/var/cache/vllm", '"QUOTED=a b"'],
        "EnvironmentFile": [str(env_file), "-/nonexistent/optional.env"],
    }
    env = unit_exec.service_environment(settings, state_root="/srv/state")
    assert env["HOME"] == "/srv/state/var/lib/other"
    assert env["XDG_CACHE_HOME"] == "/srv/state/var/cache/vllm"
    assert env["QUOTED"] == "a b"
    assert env["HF_TOKEN"] == "secret"
    assert env["PATH"] == unit_exec.DEFAULT_PATH
    shown = unit_exec.masked(env)
    assert shown["HF_TOKEN"] == "********"
    assert shown["TOKENIZERS_PARALLELISM"] == "false"


def test_a_missing_environment_file_is_an_error(tmp_path):
    with pytest.raises(unit_exec.UnitError, match="does not exist"):
        unit_exec.service_environment({"EnvironmentFile": [str(tmp_path / "absent.env")]}, "")


def run_helper(*args: str) -> tuple:
    result = subprocess.run(
        [sys.executable, str(HERE / "unit_exec.py"), *args], capture_output=True, text=True, timeout=60, check=False
    )
    return result.returncode, json.loads(result.stdout)


def test_start_runs_exec_start_in_the_units_environment_and_stop_ends_the_group(tmp_path):
    port = free_port()
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    unit = write_unit(tmp_path, f"{sys.executable} {script} {port}", "VLLM_X=from-file\nCHILD=1\nHF_TOKEN=t0k\n")
    state = tmp_path / "state"
    pidfile, log = tmp_path / "server.pid", tmp_path / "server.log"
    rc, started = run_helper(
        "start", str(unit), f"--pidfile={pidfile}", f"--log={log}", f"--health-url=http://127.0.0.1:{port}/health",
        "--timeout=30", f"--state-root={state}",
    )  # fmt: skip
    try:
        assert rc == 0, started
        assert started["healthy"] is True
        assert started["argv"] == [sys.executable, str(script), str(port)]
        assert started["env"]["HF_TOKEN"] == "********"
        seen = json.loads(unit_exec._OPENER.open(f"http://127.0.0.1:{port}/env", timeout=5).read())
        cwd = str(state / "var/lib/vllm")
        assert seen["cwd"] == cwd
        assert seen["env"]["HOME"] == cwd
        assert seen["env"]["VLLM_X"] == "from-file"
        assert seen["env"]["QUOTED"] == "a b"
        assert "NOT_SERVICE" not in seen["env"]
        assert "PYTEST_CURRENT_TEST" not in seen["env"]  # nothing of the caller's environment
        assert (state / "var/cache/vllm").is_dir()
        child = int((state / "var/lib/vllm/child.pid").read_text())
    finally:
        rc, stopped = run_helper("stop", str(unit), f"--pidfile={pidfile}", f"--log={log}")
    assert rc == 0, stopped
    assert stopped["stopped"] is True
    assert stopped["killed"] == []  # SIGTERM was enough
    assert "serving" in stopped["log_excerpt"]["tail"]
    assert not pidfile.exists()
    assert not unit_exec._group_members(started["pid"])
    assert not alive(started["pid"])
    assert not alive(child)


@pytest.mark.slow
def test_stop_kills_what_ignores_the_kill_signal_after_timeout_stop_sec(tmp_path):
    port = free_port()
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    unit = write_unit(tmp_path, f"{sys.executable} {script} {port}", "IGNORE_TERM=1\n")
    pidfile, log = tmp_path / "server.pid", tmp_path / "server.log"
    rc, started = run_helper(
        "start", str(unit), f"--pidfile={pidfile}", f"--log={log}", f"--health-url=http://127.0.0.1:{port}/",
        "--timeout=30", f"--state-root={tmp_path}",
    )  # fmt: skip
    assert rc == 0, started
    began = time.monotonic()
    rc, stopped = run_helper("stop", str(unit), f"--pidfile={pidfile}")
    assert rc == 0, stopped
    assert stopped["killed"] == [started["pid"]]
    assert 2 <= time.monotonic() - began < 20
    assert not alive(started["pid"])


def test_exec_start_unescapes_systemds_dollar_and_percent():
    line = "/bin/sh -c 'r=$$(readlink -f /opt/x) && exec \"$$r/bin/vllm\" serve --n 100%%'"
    assert unit_exec.exec_start({"ExecStart": [line]}) == [
        "/bin/sh",
        "-c",
        'r=$(readlink -f /opt/x) && exec "$r/bin/vllm" serve --n 100%',
    ]


def test_the_roles_unit_runs_the_current_release_with_its_own_cache_root_under_the_state_root(tmp_path):
    """vllm_service's ExecStart (a /bin/sh that resolves `current` once) run by unit_exec: the release's venv,
    VLLM_CACHE_ROOT per release, and the unit's /var/cache path moved under --state-root."""
    release = tmp_path / "opt" / "releases" / "abc123-def"
    (release / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "opt" / "current").symlink_to("releases/abc123-def")
    port = free_port()
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    vllm = release / "venv" / "bin" / "vllm"
    vllm.write_text(f"#!/bin/sh\nexec {sys.executable} {script} {port}\n")
    vllm.chmod(0o755)
    unit = write_unit(
        tmp_path,
        f"/bin/sh -c 'release=$$(readlink -f {tmp_path}/opt/current) && export VLLM_CACHE_ROOT=/var/cache/vllm/"
        'test/$${release##*/} && exec "$$release/venv/bin/vllm" serve\'',
        extra="KillMode=mixed",
    )
    state, pidfile, log = tmp_path / "state", tmp_path / "server.pid", tmp_path / "server.log"
    rc, started = run_helper(
        "start", str(unit), f"--pidfile={pidfile}", f"--log={log}", f"--health-url=http://127.0.0.1:{port}/",
        "--timeout=30", f"--state-root={state}",
    )  # fmt: skip
    try:
        assert rc == 0, started
        seen = json.loads(unit_exec._OPENER.open(f"http://127.0.0.1:{port}/env", timeout=5).read())
        assert seen["env"]["VLLM_CACHE_ROOT"] == f"{state}/var/cache/vllm/test/abc123-def"
        assert seen["argv"] == [str(script), str(port)]
    finally:
        rc, stopped = run_helper("stop", str(unit), f"--pidfile={pidfile}")
    assert rc == 0 and stopped["stopped"], stopped


@pytest.mark.slow
def test_mixed_kill_mode_signals_the_main_process_only_and_kills_the_rest_after_it(tmp_path):
    port = free_port()
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    unit = write_unit(tmp_path, f"{sys.executable} {script} {port}", "CHILD=1\n", extra="KillMode=mixed")
    state, pidfile, log = tmp_path / "state", tmp_path / "server.pid", tmp_path / "server.log"
    rc, started = run_helper(
        "start", str(unit), f"--pidfile={pidfile}", f"--log={log}", f"--health-url=http://127.0.0.1:{port}/",
        "--timeout=30", f"--state-root={state}",
    )  # fmt: skip
    assert rc == 0, started
    child = int((state / "var/lib/vllm/child.pid").read_text())
    rc, stopped = run_helper("stop", str(unit), f"--pidfile={pidfile}")
    assert rc == 0, stopped
    assert stopped["kill_mode"] == "mixed"
    # the child never got SIGTERM (control-group would have ended it): it is what SIGKILL had to end
    assert stopped["killed"] == [child]
    assert not alive(started["pid"]) and not alive(child)


def test_start_reports_a_server_that_exits(tmp_path):
    unit = write_unit(tmp_path, f"{sys.executable} -c 'import sys; print(\"boom\"); sys.exit(3)'")
    pidfile, log = tmp_path / "server.pid", tmp_path / "server.log"
    rc, started = run_helper(
        "start", str(unit), f"--pidfile={pidfile}", f"--log={log}", f"--health-url=http://127.0.0.1:{free_port()}/",
        "--timeout=30", f"--state-root={tmp_path}",
    )  # fmt: skip
    assert rc == 1
    assert started["healthy"] is False
    assert started["exit_code"] == 3
    assert "exited with status 3" in started["msg"]
    assert started["log_excerpt"]["tail"] == ["boom"]


def test_stop_without_a_pidfile_has_nothing_to_do(tmp_path):
    unit = write_unit(tmp_path, "/bin/true")
    rc, stopped = run_helper("stop", str(unit), f"--pidfile={tmp_path / 'none.pid'}")
    assert rc == 0
    assert "nothing to stop" in stopped["msg"]


def test_log_excerpt_picks_vllm_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "(APIServer pid=1) INFO [api_utils.py:345]  ▄▄ ▄█ █  version 0.26.0\n"
        "(APIServer pid=1) INFO non-default args: {'model': 'm'}\n"
        '(APIServer pid=1) INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n'
        "(EngineCore pid=2) INFO [gpu_worker.py:378] Using V2 Model Runner\n"
        "(EngineCore pid=2) INFO [eagle3_utils.py:28] Using Eagle3 auxiliary layers from config: (1, 2, 3)\n"
        "(APIServer pid=1) INFO SpecDecoding metrics: Mean acceptance length: 3.00\n"
    )
    excerpt = unit_exec.log_excerpt(str(log))
    assert excerpt["version"] == ["(APIServer pid=1) INFO [api_utils.py:345]  ▄▄ ▄█ █  version 0.26.0"]
    assert excerpt["runner"] == ["(EngineCore pid=2) INFO [gpu_worker.py:378] Using V2 Model Runner"]
    assert excerpt["drafter"][0].endswith("(1, 2, 3)")
    assert excerpt["spec_decode"][0].endswith("3.00")
    assert not any("GET /health" in line for line in excerpt["tail"])


# ---------------------------------------------------------------------------------------- make_release


def fake_tree(site: Path, version: str = "1.2.3", sha: str = "ab" * 32) -> Path:
    package = site / "vllm"
    (package / "entrypoints" / "cli").mkdir(parents=True)
    for init in (package, package / "entrypoints", package / "entrypoints" / "cli"):
        (init / "__init__.py").write_text("")
    (package / "_version.py").write_text(
        f"__version__ = version = '{version}'\n__commit_id__ = commit_id = 'gffd46bfab'\n"
    )
    (package / "entrypoints" / "cli" / "main.py").write_text(
        "import sys\ndef main():\n    print('vllm main', sys.argv[1:], sys.executable)\n    return 0\n"
    )
    dist = site / f"vllm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (dist / "entry_points.txt").write_text("[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n")
    (dist / "direct_url.json").write_text(
        json.dumps({"archive_info": {"hashes": {"sha256": sha}}, "url": "file:///wheels/vllm.whl"})
    )
    return site


def test_make_release_builds_the_layout_vllm_build_would(tmp_path):
    site = fake_tree(tmp_path / "site")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "extra_mod.py").write_text("VALUE = 42\n")
    root = tmp_path / "opt" / "vllm"
    made = make_release.make_release(str(root), sys.executable, [str(site), str(extra)])
    assert made["changed"] is True
    assert made["name"] == "abababababab-abababab"  # the shape vllm_release knows
    release = root / "releases" / made["name"]
    manifest = json.loads((release / "manifest.json").read_text())
    assert manifest == made["manifest"]
    assert manifest["schema"] == 1
    assert manifest["commit"] is None
    assert manifest["scm_commit_prefix"] == "ffd46bfab"
    assert manifest["source"] == "wheel"
    assert manifest["wheel"] == {"path": "file:///wheels/vllm.whl", "sha256": "ab" * 32}
    assert manifest["inputs"]["site_dirs"] == [str(site), str(extra)]
    venv_python = release / "venv" / "bin" / "python"
    code = "import vllm, extra_mod; print(vllm.__file__, extra_mod.VALUE)"
    out = subprocess.run([str(venv_python), "-I", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(site / "vllm" / "__init__.py"), "42"]
    script = subprocess.run(
        [str(release / "venv" / "bin" / "vllm"), "serve", "--config", "x.yaml"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout
    assert script.strip() == f"vllm main ['serve', '--config', 'x.yaml'] {venv_python}"

    again = make_release.make_release(str(root), sys.executable, [str(site), str(extra)])
    assert again["changed"] is False
    assert again["manifest"] == manifest
    other = make_release.make_release(str(root), sys.executable, [str(site)])
    assert other["changed"] is True
    assert other["manifest"]["inputs"]["site_dirs"] == [str(site)]


def test_make_release_needs_a_wheel_install(tmp_path):
    site = fake_tree(tmp_path / "site")
    (site / "vllm-1.2.3.dist-info" / "direct_url.json").write_text(json.dumps({"url": "file:///src", "dir_info": {}}))
    with pytest.raises(make_release.ReleaseMakerError, match="records no wheel sha256"):
        make_release.make_release(str(tmp_path / "root"), sys.executable, [str(site)])
    with pytest.raises(make_release.ReleaseMakerError, match="no vllm package"):
        make_release.make_release(str(tmp_path / "root"), sys.executable, [str(tmp_path)])
    assert not (tmp_path / "root").exists()


def test_make_release_cli_prints_one_json_object(tmp_path):
    site = fake_tree(tmp_path / "site")
    result = subprocess.run(
        [sys.executable, str(HERE / "make_release.py"), "--root", str(tmp_path / "r"), "--python", sys.executable,
         f"--site={site}"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["name"] == "abababababab-abababab"
    bad = subprocess.run(
        [sys.executable, str(HERE / "make_release.py"), "--root", str(tmp_path / "r"), "--python", sys.executable,
         f"--site={tmp_path / 'absent'}"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 1
    assert json.loads(bad.stdout) == {"failed": True, "msg": f"--site {tmp_path / 'absent'} is not a directory"}


# ---------------------------------------------------------------------------------------- engine_death


@pytest.mark.slow
def test_engine_death_records_the_exit_status_and_what_each_restart_policy_does(tmp_path):
    """engine_death.py against the fixture engine (TEST EQUIPMENT, which dies as vLLM does): the API server
    exits 0 after its engine core is killed, which on-failure would not restart and always does."""
    port = free_port()
    engine_source = HERE.parent / "fixtures" / "engine"
    unit = write_unit(
        tmp_path,
        f"{sys.executable} -m vllm.entrypoints.cli.main serve tiny --host 127.0.0.1 --port {port} -tp 2",
        f"PYTHONPATH={engine_source}\nVLLM_FIXTURE_STEP_DELAY_S=0.05\n",
        extra="Restart=always\nKillMode=mixed",
    )
    log = tmp_path / "server.log"
    result = subprocess.run(
        [sys.executable, str(HERE / "engine_death.py"), str(unit), f"--log={log}",
         f"--health-url=http://127.0.0.1:{port}/health", "--model=tiny", "--timeout=60", f"--state-root={tmp_path}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    record = json.loads(result.stdout)
    assert result.returncode == 0, record
    assert record["exit_status"] == 0
    assert record["restarts_under"] == {"on-failure": False, "always": True}
    assert record["unit_restart"] == "always" and record["unit_would_restart"] is True
    assert record["engine_core"]["comm"] == "VLLM::EngineCor"
    assert len(record["workers"]) == 2
    request = record["request_in_flight"]
    assert request["in_flight_at_kill"] is True
    assert request["error_event"]["code"] == 500 and not request.get("finish_reason")  # cut, never finished
    assert 503 in [sample[1] for sample in record["health_after_kill"]]  # until the watchdog ends the server
    assert record["left_in_group"] == []
