# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import collections
import importlib.util
import json
import math
import re
import socket
import stat
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _metrics, _metrics_parse
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate import GateError, GateSettings, evaluate, run_gate
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate_client import display_url
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate_report import (
    _bar,
    render_markdown,
    report_paths,
    write_reports,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._metrics import Z95, AcceptanceStats
from ansible_collections.vllm_ops.dflash.plugins.module_utils._prompts import DEFAULT_PROMPTS

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "metrics"


def _load_fake():
    spec = importlib.util.spec_from_file_location("fake_vllm", FIXTURES / "fake_vllm.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_vllm"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.FakeVLLM


FakeVLLM = _load_fake()


def settings(url, **overrides):
    values = dict(url=url, model="tiny", poll_interval=0.05, settle_seconds=3.0, timeout=5.0)
    values.update(overrides)
    return GateSettings(**values)


def free_port_url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --------------------------------------------------------------------------------------- end to end


def test_gate_passes_and_measures_what_the_server_did(tmp_path):
    # Two engines, an API key, and counters published 0.3 s after each response, as vLLM does asynchronously.
    with FakeVLLM(accepted_pattern=(3, 1, 0, 7, 2, 5), engines=2, api_key="s3cret", publish_delay=0.3) as fake:
        outcome = run_gate(settings(fake.url, api_key="s3cret"))
    truth = fake.drafts_accepted
    report = outcome.report
    assert outcome.passed and report["passed"] and report["verdict"] == "pass" and report["reasons"] == []
    assert report["drafts"] == len(truth)
    assert report["accepted_tokens"] == sum(truth)
    assert report["draft_tokens"] == 7 * len(truth)
    mean = 1 + statistics.mean(truth)
    half = Z95 * math.sqrt(statistics.variance(truth) / len(truth))
    assert report["mean_acceptance_length"] == pytest.approx(mean, abs=1e-6)
    assert report["mean_acceptance_length_ci95"] == pytest.approx([mean - half, mean + half], abs=1e-6)
    assert report["per_position_acceptance"] == pytest.approx(
        [sum(1 for a in truth if a > i) / len(truth) for i in range(7)], abs=1e-6
    )
    assert report["draft_acceptance_rate"] == pytest.approx(sum(truth) / (7 * len(truth)), abs=1e-6)
    assert (report["requests_ok"], report["requests_failed"]) == (24, 0)
    assert report["tokens_per_second"] > 0 and report["generation_tokens"] >= 24 * 128
    assert report["url"] == fake.url and report["metrics_model_name"] == "tiny"
    assert "passed" in outcome.message and f"{mean:.2f}" in outcome.message
    # the traffic: every request authorised, greedy, with the default prompts cycled twice
    assert all(r["authorization"] == "Bearer s3cret" for r in fake.requests)
    bodies = [r["body"] for r in fake.requests]
    assert {(b["temperature"], b["max_tokens"], b["model"]) for b in bodies} == {(0, 128, "tiny")}
    assert collections.Counter(b["prompt"] for b in bodies) == {p: 2 for p in DEFAULT_PROMPTS}
    assert "s3cret" not in json.dumps(report) + render_markdown(report)


def test_gate_without_prometheus_client_uses_the_stdlib_parser(monkeypatch):
    reports = []
    for available in (True, False):
        if not available:
            monkeypatch.setattr(_metrics_parse, "_prometheus_parser", None)
        with FakeVLLM(accepted_pattern=(4, 0, 2)) as fake:
            reports.append(run_gate(settings(fake.url)).report)
    assert [r["parser"] for r in reports] == ["prometheus_client", "stdlib"]
    figures = ("mean_acceptance_length", "mean_acceptance_length_ci95", "per_position_acceptance", "drafts")
    assert [reports[0][k] for k in figures] == [reports[1][k] for k in figures]


def test_without_settling_the_late_counters_are_missed():
    # Proves the settle loop above matters: read at once, the 0.4 s late counters are not there yet.
    with FakeVLLM(accepted_pattern=(2,), publish_delay=0.4) as fake:
        outcome = run_gate(settings(fake.url, settle_seconds=0, requests=4, min_drafts=0))
    assert outcome.report["drafts"] < len(fake.drafts_accepted)


def test_custom_prompts_are_cycled():
    with FakeVLLM() as fake:
        run_gate(settings(fake.url, prompts=["a", "b", "c"], requests=7, max_tokens=64, min_drafts=1))
    assert collections.Counter(r["body"]["prompt"] for r in fake.requests) == {"a": 3, "b": 2, "c": 2}


def test_low_acceptance_fails_with_figures_ci_and_threshold():
    with FakeVLLM(accepted_pattern=(0, 0, 1, 0, 0, 0)) as fake:
        outcome = run_gate(settings(fake.url))
    report = outcome.report
    assert not outcome.passed and report["verdict"] == "fail"
    low, high = report["mean_acceptance_length_ci95"]
    assert re.search(
        rf"mean acceptance length 1\.17 \(95% CI {low:.2f}-{high:.2f}\) < min_mean_acceptance_length 2\.00",
        outcome.message,
    )
    assert outcome.message.startswith(f"acceptance gate FAILED for tiny at {fake.url}: ")
    truth = fake.drafts_accepted
    assert report["per_position_acceptance"][:2] == pytest.approx([truth.count(1) / len(truth), 0], abs=1e-6)


def test_draft_acceptance_rate_threshold():
    with FakeVLLM(accepted_pattern=(2,)) as fake:
        outcome = run_gate(settings(fake.url, min_draft_acceptance_rate=0.5))
    assert not outcome.passed
    assert outcome.report["reasons"] == ["draft acceptance rate 0.286 < min_draft_acceptance_rate 0.500"]


def test_too_few_drafts_is_not_enough_evidence():
    with FakeVLLM(accepted_pattern=(2,)) as fake:
        outcome = run_gate(settings(fake.url, requests=2, max_tokens=9, min_drafts=50))
    assert outcome.report["drafts"] == 6
    assert outcome.report["reasons"] == ["not enough evidence: 6 drafts < min_drafts 50; raise requests/max_tokens"]


def test_missing_api_key_fails_every_request_and_names_the_fix():
    with FakeVLLM(api_key="s3cret") as fake:
        outcome = run_gate(settings(fake.url, requests=3, settle_seconds=0))
    report = outcome.report
    assert (report["requests_ok"], report["requests_failed"]) == (0, 3)
    assert report["errors"] == [
        {
            "error": f"HTTP 401 from {fake.url}/v1/completions: Unauthorized; the server requires an API key: "
            "set api_key to its --api-key (VLLM_API_KEY)",
            "count": 3,
        }
    ]
    assert report["reasons"][0].startswith("3 of 3 requests failed (most common: HTTP 401")
    assert fake.requests[0]["authorization"] is None


def test_wrong_api_key_is_rejected_and_never_reported(tmp_path):
    with FakeVLLM(api_key="s3cret") as fake:
        outcome = run_gate(settings(fake.url, api_key="wrong-key-123", requests=2, settle_seconds=0))
    assert "the api_key was rejected" in outcome.message
    write_reports(outcome.report, str(tmp_path / "gate.json"))
    for written in tmp_path.iterdir():
        assert "wrong-key-123" not in written.read_text()
    assert "wrong-key-123" not in outcome.message


def test_empty_completion_text_counts_as_failed():
    with FakeVLLM(empty_text=True) as fake:
        outcome = run_gate(settings(fake.url, requests=4))
    assert (outcome.report["requests_ok"], outcome.report["requests_failed"]) == (0, 4)
    assert "empty completion text" in outcome.report["reasons"][0]
    assert not outcome.passed


def test_unknown_model_is_reported_with_the_server_message():
    with FakeVLLM() as fake:
        outcome = run_gate(settings(fake.url, model="qwen", requests=2, settle_seconds=0))
    error = outcome.report["errors"][0]["error"]
    assert "HTTP 404" in error and "The model `qwen` does not exist." in error
    assert f"GET {fake.url}/v1/models" in error


def test_alias_model_reads_the_metrics_of_the_served_name():
    with FakeVLLM(aliases=("qwen-alias",)) as fake:
        outcome = run_gate(settings(fake.url, model="qwen-alias"))
    assert outcome.passed
    assert (outcome.report["model"], outcome.report["metrics_model_name"]) == ("qwen-alias", "tiny")


def test_server_without_speculative_decoding_fails_before_any_traffic():
    with FakeVLLM(speculative=False) as fake, pytest.raises(GateError) as error:
        run_gate(settings(fake.url))
    assert str(error.value).startswith(
        f"{fake.url}/metrics: no spec-decode counters: speculative decoding is not enabled on this server"
    )
    assert fake.requests == []


def test_connection_refused_names_the_url_and_the_fix():
    url = free_port_url()
    with pytest.raises(GateError) as error:
        run_gate(settings(url))
    assert str(error.value) == (
        f"connection refused by {url}/metrics: nothing listens there; start the vLLM service "
        "(systemctl start vllm-<instance>) or set url to the address it serves on"
    )


def test_slow_completions_time_out_with_a_clear_reason():
    with FakeVLLM(response_delay=1.0) as fake:
        outcome = run_gate(settings(fake.url, timeout=0.2, requests=2, settle_seconds=0))
    assert outcome.report["requests_failed"] == 2
    assert outcome.report["errors"][0]["error"].startswith(f"no answer from {fake.url}/v1/completions within 0.2 s")
    assert "raise timeout" in outcome.message


def test_server_restart_during_the_gate_is_a_clear_error():
    with FakeVLLM() as fake:
        assert run_gate(settings(fake.url)).passed  # traffic before: the counters are well above 0
        fake.restart_after = len(fake.requests) + 2
        # The new process start is seen first; a page without one still says "went down" (test_metrics.py).
        with pytest.raises(GateError, match=r"server restarted during the gate"):
            run_gate(settings(fake.url, requests=4))


@pytest.fixture(scope="module")
def self_signed_cert(tmp_path_factory):
    pem = tmp_path_factory.mktemp("tls") / "server.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-days",
            "1",
            "-keyout",
            str(pem),
            "-out",
            str(pem),
        ],
        check=True,
        capture_output=True,
    )
    return str(pem)


