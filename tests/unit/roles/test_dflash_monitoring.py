# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""dflash_monitoring's shipped files: the rules (promtool), the dashboard, and the names they share
with vLLM's real /metrics page and with the textfile core."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _textfile

ROOT = Path(__file__).resolve().parents[3]
FILES = ROOT / "roles" / "dflash_monitoring" / "files"
RULES = FILES / "dflash-alerts.rules.yml"
DASHBOARD = FILES / "dflash-dashboard.json"
RULE_TESTS = ROOT / "tests" / "unit" / "data" / "prometheus" / "dflash-alerts.test.yml"
VLLM_PAGE = ROOT / "tests" / "unit" / "data" / "metrics" / "synth.metrics.txt"  # real vLLM 0.26.0
# Series names of the two sources and of the recording rules: vllm:... and dflash_gate_... / dflash:...
NAME = re.compile(r"(?<![\w:$])(vllm:[a-z_:]+|dflash_gate_[a-z0-9_]+|dflash:[a-z0-9_:]+)")
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing (apt prometheus)")


def vllm_names():
    return {line.split("{")[0].split()[0] for line in VLLM_PAGE.read_text().splitlines() if line.startswith("vllm:")}


def rules():
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def recorded():
    return {rule["record"] for rule in rules() if "record" in rule}


def dashboard_exprs():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def promtool(*args, cwd=None):
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False)


@needs_promtool
def test_rules_pass_promtool_check_and_the_recorded_series_tests():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_is_tested_firing():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {case["alertname"] for group in tests for case in group.get("alert_rule_test", ()) if case["exp_alerts"]}
    assert fired == {rule["alert"] for rule in rules() if "alert" in rule}


def test_rules_read_names_that_vllm_and_the_textfile_core_write():
    exprs = " ".join(rule["expr"] for rule in rules())
    names = set(NAME.findall(exprs))
    assert {"vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total"} <= names
    unknown = names - vllm_names() - set(_textfile.METRIC_NAMES) - recorded()
    assert not unknown, f"the rules read series nobody writes: {sorted(unknown)}"


def test_the_recorded_gate_series_have_the_labels_the_core_writes():
    report = {
        "passed": True,
        "mean_acceptance_length": 3.0,
        "metrics_model_name": "qwen36",
        "thresholds": {"min_mean_acceptance_length": 2.0},
    }
    written = {sample[0]: {pair[0] for pair in sample[1]} for sample in _textfile.gate_samples(report, "default")}
    series = [s["series"] for group in yaml.safe_load(RULE_TESTS.read_text())["tests"] for s in group["input_series"]]
    gate_series = [s for s in series if s.startswith("dflash_gate_")]
    assert gate_series
    for text in gate_series:
        name, labels = text.rstrip("}").split("{")
        keys = {pair.split("=")[0] for pair in labels.split(",")}
        assert keys == written[name] | {"instance", "job"}, text  # + what Prometheus adds on scrape


def test_dashboard_is_json_that_shows_the_three_figures():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in panels)
    names = set(NAME.findall(" ".join(dashboard_exprs())))
    assert {
        "vllm:spec_decode_num_accepted_tokens_total",  # acceptance length
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",  # per position
        "vllm:generation_tokens_total",  # tokens/s
        "dflash_gate_mean_acceptance_length",
        "dflash_gate_per_position_acceptance",
        "dflash_gate_tokens_per_second",
    } <= names
    unknown = names - vllm_names() - set(_textfile.METRIC_NAMES)
    assert not unknown, f"the dashboard reads series nobody writes: {sorted(unknown)}"


