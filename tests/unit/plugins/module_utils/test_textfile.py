# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The textfile core on a real gate report (the gate core run against the fake vLLM server)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _gate, _textfile
from prometheus_client.parser import text_string_to_metric_families

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "metrics"


def _fake_vllm():
    spec = importlib.util.spec_from_file_location("fake_vllm", FIXTURES / "fake_vllm.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_vllm"] = module
    spec.loader.exec_module(module)
    return module.FakeVLLM


@pytest.fixture(scope="module")
def report():
    with _fake_vllm()(accepted_pattern=(3, 2, 4)) as fake:
        outcome = _gate.run_gate(_gate.GateSettings(url=fake.url, model="tiny", requests=8, max_tokens=32))
    assert outcome.passed, outcome.message
    return outcome.report


def parse(text):
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_a_real_report_round_trips_through_the_exposition_parser(report):
    text = _textfile.render_gate(report, "default", release="3cfc8f8b7a1b-1a2b3c4d", labels={"cluster": "eu-1"})
    families = parse(text)
    common = {"vllm_instance": "default", "model_name": "tiny", "cluster": "eu-1"}
    (info,) = families["dflash_gate_info"]
    assert info.value == 1
    assert info.labels == {**common, "release": "3cfc8f8b7a1b-1a2b3c4d", "verdict": "pass", "workload_sha256": ""}
    (al,) = families["dflash_gate_mean_acceptance_length"]
    assert (al.labels, al.value) == (common, pytest.approx(report["mean_acceptance_length"]))
    low, high = report["mean_acceptance_length_ci95"]
    assert families["dflash_gate_mean_acceptance_length_ci95_low"][0].value == pytest.approx(low)
    assert families["dflash_gate_mean_acceptance_length_ci95_high"][0].value == pytest.approx(high)
    assert families["dflash_gate_min_mean_acceptance_length"][0].value == 2.0
    assert families["dflash_gate_alert_margin"][0].value == 0.5
    assert families["dflash_gate_passed"][0].value == 1
    assert families["dflash_gate_drafts"][0].value == report["drafts"]
    assert families["dflash_gate_tokens_per_second"][0].value == pytest.approx(report["tokens_per_second"])
    positions = {s.labels["position"]: s.value for s in families["dflash_gate_per_position_acceptance"]}
    assert positions == {str(i): pytest.approx(r) for i, r in enumerate(report["per_position_acceptance"])}
    assert families["dflash_gate_timestamp_seconds"][0].value == pytest.approx(_textfile._epoch(report["finished_at"]))
    assert set(families) == set(_textfile.METRIC_NAMES)
    for name in _textfile.METRIC_NAMES:
        assert f"# TYPE {name} gauge\n" in text


def test_the_registered_result_gives_the_same_file_as_its_report(report):
    registered = {name: report[name] for name in ("passed", "mean_acceptance_length", "drafts")}
    registered.update(changed=False, report=report, msg="...")
    assert _textfile.render_gate(registered, "a") == _textfile.render_gate(report, "a")


def test_workload_hash_and_release_come_from_the_report_when_present(report):
    newer = dict(report, workload_sha256="ab" * 32, release="r1")
    (info,) = parse(_textfile.render_gate(newer, "default"))["dflash_gate_info"]
    assert (info.labels["workload_sha256"], info.labels["release"]) == ("ab" * 32, "r1")
    (info,) = parse(_textfile.render_gate(newer, "default", release="r2"))["dflash_gate_info"]
    assert info.labels["release"] == "r2"


def test_label_values_are_escaped_per_the_exposition_format(report):
    nasty = 'a "quoted"\\path\nline'
    text = _textfile.render_gate(dict(report, metrics_model_name=nasty), "default")
    assert 'model_name="a \\"quoted\\"\\\\path\\nline"' in text
    (al,) = parse(text)["dflash_gate_mean_acceptance_length"]
    assert al.labels["model_name"] == nasty
    assert _textfile.escape_help("a\\b\nc") == "a\\\\b\\nc"


def test_a_failed_verdict_is_written_as_failed(report):
    families = parse(_textfile.render_gate(dict(report, passed=False), "default"))
    assert families["dflash_gate_passed"][0].value == 0
    assert families["dflash_gate_info"][0].labels["verdict"] == "fail"


def test_missing_figures_are_left_out_not_zero(report):
    sparse = dict(report, tokens_per_second=None, mean_acceptance_length_ci95=None, finished_at=None)
    families = parse(_textfile.render_gate(sparse, "default"))
    for name in ("tokens_per_second", "mean_acceptance_length_ci95_low", "timestamp_seconds"):
        assert f"dflash_gate_{name}" not in families
    assert "dflash_gate_mean_acceptance_length" in families


@pytest.mark.parametrize(
    ("change", "kwargs", "needle"),
    [
        ({"passed": None}, {}, "no verdict"),  # acceptance_gate's check-mode result
        ({"mean_acceptance_length": None}, {}, "no acceptance length"),
        ({"drafts": "many"}, {}, "drafts is 'many', not a number"),
        ({}, {"labels": {"0bad": "x"}}, "not a valid Prometheus label name"),
        ({}, {"labels": {"__name__": "x"}}, "not a valid Prometheus label name"),
        ({}, {"labels": {"release": "x"}}, "set by the metrics file itself"),
        ({}, {"alert_margin": -1.0}, "not a number >= 0"),
        ({}, {"alert_margin": float("nan")}, "not a number >= 0"),
        ({}, {"vllm_instance": ""}, "vllm_instance is empty"),
    ],
)
def test_bad_input_is_refused_with_the_fix(report, change, kwargs, needle):
    args = {"vllm_instance": "default", **kwargs}
    with pytest.raises(_textfile.TextfileError, match="Fix:") as caught:
        _textfile.render_gate(dict(report, **change), **args)
    assert needle in str(caught.value)


def test_numbers_use_the_exposition_spelling():
    samples = [("dflash_gate_drafts", (), float("inf")), ("dflash_gate_passed", (), float("nan"))]
    assert _textfile.render(samples).splitlines()[2] == "dflash_gate_passed NaN"
    assert "dflash_gate_drafts +Inf" in _textfile.render(samples)
    assert _textfile.render([]) == ""


def test_the_file_says_what_prometheus_clients_own_writer_says(report, tmp_path):
    """prometheus_client.write_to_textfile as the oracle: the same samples, the same families parsed back."""
    from prometheus_client import CollectorRegistry, write_to_textfile
    from prometheus_client.core import Metric

    labels = {"cluster": 'eu-1 "a"\\b\nc'}
    samples = _textfile.gate_samples(report, "default", release="r1", labels=labels)

    class Samples:
        def collect(self):
            for name, help_text in _textfile.FAMILIES:
                metric = Metric(name, help_text, "gauge")
                for sample_name, sample_labels, value in samples:
                    if sample_name == name:
                        metric.add_sample(name, dict(sample_labels), value)
                if metric.samples:
                    yield metric

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Samples())
    oracle = tmp_path / "oracle.prom"
    write_to_textfile(str(oracle), registry)
    ours = _textfile.render(samples)

    def described(text):
        return [(f.name, f.documentation, f.type, f.samples) for f in text_string_to_metric_families(text)]

    assert described(ours) == described(oracle.read_text())
    assert len(described(ours)) >= 8  # a real report fills most families