def test_untrusted_tls_certificate_names_validate_certs(self_signed_cert):
    with FakeVLLM(tls_cert=self_signed_cert) as fake, pytest.raises(GateError) as error:
        run_gate(settings(fake.url))
    assert fake.url.startswith("https://")
    assert str(error.value).startswith(f"TLS certificate of {fake.url}/metrics not trusted")
    assert str(error.value).endswith("set validate_certs: false")


def test_validate_certs_false_accepts_a_self_signed_server(self_signed_cert):
    with FakeVLLM(tls_cert=self_signed_cert) as fake:
        outcome = run_gate(settings(fake.url, validate_certs=False, requests=4, min_drafts=1))
    assert outcome.passed and outcome.report["requests_ok"] == 4


def test_openai_base_url_is_accepted():
    with FakeVLLM() as fake:
        outcome = run_gate(settings(fake.url + "/v1/", requests=4, min_drafts=1))
    assert outcome.passed and outcome.report["url"] == fake.url


@pytest.mark.parametrize(
    "overrides, problem",
    [
        ({"requests": 0}, "requests must be at least 1"),
        ({"concurrency": 0}, "concurrency must be at least 1"),
        ({"min_draft_acceptance_rate": 1.5}, "min_draft_acceptance_rate must be between 0 and 1"),
        ({"min_mean_acceptance_length": 0.5}, "min_mean_acceptance_length must be at least 1"),
        ({"model": ""}, "model is required"),
        ({"prompts": ["ok", ""]}, "prompts must be non-empty strings"),
        ({"url": "ftp://host/"}, "is not an http(s) URL"),
    ],
)
def test_invalid_options_are_refused_before_any_traffic(overrides, problem):
    values = {"url": free_port_url(), **overrides}
    with pytest.raises(GateError) as error:
        run_gate(settings(**values))
    assert problem in str(error.value)


