# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the module as Ansible does (a subprocess reading its args file) against a fake vLLM server."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.plugins.modules import acceptance_gate
from ansible_collections.vllm_ops.dflash.tests.helpers import module_runner

ROOT = Path(__file__).resolve().parents[4]
FIXTURES = ROOT / "tests" / "unit" / "data" / "metrics"


def _load_fake():
    spec = importlib.util.spec_from_file_location("fake_vllm", FIXTURES / "fake_vllm.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_vllm"] = module
    spec.loader.exec_module(module)
    return module.FakeVLLM


FakeVLLM = _load_fake()


def run_module(tmp_path, check_mode=False, **args):
    result, proc = module_runner.run_module("acceptance_gate", tmp_path, args, check_mode=check_mode, timeout=60)
    return result, proc.stdout


def test_passing_gate_returns_figures_facts_and_writes_reports(tmp_path):
    report_path = tmp_path / "reports" / "gate.json"
    with FakeVLLM(accepted_pattern=(3, 2, 4), api_key="top-secret-key") as fake:
        result, raw = run_module(
            tmp_path, url=fake.url, model="tiny", api_key="top-secret-key", report_path=str(report_path)
        )
    assert result.get("failed") is not True, result.get("msg")
    assert result["passed"] is True and result["changed"] is True
    assert result["mean_acceptance_length"] == pytest.approx(4.0)
    assert result["per_position_acceptance"] == pytest.approx([1, 1, 2 / 3, 1 / 3, 0, 0, 0], abs=1e-6)
    assert (result["requests_ok"], result["requests_failed"]) == (24, 0)
    assert result["drafts"] == len(fake.drafts_accepted)
    for name in acceptance_gate.FIGURES:
        assert result[name] == result["report"][name]
    assert result["ansible_facts"]["dflash_gate"] == result["report"]
    assert json.loads(report_path.read_text()) == result["report"]
    assert stat.S_IMODE((tmp_path / "reports" / "gate.md").stat().st_mode) == 0o644
    assert "top-secret-key" not in raw
    assert "top-secret-key" not in report_path.read_text()


@pytest.mark.slow
def test_failed_verdict_fails_with_msg_and_all_figures(tmp_path):
    with FakeVLLM(accepted_pattern=(0,)) as fake:
        result = run_module(tmp_path, url=fake.url, model="tiny", report_path=str(tmp_path / "gate.json"))[0]
    assert result["failed"] is True and result["passed"] is False
    assert "mean acceptance length 1.00 (95% CI 1.00-1.00) < min_mean_acceptance_length 2.00" in result["msg"]
    assert result["mean_acceptance_length"] == 1.0 and result["drafts"] > 50
    assert result["report"]["verdict"] == "fail"
    assert "ansible_facts" not in result
    assert (tmp_path / "gate.md").read_text().startswith("# DFlash acceptance gate: FAILED")


def test_check_mode_sends_nothing_and_says_what_it_would_do(tmp_path):
    with FakeVLLM() as fake:
        result = run_module(tmp_path, check_mode=True, url=fake.url, model="tiny", report_path=str(tmp_path / "g"))[0]
    assert result["skipped"] is True and result["changed"] is False and result["passed"] is None
    assert (fake.requests, fake.metrics_scrapes) == ([], 0)
    assert list(tmp_path.iterdir()) == [tmp_path / "args.json"]
    check = result["check"]
    assert check["url"] == fake.url and check["model"] == "tiny"
    assert (check["workload"]["requests"], check["workload"]["concurrency"], check["workload"]["max_tokens"]) == (
        24,
        4,
        128,
    )
    # the deadline a real run would get: timeout * (ceil(24 / 4) + 3) + settle
    assert check["deadline"] == 60 * 9 + 5
    assert check["would_write"] == [str(tmp_path / "g"), str(tmp_path / "g.md")]
    assert result["msg"].startswith("check mode: would send 24 requests of the workload ")
    assert f"({result['workload_sha256']}) to {fake.url}, 4 at a time" in result["msg"]
    assert "mean acceptance length >= 2" in result["msg"] and "at least 50 drafts" in result["msg"]
    assert "no relative rule (no last good release (baseline_release) given)" in result["msg"]


