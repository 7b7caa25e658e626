"""The deploy's first look against a real release (tiny repo, real pip build), real files, a real HTTP
server and a stand-in `systemctl` on PATH."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build import BuildOptions, build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._drift import (
    DriftError,
    FileExpectation,
    detect_drift,
    health,
    recorded_differences,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._lock import host_lock
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import run_action
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import add_commit, make_tiny_repo, wheelhouse

CONFIG = "model: /srv/models/tiny\nport: 8000\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A tiny repo and a root with one release of main, built once for the module."""
    house = wheelhouse()
    if house is None:
        pytest.skip("could not download setuptools/setuptools-scm from PyPI into .cache/wheelhouse")
    base = tmp_path_factory.mktemp("drift")
    repo = base / "repo"
    make_tiny_repo(repo)
    pip_args = ["--no-index", "--find-links", str(house)]
    template = base / "root-template"
    opts = BuildOptions(str(repo), "main", root=str(template), python=sys.executable, pip_args=pip_args)
    result = build(opts)
    return repo, template, pip_args, result["release_name"]


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def systemctl(tmp_path, monkeypatch):
    """A `systemctl` whose is-enabled answer the test sets (written to a file it reads)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    answer = tmp_path / "is-enabled"
    answer.write_text("enabled")
    script = bin_dir / "systemctl"
    script.write_text(f'#!/bin/sh\n[ "$1" = is-enabled ] || exit 2\ncat {answer}\n[ "$(cat {answer})" = enabled ]\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return answer


@pytest.fixture
def deployed(built, tmp_path, server, systemctl):
    """A host as a passed deploy leaves it: the release current and good, the config file in place."""
    repo, template, pip_args, name = built
    root = tmp_path / "opt-vllm"
    shutil.copytree(template, root, symlinks=True)
    run_action(str(root), "activate", release=name)
    run_action(str(root), "mark_good")
    config = tmp_path / "etc" / "default.yaml"
    config.parent.mkdir()
    config.write_text(CONFIG)
    config.chmod(0o644)
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    expected = {
        "path": str(config),
        "sha256": hashlib.sha256(CONFIG.encode()).hexdigest(),
        "mode": "0644",
        "owner": user,
    }
    opts = BuildOptions(str(repo), "main", root=str(root), python=sys.executable, pip_args=pip_args)
    return {
        "opts": opts,
        "root": root,
        "name": name,
        "config": config,
        "expected": expected,
        "health": f"{server}/health",
        "systemctl": systemctl,
        "repo": repo,
    }


def _look(d, **overrides):
    kwargs = {
        "files": [FileExpectation.from_dict(d["expected"])],
        "health_url": d["health"],
        "unit": "vllm-default.service",
    }
    kwargs.update(overrides)
    return detect_drift(d["opts"], **kwargs)


def _tree(root: Path) -> list:
    # Not the host lock: taking it records the holder's pid (runtime coordination, not managed state).
    return sorted((str(p.relative_to(root)), p.lstat().st_mtime_ns) for p in root.rglob("*") if p.name != ".lock")


@pytest.mark.slow_build
def test_a_deployed_host_is_unchanged_and_nothing_is_written(deployed):
    before = _tree(deployed["root"])
    result = _look(deployed)
    assert result["unchanged"] is True, result["reasons"]
    assert result["reasons"] == [] and result["msg"] == "nothing would change"
    assert (result["current"], result["release_name"], result["current_status"]) == (
        deployed["name"],
        deployed["name"],
        "good",
    )
    assert result["release_exists"] and result["healthy"] and result["unit_as_expected"]
    assert result["files"] == [{"path": str(deployed["config"]), "changed": False, "reason": None}]
    assert result["changed"] is False
    assert _tree(deployed["root"]) == before


@pytest.mark.slow_build
@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda d: d["config"].write_text(CONFIG + "max-model-len: 4096\n"), "has other content"),
        (lambda d: d["config"].chmod(0o600), "has mode 0600, not 0644"),
        (lambda d: d["config"].unlink(), "does not exist"),
        (lambda d: d["systemctl"].write_text("disabled"), "vllm-default.service is disabled, not enabled"),
        (lambda d: run_action(str(d["root"]), "mark_failed", reason="gate"), "serves but is failed, not good"),
    ],
    ids=["content", "mode", "missing", "unit-disabled", "release-failed"],
)
def test_each_difference_is_a_reason(deployed, change, needle):
    change(deployed)
    result = _look(deployed)
    assert result["unchanged"] is False
    assert any(needle in reason for reason in result["reasons"]), result["reasons"]
    assert needle in result["msg"]


@pytest.mark.slow_build
def test_a_release_activated_but_not_gated_is_a_reason(built, deployed, tmp_path):
    root = tmp_path / "not-gated"
    shutil.copytree(built[1], root, symlinks=True)
    run_action(str(root), "activate", release=deployed["name"])  # a deploy that stopped before its gate
    deployed["opts"].root = str(root)
    result = _look(deployed)
    assert f"{deployed['name']} serves but is active, not good" in result["reasons"]


@pytest.mark.slow_build
def test_a_bumped_branch_is_a_release_not_built_here(deployed):
    add_commit(deployed["repo"], "main", "drift-bump")
    try:
        result = _look(deployed)
    finally:
        subprocess.run(["git", "-C", str(deployed["repo"]), "reset", "-q", "--hard", "HEAD~1"], check=True)
    assert result["unchanged"] is False
    assert result["release_exists"] is False and result["release_name"] != deployed["name"]
    assert result["current"] == deployed["name"]
    assert "is not built here" in result["reasons"][0]


@pytest.mark.slow_build
def test_another_release_serving_is_a_reason(deployed):
    other = BuildOptions(
        deployed["opts"].repo, "v1.0.0", root=str(deployed["root"]), python=sys.executable,
        pip_args=deployed["opts"].pip_args,
    )  # fmt: skip
    build(other)
    other_name = detect_drift(other)["release_name"]
    run_action(str(deployed["root"]), "activate", release=other_name)
    result = _look(deployed)
    assert f"{deployed['name']} is built but {other_name} serves" in result["reasons"]


@pytest.mark.slow_build
def test_health_and_unit_expectations(deployed, server):
    down = _look(deployed, health_url=f"{server}/not-health")
    assert down["healthy"] is False and any("answered 503" in r for r in down["reasons"])
    refused = _look(deployed, health_url="http://127.0.0.1:9/health")
    assert any("does not answer" in r for r in refused["reasons"])
    # a unit the deploy leaves disabled must be disabled
    assert any("is enabled, not disabled" in r for r in _look(deployed, unit_enabled=False)["reasons"])
    deployed["systemctl"].write_text("disabled")
    assert _look(deployed, unit_enabled=False)["unchanged"] is True


@pytest.mark.slow_build
def test_a_held_lock_counts_as_changed_instead_of_waiting(deployed):
    with host_lock(str(deployed["root"]), 5):
        result = _look(deployed, lock_timeout=0.2)
    assert result["unchanged"] is False
    assert any("cannot be read now" in reason for reason in result["reasons"])


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ({"path": "etc/x", "sha256": "0" * 64}, "is not absolute"),
        ({"path": "/etc/x", "sha256": "abc"}, "is not 64 hex digits"),
        ({"path": "/etc/x", "sha256": "0" * 64, "mode": "u+rw"}, "must be octal digits"),
        ({"path": "/etc/x", "sha256": "0" * 64, "mode": "0689"}, "must be octal digits"),
    ],
)
def test_bad_file_expectations_are_refused(item, needle):
    with pytest.raises(DriftError, match=needle):
        FileExpectation.from_dict(item)


@pytest.mark.slow_build
def test_a_recorded_input_changed_in_place_is_a_reason(deployed, tmp_path):
    drafter = tmp_path / "drafter-config.json"
    drafter.write_text('{"architectures": ["DFlashDraftModel"]}')
    record = tmp_path / "default.drafter.json"
    digest = hashlib.sha256(drafter.read_bytes()).hexdigest()
    record.write_text(json.dumps({"files": {str(drafter): digest}}))
    assert _look(deployed, recorded_inputs=[str(record)])["unchanged"] is True
    drafter.write_text('{"architectures": ["DFlashDraftModel"], "layer_types": ["sliding_attention"]}')
    result = _look(deployed, recorded_inputs=[str(record)])
    assert result["reasons"] == [f"{drafter} changed since it was recorded in {record}"]


def test_records(tmp_path):
    record = tmp_path / "record.json"
    assert recorded_differences(str(record)) == []  # nothing recorded yet: no difference
    record.write_text(json.dumps({"files": {str(tmp_path / "gone.json"): "0" * 64}}))
    assert recorded_differences(str(record)) == [f"{tmp_path / 'gone.json'} (recorded in {record}) is gone"]
    record.write_text("{not json")
    assert "cannot be read" in recorded_differences(str(record))[0]
    record.write_text("[]")
    assert "does not hold a files map" in recorded_differences(str(record))[0]


# The deploy's look renders the serve config on the controller from the UN-normalised speculative config
# (normalising needs the host's drafter and release); dflash_config writes the normalised one, for example
# with num_speculative_tokens filled in. The host's render record maps the one to the other.
UNNORMALISED = "speculative-config:\n  method: dflash\n  model: /m\n"
WRITTEN = "speculative-config:\n  method: dflash\n  model: /m\n  num_speculative_tokens: 7\n"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def rendered(tmp_path):
    """The serve config as dflash_config wrote it, its render record, and the look's expectation of it."""
    config = tmp_path / "default.yaml"
    config.write_text(WRITTEN)
    record = tmp_path / "default.render.json"
    inputs = _sha(UNNORMALISED + "drafter-dict-if-any")
    record.write_text(json.dumps({"path": str(config), "input_sha256": inputs, "sha256": _sha(WRITTEN)}))
    item = {"path": str(config), "sha256": _sha(UNNORMALISED), "input_sha256": inputs, "input_record": str(record)}
    return config, record, item