def test_display_url_drops_credentials():
    assert display_url("https://user:pw@gpu1:8000/v1") == "https://gpu1:8000/v1"


# --------------------------------------------------------------------------------------------- verdicts


def stats(drafts=100, length=3.0, low=2.8, high=3.2, rate=0.4):
    return AcceptanceStats(
        drafts, drafts * 7, round((length - 1) * drafts), length, (low, high), rate, (0.9, 0.6, 0.5), "prefix"
    )


@pytest.mark.parametrize(
    "case, figures, failed, thresholds, reasons",
    [
        ("pass", stats(), 0, {}, []),
        ("pass at the threshold", stats(length=2.0), 0, {}, []),
        (
            "failed requests",
            stats(),
            2,
            {},
            ["2 of 24 requests failed (most common: boom)"],
        ),
        (
            "too few drafts",
            stats(drafts=49),
            0,
            {},
            ["not enough evidence: 49 drafts < min_drafts 50; raise requests/max_tokens"],
        ),
        (
            "no drafts even with min_drafts 0",
            AcceptanceStats(0, 0, 0, None, None, None, (), "none"),
            0,
            {"min_drafts": 0},
            [
                "not enough evidence: 0 drafts < min_drafts 1; raise requests/max_tokens (or check that the "
                "drafter proposes tokens for these prompts)"
            ],
        ),
        (
            "low acceptance length",
            stats(length=1.17, low=1.12, high=1.22),
            0,
            {},
            [
                "mean acceptance length 1.17 (95% CI 1.12-1.22) < min_mean_acceptance_length 2.00: the drafter's "
                "proposals are mostly rejected; check the drafter matches the target and this vLLM build "
                "(dflash_preflight, vllm_facts probes)"
            ],
        ),
        ("rate not checked when unset", stats(rate=0.01), 0, {}, []),
        (
            "low rate",
            stats(rate=0.2),
            0,
            {"min_draft_acceptance_rate": 0.25},
            ["draft acceptance rate 0.200 < min_draft_acceptance_rate 0.250"],
        ),
        (
            "failures and low length",
            stats(length=1.5),
            1,
            {"min_mean_acceptance_length": 1.6},
            ["1 of 24 requests failed (most common: boom)", "mean acceptance length 1.50"],
        ),
    ],
)
def test_verdict_table(case, figures, failed, thresholds, reasons):
    errors = collections.Counter({"boom": failed} if failed else {})
    found = evaluate(figures, 24, failed, errors, GateSettings(model="m", **thresholds))
    assert len(found) == len(reasons), case
    for got, expected in zip(found, reasons):
        assert got.startswith(expected), case


# ---------------------------------------------------------------------------------------------- reports