def test_check_mode_predicts_the_workload_rules_and_files_of_a_real_run(tmp_path):
    results = tmp_path / "gate-results"
    results.mkdir()
    baseline = {"schema": 1, "release": "r1", "results": [{"passed": True, "mean_acceptance_length": 3.0}]}
    (results / "r1.json").write_text(json.dumps(baseline))
    before = (results / "r1.json").read_text()
    args = dict(model="tiny", workload=WORKLOAD, workload_source="mix.yml", results_dir=str(results), release="r2",
                baseline_release="r1", disabled_rules=["throughput"], min_draft_acceptance_rate=0.3)  # fmt: skip
    with FakeVLLM() as fake:
        planned = run_module(tmp_path, check_mode=True, url=fake.url + "/v1", **args)[0]
        validated = run_module(tmp_path, url=fake.url, validate_only=True, **args)[0]
    assert (fake.requests, fake.metrics_scrapes) == ([], 0)
    assert planned.get("failed") is not True, planned.get("msg")
    # the same workload hash a real run would report, and the url as the gate would send to it (no /v1)
    assert planned["workload_sha256"] == validated["workload_sha256"]
    assert planned["check"]["url"] == fake.url and planned["check"]["workload"]["source"] == "mix.yml"
    relative = planned["check"]["relative"]
    assert relative["baseline_found"] is True and relative["skipped"] is None
    assert relative["rules"] == ["acceptance_length", "position0", "greedy_outputs"]
    assert "relative rules acceptance_length, position0, greedy_outputs against 'r1'" in planned["msg"]
    assert "draft acceptance rate >= 0.3" in planned["msg"]
    assert planned["check"]["would_write"] == [str(results / "r2.json")]
    assert sorted(p.name for p in results.iterdir()) == ["r1.json"] and (results / "r1.json").read_text() == before


def test_check_mode_names_a_missing_baseline_and_refuses_what_a_run_would_refuse(tmp_path):
    with FakeVLLM() as fake:
        args = dict(url=fake.url, model="tiny", results_dir=str(tmp_path / "none"), release="r2", baseline_release="r1")
        missing = run_module(tmp_path, check_mode=True, **args)[0]
        bad_options = run_module(tmp_path, check_mode=True, url=fake.url, model="tiny", requests=0)[0]
        (tmp_path / "r1.json").write_text("garbage")
        corrupt_args = {**args, "results_dir": str(tmp_path)}
        corrupt = run_module(tmp_path, check_mode=True, **corrupt_args)[0]
        bad_url = run_module(tmp_path, check_mode=True, url="ftp://host", model="tiny")[0]
    assert (fake.requests, fake.metrics_scrapes) == ([], 0)
    assert missing["skipped"] is True and missing["check"]["relative"]["baseline_found"] is False
    assert "no passed result of the last good release 'r1'" in missing["msg"]
    assert bad_options["failed"] is True and "requests must be at least 1" in bad_options["msg"]
    assert corrupt["failed"] is True and "r1.json" in corrupt["msg"] and "repair or remove" in corrupt["msg"]
    assert bad_url["failed"] is True and "is not an http(s) URL" in bad_url["msg"]
    assert not (tmp_path / "none").exists()