def test_a_normalised_config_written_from_the_same_input_is_unchanged(rendered):
    config, _record, item = rendered
    assert FileExpectation.from_dict(item).difference() is None
    # without the record's word for it, the look cannot tell: other content
    plain = {key: item[key] for key in ("path", "sha256")}
    assert FileExpectation.from_dict(plain).difference() == f"{config} has other content"


def test_the_render_record_does_not_cover_an_edit_or_another_input(rendered):
    config, record, item = rendered
    config.write_text(WRITTEN + "# edited by hand\n")
    assert FileExpectation.from_dict(item).difference() == f"{config} has other content"
    config.write_text(WRITTEN)
    assert FileExpectation.from_dict(dict(item, input_sha256=_sha("other input"))).difference() == (
        f"{config} has other content"
    )
    for broken in ("{not json", "[]", json.dumps({"input_sha256": item["input_sha256"]})):
        record.write_text(broken)
        assert FileExpectation.from_dict(item).difference() == f"{config} has other content"
    record.unlink()
    assert FileExpectation.from_dict(item).difference() == f"{config} has other content"


def test_the_render_record_needs_an_absolute_path_and_its_input():
    item = {"path": "/etc/x", "sha256": "0" * 64, "input_sha256": "1" * 64, "input_record": "r"}
    with pytest.raises(DriftError, match=r"input_record .* is not absolute"):
        FileExpectation.from_dict(item)
    with pytest.raises(DriftError, match="needs both input_sha256 and input_record"):
        FileExpectation.from_dict(dict(item, input_record=None))
    with pytest.raises(DriftError, match="input_sha256 of /etc/x is not 64 hex digits"):
        FileExpectation.from_dict(dict(item, input_sha256="abc", input_record="/r"))