@pytest.fixture(scope="module")
def failed_report():
    with FakeVLLM(accepted_pattern=(1, 0, 0, 2), api_key="k") as fake:
        return run_gate(settings(fake.url, api_key="k", min_mean_acceptance_length=2.5)).report


def test_markdown_report_has_verdict_figures_and_bars(failed_report):
    text = render_markdown(failed_report)
    assert text.startswith("# DFlash acceptance gate: FAILED\n")
    assert f"- server: {failed_report['url']}\n" in text
    assert re.search(r"\| mean acceptance length \| 1\.75 \(95% CI [\d.]+-[\d.]+\) \| >= 2\.50 \|", text)
    assert "| drafts | " in text and "| failed requests | 0 of 24 | 0 |" in text
    bars = re.findall(r"^pos (\d) (.{30}) (\d\.\d\d)$", text, re.M)
    assert [(position, rate) for position, _cells, rate in bars] == [
        ("0", "0.50"),
        ("1", "0.25"),
        ("2", "0.00"),
        ("3", "0.00"),
        ("4", "0.00"),
        ("5", "0.00"),
        ("6", "0.00"),
    ]
    assert bars[0][1] == "█" * 15 + " " * 15
    assert "## Why it failed\n\n- mean acceptance length 1.75" in text


@pytest.mark.parametrize(
    "rate, expected",
    [(0.0, " " * 30), (1.0, "█" * 30), (0.5, "█" * 15 + " " * 15), (0.51, "█" * 15 + "▎" + " " * 14), (1.7, "█" * 30)],
)
def test_bar(rate, expected):
    assert _bar(rate) == expected


@pytest.mark.parametrize(
    "path, markdown",
    [("/r/gate.json", "/r/gate.md"), ("/r/gate", "/r/gate.md"), ("/r/gate.txt", "/r/gate.txt.md")],
)
def test_report_paths(path, markdown):
    assert report_paths(path) == (path, markdown)


def test_write_reports_atomically_and_reports_changes(tmp_path, failed_report):
    target = tmp_path / "new" / "dir" / "gate.json"
    assert write_reports(failed_report, str(target)) is True
    assert json.loads(target.read_text()) == failed_report
    assert (tmp_path / "new" / "dir" / "gate.md").read_text() == render_markdown(failed_report)
    for written in (target, tmp_path / "new" / "dir" / "gate.md"):
        assert stat.S_IMODE(written.stat().st_mode) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["gate.json", "gate.md"]  # no temporary left
    assert write_reports(failed_report, str(target)) is False
    assert write_reports(dict(failed_report, finished_at="2099-01-01T00:00:00Z"), str(target)) is True


def test_unwritable_report_path_names_the_fix(tmp_path, failed_report):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(GateError, match=r"cannot write the gate report to .*choose a writable report_path"):
        write_reports(failed_report, str(blocker / "gate.json"))


# ------------------------------------------------------------------------------- hostile servers (issue 14)