def test_unreachable_server_fails_with_the_url_and_the_fix(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    result = run_module(tmp_path, url=url, model="tiny", timeout=5)[0]
    assert result["failed"] is True and result["passed"] is False
    assert result["msg"].startswith(f"connection refused by {url}/metrics")
    assert "start the vLLM service" in result["msg"]


def test_argument_spec_matches_the_documentation():
    options = yaml.safe_load(acceptance_gate.DOCUMENTATION)["options"]
    assert set(options) == set(acceptance_gate.ARGUMENT_SPEC)
    for name, spec in acceptance_gate.ARGUMENT_SPEC.items():
        documented = options[name]
        assert documented["type"] == spec["type"], name
        assert documented.get("default") == spec.get("default"), name
        assert documented.get("required", False) == spec.get("required", False), name
        assert documented.get("elements") == spec.get("elements"), name
    assert acceptance_gate.ARGUMENT_SPEC["api_key"]["no_log"] is True
    returned = yaml.safe_load(acceptance_gate.RETURN)
    assert set(acceptance_gate.FIGURES) | {"passed", "report"} <= set(returned)


ENGINE_SOURCE = ROOT / "tests" / "fixtures" / "engine"


@pytest.fixture
def fixture_engine(tmp_path):
    """`vllm serve` of the fixture engine (branch `engine`), run from a copy of its source tree."""
    if not (ENGINE_SOURCE / "vllm" / "entrypoints" / "cli" / "main.py").exists():
        pytest.skip("the fixture engine (tests/fixtures/engine) is not in this checkout")
    source = tmp_path / "engine"
    shutil.copytree(ENGINE_SOURCE, source, ignore=shutil.ignore_patterns("__pycache__", "*.so", "build"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    speculative = {
        "method": "dflash",
        "model": "z-lab/tiny-DFlash",
        "num_speculative_tokens": 7,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 3.0,
    }
    command = [sys.executable, "-W", "ignore", "-m", "vllm.entrypoints.cli.main", "serve", "tiny"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--api-key", "engine-key"]
    command += ["--speculative-config", json.dumps(speculative)]
    env = dict(os.environ, PYTHONPATH=str(source), VLLM_FIXTURE_STEP_DELAY_S="0")
    with subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as server:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            health = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            try:
                health.request("GET", "/health")
                if health.getresponse().status == 200:
                    break
            except (OSError, http.client.HTTPException):
                if server.poll() is not None or time.monotonic() > deadline:
                    server.kill()
                    pytest.fail(f"the fixture engine did not start: {server.stderr.read()[-2000:]}")
                time.sleep(0.1)
            finally:
                health.close()
        try:
            yield url
        finally:
            server.terminate()
            server.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.engine
def test_gate_against_the_fixture_engine(tmp_path, fixture_engine):
    result = run_module(tmp_path, url=fixture_engine, model="tiny", api_key="engine-key", max_tokens=64)[0]
    assert result.get("failed") is not True, result.get("msg")
    # synthetic_acceptance_length 3.0 with 7 tokens: vLLM 0.26.0 printed exactly this on an H200
    assert result["mean_acceptance_length"] == pytest.approx(3.0)
    assert result["mean_acceptance_length_ci95"] == pytest.approx([3.0, 3.0])
    assert result["per_position_acceptance"] == pytest.approx([1, 1, 0, 0, 0, 0, 0])
    assert result["draft_acceptance_rate"] == pytest.approx(2 / 7)
    assert result["drafts"] == 24 * 21  # ceil((64 - 1) / 3) drafts per request


def test_a_password_in_the_url_is_refused_and_masked_everywhere(tmp_path):
    result, raw = run_module(tmp_path, url="http://gate:pw-9f8e7d@127.0.0.1:1", model="tiny")
    assert result["failed"] is True
    assert "carries credentials (user:password@)" in result["msg"] and "api_key" in result["msg"]
    assert "pw-9f8e7d" not in raw  # invocation.module_args included


@pytest.mark.slow
def test_the_deadline_option_reaches_the_gate(tmp_path):
    with FakeVLLM(response_delay=3.0) as fake:
        result = run_module(tmp_path, url=fake.url, model="tiny", requests=2, timeout=30, deadline=1)[0]
    assert result["failed"] is True
    assert "deadline of 1 s" in result["msg"] or "deadline of 1 s" in json.dumps(result.get("report", {}))


def test_num_speculative_tokens_reaches_the_gate(tmp_path):
    # Case 7: the fake serves K = 7 positions; a deploy of K = 15 must not be judged on them.
    with FakeVLLM(accepted_pattern=(2,)) as fake:
        wrong = run_module(tmp_path, url=fake.url, model="tiny", requests=2, min_drafts=1, num_speculative_tokens=15)[0]
        right = run_module(tmp_path, url=fake.url, model="tiny", requests=2, min_drafts=1, num_speculative_tokens=7)[0]
    assert wrong["failed"] is True and "has 7 positions, but the server runs num_speculative_tokens 15" in wrong["msg"]
    assert right["passed"] is True, right.get("msg")


WORKLOAD = {"name": "mix", "max_tokens": 32, "requests": 6, "prompts": [
    {"id": "code", "prompt": "def merge(a, b):"},
    {"id": "chat", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": False}},
]}  # fmt: skip


@pytest.mark.slow
def test_results_are_kept_and_the_next_release_is_judged_against_the_last_good(tmp_path):
    results = tmp_path / "gate-results"
    common = dict(model="tiny", workload=WORKLOAD, workload_source="mix.yml", results_dir=str(results),
                  min_drafts=1, disabled_rules=["throughput"], identity={"target_model": "tiny"})  # fmt: skip
    with FakeVLLM(accepted_pattern=(2, 2, 3, 2, 2)) as fake:
        first = run_module(tmp_path, url=fake.url, release="r1", **common)[0]
    assert first["passed"] is True and first["changed"] is True, first.get("msg")
    assert first["results_path"] == str(results / "r1.json")
    assert "no last good release" in first["relative"]["skipped"] and "relative rules skipped" in first["msg"]
    kept = json.loads((results / "r1.json").read_text())["results"]
    assert kept[-1]["workload"]["sha256"] == first["report"]["workload"]["sha256"]
    with FakeVLLM(accepted_pattern=(2, 1, 2, 2, 1, 2, 2, 2, 1, 2)) as fake:
        second = run_module(tmp_path, url=fake.url, release="r2", baseline_release="r1", **common)[0]
    assert second["failed"] is True and second["passed"] is False
    assert "relative rule acceptance_length" in second["msg"] and "of the last good release r1" in second["msg"]
    assert second["summary"].startswith("release r2 ") and "verdict FAIL" in second["summary"]
    # the failed result is kept too, beside r1's
    assert json.loads((results / "r2.json").read_text())["results"][-1]["passed"] is False


@pytest.mark.slow
def test_an_invalid_workload_fails_before_any_traffic_and_validate_only_checks_it(tmp_path):
    bad = dict(WORKLOAD, prompts=[{"id": "x"}])
    with FakeVLLM() as fake:
        result = run_module(tmp_path, url=fake.url, model="tiny", workload=bad, workload_source="mine.yml")[0]
        ok = run_module(tmp_path, url=fake.url, model="tiny", workload=WORKLOAD, validate_only=True)[0]
    assert result["failed"] is True and "invalid gate workload mine.yml" in result["msg"] and "Fix:" in result["msg"]
    assert ok.get("failed") is not True and len(ok["workload_sha256"]) == 64
    assert fake.requests == [] and fake.metrics_scrapes == 0


def test_a_corrupt_last_good_result_is_refused_not_skipped(tmp_path):
    (tmp_path / "r1.json").write_text("garbage")
    with FakeVLLM() as fake:
        args = dict(url=fake.url, model="tiny", results_dir=str(tmp_path), release="r2", baseline_release="r1")
        result = run_module(tmp_path, **args)[0]
    assert result["failed"] is True and "r1.json" in result["msg"] and "repair or remove" in result["msg"]
    assert fake.requests == []