@needs_promtool
def test_dashboard_queries_parse_as_promql(tmp_path):
    # promtool parses every expr of a rules file: the dashboard's, with Grafana's variables filled in.
    exprs = [e.replace("$__rate_interval", "5m").replace("$host", "gpu1") for e in dashboard_exprs()]
    group = {"name": "dashboard", "rules": [{"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
def test_rendered_textfile_passes_promtool_check_metrics():
    report = {
        "passed": True,
        "mean_acceptance_length": 2.9953,
        "mean_acceptance_length_ci95": [2.8628, 3.1279],
        "metrics_model_name": 'qwen "36"',
        "thresholds": {"min_mean_acceptance_length": 2.0},
        "per_position_acceptance": [0.79, 0.61],
        "drafts": 429,
        "tokens_per_second": 412.5,
        "finished_at": "2026-12-01T10:00:00Z",
    }
    text = _textfile.render_gate(report, "default", release="r1", labels={"cluster": "eu\\1"})
    checked = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _fake_vllm():
    spec = importlib.util.spec_from_file_location(
        "fake_vllm", ROOT / "tests" / "unit" / "data" / "metrics" / "fake_vllm.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_vllm"] = module
    spec.loader.exec_module(module)
    return module.FakeVLLM


def run_playbook(tmp_path, url, *extra):
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Gate",
                            "vllm_ops.dflash.acceptance_gate": {"url": url, "model": "tiny", "requests": 8},
                        },
                        {
                            "name": "Publish",
                            "ansible.builtin.include_role": {"name": "vllm_ops.dflash.dflash_monitoring"},
                        },
                    ],
                }
            ]
        )
    )
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "ac"), ANSIBLE_NOCOLOR="1")
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i", "localhost,", "-c", "local",
        "-e", f"ansible_python_interpreter={sys.executable}",
        "-e", f"vllm_root={tmp_path / 'vllm'}",
        "-e", f"dflash_monitoring_textfile_dir={tmp_path / 'textfile'}",
        *extra, str(playbook),
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)


@pytest.mark.slow
def test_the_role_publishes_the_fact_a_passed_gate_left(tmp_path):
    with _fake_vllm()(accepted_pattern=(3, 2, 4)) as fake:
        done = run_playbook(tmp_path, fake.url, "-e", '{"dflash_monitoring_labels": {"cluster": "eu-1"}}')
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        text = (tmp_path / "textfile" / "vllm-default.prom").read_text()
        assert (
            'dflash_gate_mean_acceptance_length{vllm_instance="default",model_name="tiny",cluster="eu-1"} 4.0' in text
        )
        assert 'verdict="pass"' in text
        (tmp_path / "check").mkdir()
        checked = run_playbook(tmp_path / "check", fake.url, "--check")
    assert checked.returncode == 0, checked.stdout[-3000:]
    assert not (tmp_path / "check" / "textfile").exists()  # check mode: the gate measured nothing


@pytest.mark.slow
@needs_promtool
@pytest.mark.skipif(os.geteuid() != 0, reason="the server entry point installs files owned by root")
def test_the_server_entry_point_installs_the_validated_rules_and_the_dashboard(tmp_path):
    playbook = tmp_path / "server.yml"
    task = {"ansible.builtin.include_role": {"name": "vllm_ops.dflash.dflash_monitoring", "tasks_from": "server"}}
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "ac"), ANSIBLE_NOCOLOR="1")
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i", "localhost,", "-c", "local",
        "-e", f"ansible_python_interpreter={sys.executable}",
        "-e", f"dflash_monitoring_rules_dir={tmp_path / 'rules'}",
        "-e", f"dflash_monitoring_dashboard_dir={tmp_path / 'dashboards'}",
        str(playbook),
    ]  # fmt: skip
    (tmp_path / "rules").mkdir()
    (tmp_path / "dashboards").mkdir()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert (tmp_path / "rules" / "dflash-alerts.rules.yml").read_text() == RULES.read_text()
    assert (tmp_path / "dashboards" / "vllm-dflash.json").read_text() == DASHBOARD.read_text()
    # A promtool that refuses the file keeps the old one (copy's validate).
    (tmp_path / "rules" / "dflash-alerts.rules.yml").write_text("# the old rules\n")
    refused = subprocess.run([*argv[:-1], "-e", "dflash_monitoring_promtool=false", argv[-1]],
                             capture_output=True, text=True, env=env, timeout=300, check=False)  # fmt: skip
    assert refused.returncode != 0
    assert (tmp_path / "rules" / "dflash-alerts.rules.yml").read_text() == "# the old rules\n"