class HostileServer:
    """A server that answers /metrics with `pages` (one per scrape, the last repeated) and completions with
    `completion` (bytes); `drip` sends a body one byte at a time, without end, until the test is over."""

    def __init__(self, pages=(), completion=None, drip=None, metrics_stream=None):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.pages = [p.encode() if isinstance(p, str) else p for p in pages]
        self.completion = completion
        self.scrapes = 0
        self.stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _drip(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                while not outer.stop.wait(0.05):
                    self.wfile.write(b"#")
                    self.wfile.flush()

            def do_GET(self):
                if drip == "metrics":
                    return self._drip()
                if metrics_stream is not None:
                    self.send_response(200)
                    self.end_headers()
                    for chunk in metrics_stream():
                        self.wfile.write(chunk)
                    return None
                page = outer.pages[min(outer.scrapes, len(outer.pages) - 1)]
                outer.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return None

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if drip == "completions":
                    return self._drip()
                self.send_response(200)
                self.send_header("Content-Length", str(len(outer.completion)))
                self.end_headers()
                self.wfile.write(outer.completion)
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def spec_page(drafts, draft_tokens, accepted, per_position):
    block = sys.modules["fake_vllm"]._spec_block("0", "tiny", 0, 0, 0, per_position)
    # _spec_block formats ints as floats; put the (possibly impossible) values in as given.
    for name, value in (("drafts", drafts), ("draft_tokens", draft_tokens), ("accepted_tokens", accepted)):
        block = re.sub(
            rf'(vllm:spec_decode_num_{name}_total\{{engine="0",model_name="tiny"\}}) \S+', rf"\g<1> {value}", block
        )
    return block


GOOD_COMPLETION = json.dumps({"choices": [{"text": "ok"}], "usage": {"completion_tokens": 8}}).encode()
BEFORE = spec_page(0, 0, 0, [0] * 7)


def run_in_thread(gate_settings, wait=120.0):
    """run_gate in a thread: (finished, outcome or exception). An unbounded gate does not finish."""
    import threading

    box = {}

    def target():
        try:
            box["result"] = run_gate(gate_settings)
        except BaseException as exc:
            box["result"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(wait)
    return not worker.is_alive(), box.get("result")


@pytest.mark.parametrize(
    ("after", "figures"),
    [
        (spec_page(100, 700, 800, [100, 100, 100, 100, 100, 100, 100]), "accepted tokens 800 > draft tokens 700"),
        (spec_page(100, 700, 300, [150, 100, 50, 0, 0, 0, 0]), "position 0 accepted 150 times in 100 drafts"),
        (spec_page(10, 7000, 1000, [10] * 7), "mean acceptance length 101.00 > 1 + K = 8 (K = 7 positions)"),
        (spec_page(100, 700, "NaN", [50] * 7), "vllm:spec_decode_num_accepted_tokens_total=nan"),
        (spec_page(100, "+Inf", 300, [50] * 7), "vllm:spec_decode_num_draft_tokens_total=inf"),
        (spec_page(100, 700, 300, [-5, 0, 0, 0, 0, 0, 0]), "accepted_tokens_per_pos_total[0]=-5.0"),
    ],
    ids=["accepted>draft_tokens", "position>drafts", "AL101-K7", "NaN", "Inf", "negative"],
)
def test_impossible_counters_are_refused_with_the_figures(after, figures):
    with HostileServer(pages=[BEFORE, after], completion=GOOD_COMPLETION) as server, pytest.raises(GateError) as error:
        run_gate(settings(server.url, requests=2, settle_seconds=0.2, min_drafts=1))
    assert figures in str(error.value)
    assert "impossible" in str(error.value) and "Fix:" in str(error.value)


def test_an_inverted_interval_is_refused():
    window = _metrics.SpecDecodeSnapshot(drafts=100, draft_tokens=700, accepted_tokens=300, accepted_per_position=())
    stats = AcceptanceStats(100, 700, 300, 4.0, (101.0, 8.0), 0.43, (), "bhatia-davis")
    with pytest.raises(_metrics.MetricsError, match=r"interval \[101.00, 8.00\] does not hold .* 4.00"):
        _metrics.check_invariants(window, stats)


def test_possible_counters_pass_the_invariants():
    after = spec_page(100, 700, 300, [100, 100, 50, 50, 0, 0, 0])
    with HostileServer(pages=[BEFORE, after], completion=GOOD_COMPLETION) as server:
        outcome = run_gate(settings(server.url, requests=2, settle_seconds=0.2, min_drafts=1))
    assert outcome.passed and outcome.report["mean_acceptance_length"] == 4.0


@pytest.mark.slow
@pytest.mark.parametrize("where", ["metrics", "completions"])
def test_a_dripping_body_cannot_outlast_the_gate_deadline(where):
    with HostileServer(pages=[BEFORE], completion=GOOD_COMPLETION, drip=where) as server:
        finished, result = run_in_thread(settings(server.url, requests=2, timeout=5.0, deadline=1.5))
    assert finished, "the gate was still reading a dripping body long after its deadline"
    assert isinstance(result, GateError), result
    assert "did not finish within its deadline of 1.5 s" in str(result) and "raise deadline" in str(result)


def test_the_deadline_defaults_to_what_a_healthy_slow_server_needs():
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate import gate_deadline

    assert gate_deadline(GateSettings(timeout=10, requests=24, concurrency=4, settle_seconds=5)) == 10 * (6 + 3) + 5
    assert gate_deadline(GateSettings(deadline=42)) == 42


def test_a_huge_metrics_page_is_cut_off_at_the_cap():
    sent = []

    def stream():
        line = b"# filler " + b"x" * 1014 + b"\n"
        for _line in range(_gate_module().MAX_METRICS_BYTES // len(line) + 64):
            sent.append(len(line))
            yield line

    with HostileServer(metrics_stream=stream) as server, pytest.raises(GateError) as error:
        run_gate(settings(server.url))
    assert str(error.value).startswith(f"{server.url}/metrics sent more than 16 MiB")


def _gate_module():
    from ansible_collections.vllm_ops.dflash.plugins.module_utils import _gate_client

    return _gate_client


@pytest.mark.parametrize("tokens", ["many", 1.5, -3, True, None])
def test_a_non_numeric_completion_tokens_is_a_failed_request(tokens):
    body = json.dumps({"choices": [{"text": "ok"}], "usage": {"completion_tokens": tokens}}).encode()
    after = spec_page(100, 700, 300, [100, 100, 50, 50, 0, 0, 0])
    with HostileServer(pages=[BEFORE, after], completion=body) as server:
        outcome = run_gate(settings(server.url, requests=2, settle_seconds=0.2, min_drafts=1))
    if tokens is None:  # vLLM always counts; null is read as 0, not an error
        assert outcome.passed
        return
    assert not outcome.passed and outcome.report["requests_failed"] == 2
    assert f"usage.completion_tokens {tokens!r}, not a count" in outcome.report["errors"][0]["error"]


def test_credentials_in_the_url_are_refused_and_never_shown():
    with pytest.raises(GateError) as error:
        run_gate(settings("http://admin:s3cr3t-pw@127.0.0.1:1"))
    assert "carries credentials" in str(error.value) and "api_key" in str(error.value)
    assert "s3cr3t-pw" not in str(error.value) and "admin" not in str(error.value)


# ---------------------------------------------------------------------- workload and relative rules

from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate_history import RelativeRules  # noqa: E402
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate_report import summary_line  # noqa: E402
from ansible_collections.vllm_ops.dflash.plugins.module_utils._workload import load_workload  # noqa: E402

WORKLOAD = {
    "name": "mix",
    "max_tokens": 32,
    "concurrency": 2,
    "seed": 7,
    "requests": 8,
    "prompts": [
        {"id": "code", "prompt": "def merge(a, b):"},
        {
            "id": "think",
            "messages": [{"role": "user", "content": "What is 17 * 23?"}],
            "chat_template_kwargs": {"enable_thinking": True},
            "max_tokens": 48,
        },
    ],
}
IDENTITY = {"target_model": "tiny", "target_revision": "r", "drafter_model": "d", "drafter_revision": "x"}


# The fake answers at once: its tokens/s is wall-time noise, so the throughput rule is tested on figures
# (test_gate_history.py), not here.
NO_THROUGHPUT = RelativeRules(disabled=frozenset({"throughput"}))


def gate_with(fake, **overrides):
    values = dict(
        workload=load_workload(WORKLOAD, "mix.yml"), identity=dict(IDENTITY), min_drafts=1, rules=NO_THROUGHPUT
    )
    values.update(overrides)
    return run_gate(settings(fake.url, **values))


def test_the_workload_sends_completions_and_chats_with_its_seed_and_kwargs():
    with FakeVLLM(accepted_pattern=(2,), version="0.27.1") as fake:
        outcome = gate_with(fake)
    bodies = [r["body"] for r in fake.requests]
    chats = [b for b in bodies if "messages" in b]
    assert len(bodies) == 8 and len(chats) == 4
    assert {b["seed"] for b in bodies} == {7} and {b["temperature"] for b in bodies} == {0}
    assert {b["max_tokens"] for b in chats} == {48}
    assert all(b["chat_template_kwargs"] == {"enable_thinking": True} for b in chats)
    report = outcome.report
    assert outcome.passed and report["workload"]["sha256"] == load_workload(WORKLOAD).sha256
    assert set(report["fingerprints"]) == {"code", "think"} and report["unstable_outputs"] == []
    assert report["identity"]["vllm_version"] == "0.27.1"  # read from GET /version
    assert "no last good release" in report["relative"]["skipped"] and "relative rules skipped" in outcome.message
    assert summary_line(report).endswith(
        "vs none (relative rules skipped: no last good release), "
        f"{report['tokens_per_second']:.1f} tokens/s, verdict PASS, report none"
    )
    assert report["latency"]["e2e_seconds"]["p50"] > 0
    assert report["latency"]["ttft_seconds"] is None  # the fake has no histograms: said, not invented


def test_a_fall_from_3_2_to_2_7_fails_against_the_last_good_release_and_the_report_shows_both(tmp_path):
    # pattern means: (2, 2, 3, 2, 2) -> 3.2; (2, 1, 2, 2, 1, 2, 2, 2, 1, 2) -> 2.7
    with FakeVLLM(accepted_pattern=(2, 2, 3, 2, 2), version="0.27.1") as fake:
        good = gate_with(fake, identity=dict(IDENTITY, release="r1"))
    assert good.passed
    with FakeVLLM(accepted_pattern=(2, 1, 2, 2, 1, 2, 2, 2, 1, 2), version="0.27.1") as fake:
        bad = gate_with(fake, identity=dict(IDENTITY, release="r2"), baseline=good.report, baseline_release="r1")
    assert not bad.passed
    assert bad.report["mean_acceptance_length"] == pytest.approx(2.7, abs=0.05)
    assert any("relative rule acceptance_length" in r and "max_acceptance_drop" in r for r in bad.report["reasons"])
    markdown = render_markdown(bad.report)
    assert "| figure | r2 | r1 (last good) |" in markdown
    assert "## Acceptance rate per draft position (r2)" in markdown
    assert "## Acceptance rate per draft position (r1, last good)" in markdown
    line = summary_line(bad.report, str(tmp_path / "gate.json"))
    assert line.startswith("release r2 commit ?: AL 2.7") and "of last good r1" in line
    assert "verdict FAIL" in line and line.endswith(str(tmp_path / "gate.md"))
    # turned off, the same figures pass, and the result says the rule was off
    off = RelativeRules(disabled=frozenset({"acceptance_length", "position0", "throughput"}))
    with FakeVLLM(accepted_pattern=(2, 1, 2, 2, 1, 2, 2, 2, 1, 2), version="0.27.1") as fake:
        allowed = gate_with(fake, baseline=good.report, baseline_release="r1", rules=off)
    assert allowed.passed, allowed.message
    assert {c["rule"]: c["status"] for c in allowed.report["relative"]["checks"]}["acceptance_length"] == "off"


def test_other_greedy_text_fails_the_lossless_check():
    with FakeVLLM(accepted_pattern=(2,), version="0.27.1") as fake:
        good = gate_with(fake)
    with FakeVLLM(accepted_pattern=(2,), version="0.27.1", word=" ipsum") as fake:
        bad = gate_with(fake, baseline=good.report, baseline_release="r1")
    assert not bad.passed and "relative rule greedy_outputs: 0 of 2 prompts" in bad.message


def test_a_last_good_result_of_another_workload_is_named_not_silently_dropped():
    with FakeVLLM(accepted_pattern=(2,)) as fake:
        good = gate_with(fake)
        other = gate_with(fake, workload=load_workload(dict(WORKLOAD, seed=8)), baseline=good.report,
                          baseline_release="r1")  # fmt: skip
    assert other.passed and "relative rules skipped: other workload" in other.message
    assert other.report["relative"]["checks"] == []


def test_a_prompt_the_model_cannot_take_names_the_prompt_and_the_fix():
    long_prompt = dict(WORKLOAD, prompts=[*WORKLOAD["prompts"], {"id": "essay", "prompt": "word " * 100}])
    with FakeVLLM(accepted_pattern=(2,), max_prompt_chars=200) as fake:
        outcome = gate_with(fake, workload=load_workload(long_prompt, "mine.yml"))
    assert not outcome.passed
    assert "prompt 'essay' of workload 'mix' refused by the served model (HTTP 400" in outcome.message
    assert "maximum context length" in outcome.message and "mine.yml" in outcome.message


def test_rule_options_out_of_range_are_refused_before_any_traffic():
    with FakeVLLM() as fake, pytest.raises(GateError, match="max_throughput_drop must be a fraction"):
        gate_with(fake, rules=RelativeRules(max_throughput_drop=2.0))
    assert fake.requests == []


# ------------------------------------------------------------------------------ issue 28: the gate's faults


class Redirector:
    """A server that answers every GET (or POST, with `posts`) with `code` and Location `target` + the path."""

    def __init__(self, target, code=302, posts=False):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _redirect(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(code)
                self.send_header("Location", target + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):
                if self.path == "/metrics" and posts:  # a real page before, so the completions are sent
                    page = BEFORE.encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                self._redirect()

            do_POST = _redirect

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirected_metrics_page_is_refused_and_the_key_stays_home(code):
    # Case 6: /metrics redirects to another host; the gate followed it with the Bearer key and passed on
    # that host's counters. Now the redirect is an error naming its Location, and the other host sees nothing.
    with FakeVLLM(accepted_pattern=(7,), api_key="s3cret") as elsewhere:
        with Redirector(elsewhere.url, code) as front, pytest.raises(GateError) as error:
            run_gate(settings(front.url, api_key="s3cret"))
        assert elsewhere.metrics_scrapes == 0 and elsewhere.requests == []
    message = str(error.value)
    assert f"HTTP {code} from {front.url}/metrics: a redirect to {elsewhere.url}/metrics" in message
    assert "does not follow" in message and "s3cret" not in message


@pytest.mark.parametrize("code", [302, 303, 307])
def test_a_redirected_completion_is_a_failed_request_and_the_key_stays_home(code):
    with FakeVLLM(accepted_pattern=(7,), api_key="s3cret") as elsewhere:
        with Redirector(elsewhere.url, code, posts=True) as front:
            outcome = run_gate(settings(front.url, api_key="s3cret", requests=2, settle_seconds=0.2, min_drafts=0))
        assert elsewhere.requests == []
    assert not outcome.passed and outcome.report["requests_failed"] == 2
    assert f"a redirect to {elsewhere.url}/v1/completions" in outcome.report["errors"][0]["error"]


@pytest.mark.parametrize(
    ("after", "gate_options", "figures"),
    [
        (
            spec_page(100, 700, 500, [0] * 7),
            {},
            "vllm:spec_decode_num_accepted_tokens_per_pos_total sums to 0, but "
            "vllm:spec_decode_num_accepted_tokens_total counted 500",
        ),
        (
            spec_page(100, 700, 300, [50, 100, 50, 50, 50, 0, 0]),
            {},
            "vllm:spec_decode_num_accepted_tokens_per_pos_total position 1 accepted 100 > position 0 50",
        ),
        (
            spec_page(100, 700, 300, [100, 100, 50, 50, 0, 0, 0]),
            {"num_speculative_tokens": 15},
            "vllm:spec_decode_num_accepted_tokens_per_pos_total has 7 positions, but the server runs "
            "num_speculative_tokens 15",
        ),
        (
            spec_page(100, 900, 300, [100, 100, 50, 50, 0, 0, 0]),
            {},
            "vllm:spec_decode_num_draft_tokens_total 900 > drafts 100 * K 7",
        ),
    ],
    ids=["per-position-sum-0-vs-500", "not-a-prefix", "K-7-vs-15", "draft-tokens>drafts*K"],
)
def test_counters_vllm_cannot_produce_are_refused_naming_the_counter(after, gate_options, figures):
    # Case 7: each of these passed the gate at 4893f05.
    with HostileServer(pages=[BEFORE, after], completion=GOOD_COMPLETION) as server, pytest.raises(GateError) as error:
        run_gate(settings(server.url, requests=2, settle_seconds=0.2, min_drafts=1, **gate_options))
    assert figures in str(error.value)
    assert "impossible" in str(error.value) and "Fix:" in str(error.value)


def test_drafts_without_per_position_series_are_refused():
    # Case 7: a page without the per-position series passed at AL 101 (K unknown, so never compared).
    pages = [spec_page(0, 0, 0, []), spec_page(10, 1000, 1000, [])]
    with HostileServer(pages=pages, completion=GOOD_COMPLETION) as server, pytest.raises(GateError) as error:
        run_gate(settings(server.url, requests=2, settle_seconds=0.2, min_drafts=1))
    assert "10 drafts but no vllm:spec_decode_num_accepted_tokens_per_pos_total series" in str(error.value)


def test_the_right_number_of_positions_passes():
    after = spec_page(100, 700, 300, [100, 100, 50, 50, 0, 0, 0])
    with HostileServer(pages=[BEFORE, after], completion=GOOD_COMPLETION) as server:
        outcome = run_gate(settings(server.url, requests=2, settle_seconds=0.2, min_drafts=1, num_speculative_tokens=7))
    assert outcome.passed and outcome.report["mean_acceptance_length"] == 4.0


def started_at(page, seconds):
    return f"# HELP process_start_time_seconds Start time.\n# TYPE process_start_time_seconds gauge\n" \
        f"process_start_time_seconds {seconds!r}\n" + page  # fmt: skip


def test_a_restart_whose_counters_grow_past_the_old_ones_is_refused():
    # Case 19b: the server restarted mid-gate and its new counters (300 drafts) outgrew the old (100): no
    # counter went down, so the gate judged a window of two processes. process_start_time_seconds tells them apart.
    before = started_at(spec_page(100, 700, 300, [100, 100, 50, 50, 0, 0, 0]), 1795980436.69)
    after = started_at(spec_page(300, 2100, 900, [300, 300, 150, 150, 0, 0, 0]), 1795990000.0)
    with HostileServer(pages=[before, after], completion=GOOD_COMPLETION) as server, pytest.raises(GateError) as error:
        run_gate(settings(server.url, requests=2, settle_seconds=0.2, min_drafts=1))
    message = str(error.value)
    assert message.startswith("the vLLM server restarted during the gate")
    assert "process_start_time_seconds 1795990000.00 (2026-11-29T" in message and "first 1795980436.69" in message
    assert "mix two server processes' counters" in message and "run the gate again" in message


def test_one_process_throughout_passes_and_the_report_names_its_start():
    before = started_at(spec_page(100, 700, 300, [100, 100, 50, 50, 0, 0, 0]), 1795980436.69)
    after = started_at(spec_page(200, 1400, 600, [200, 200, 100, 100, 0, 0, 0]), 1795980436.69)
    with HostileServer(pages=[before, after], completion=GOOD_COMPLETION) as server:
        outcome = run_gate(settings(server.url, requests=2, settle_seconds=0.2, min_drafts=1))
    assert outcome.passed and outcome.report["mean_acceptance_length"] == 4.0
    assert outcome.report["server_started_at"] == ["2026-11-29T19:27:16Z"]


def test_a_page_that_loses_its_process_collector_is_another_server():
    before = started_at(spec_page(100, 700, 300, [100, 100, 50, 50, 0, 0, 0]), 1795980436.69)
    after = spec_page(200, 1400, 600, [200, 200, 100, 100, 0, 0, 0])
    with HostileServer(pages=[before, after], completion=GOOD_COMPLETION) as server, pytest.raises(GateError) as error:
        run_gate(settings(server.url, requests=2, settle_seconds=0.2, min_drafts=1))
    assert "process_start_time_seconds none, first 1795980436.69" in str(error.value)


def test_a_fake_vllm_restart_mid_gate_is_named_a_restart():
    with FakeVLLM() as fake:
        assert run_gate(settings(fake.url)).passed
        fake.restart_after = len(fake.requests) + 1  # early: the new process counts past the old totals
        with pytest.raises(GateError, match=r"restarted during the gate"):
            run_gate(settings(fake.url, requests=48))


def test_a_deeply_nested_completion_is_a_failed_request_not_a_traceback():
    # Case 14's attack on the gate: json.loads recursed into a RecursionError that ended the module.
    nested = b"[" * 100_000 + b"]" * 100_000
    with HostileServer(pages=[BEFORE, BEFORE], completion=nested) as server:
        outcome = run_gate(settings(server.url, requests=2, settle_seconds=0.2, min_drafts=0))
    assert not outcome.passed and outcome.report["requests_failed"] == 2
    assert "answered with something that is not JSON" in outcome.report["errors"][0]["error"]