@pytest.mark.slow_build
def test_a_server_that_runs_another_release_than_current_is_a_reason(deployed, tmp_path, monkeypatch):
    """Issue 28 case 12: the look read `current` and said "nothing would change" while the server's process
    ran another release (started before a swap). The stand-in server is a real process with the unit's
    command line (a script run through its shebang: `/bin/sh <root>/releases/<other>/venv/bin/vllm serve`)."""
    other = "0123456789ab-cdef0123"
    launcher = deployed["root"] / "releases" / other / "venv" / "bin" / "vllm"
    launcher.parent.mkdir(parents=True)
    launcher.write_text("#!/bin/sh\nsleep 300\n")
    launcher.chmod(0o755)
    running = subprocess.Popen([str(launcher), "serve", "--config", "x"])
    try:
        bin_dir = tmp_path / "bin-mainpid"
        bin_dir.mkdir()
        script = bin_dir / "systemctl"
        answer = '#!/bin/sh\ncase "$1" in is-enabled) echo enabled ;; show) echo {pid} ;; *) exit 2 ;; esac\n'
        script.write_text(answer.format(pid=running.pid))
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        result = _look(deployed)
        assert not result["unchanged"], result
        assert any(f"runs {other}, not {deployed['name']}" in reason for reason in result["reasons"]), result
        script.write_text(answer.format(pid=0))  # no main process: the health check speaks for it
        assert _look(deployed)["unchanged"], _look(deployed)["reasons"]
    finally:
        running.kill()
        running.wait()


class _RedirectingHealth(http.server.BaseHTTPRequestHandler):
    """/health sends the look elsewhere; /elsewhere answers 200 (what a followed redirect would report)."""

    def do_GET(self):
        if self.path == "/health":
            self.send_response(302)
            self.send_header("Location", "/elsewhere")
            self.end_headers()
        else:
            self.send_response(200)
            self.end_headers()

    def log_message(self, *args):
        pass


def test_a_redirected_health_is_not_this_servers_health():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RedirectingHealth)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        assert health(f"{base}/health") == f"{base}/health answered 302"
        assert health(f"{base}/elsewhere") is None
    finally:
        httpd.shutdown()
        httpd.server_close()
