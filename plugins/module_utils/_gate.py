# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The acceptance-length smoke gate: traffic -> /metrics window -> verdict -> report.

One run: scrape /metrics, send `requests` completions (`concurrency` at a time, temperature 0), wait
until the spec-decode counters settle, scrape again, and judge the difference with vLLM's own formulas
(_metrics.py). The verdict fails on any failed request, on too few drafts to judge, and on a mean
acceptance length (or draft acceptance rate) under its threshold. Standard library only.
"""

from __future__ import annotations

import collections
import concurrent.futures
import datetime
import http.client
import json
import math
import os
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import write_text_atomic
from ansible_collections.vllm_ops.dflash.plugins.module_utils._metrics import (
    AcceptanceStats,
    MetricFamily,
    MetricsError,
    SpecDecodeSnapshot,
    acceptance_stats,
    check_invariants,
    delta,
    library_parser_available,
    parse_metrics,
    spec_decode_model_names,
    spec_decode_snapshot,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._prompts import DEFAULT_PROMPTS

__all__ = [
    "GateError",
    "GateOutcome",
    "GateSettings",
    "evaluate",
    "gate_deadline",
    "render_markdown",
    "report_paths",
    "run_gate",
    "write_reports",
]

REPORT_SCHEMA = 1
_BAR_WIDTH = 30
_EIGHTHS = "▏▎▍▌▋▊▉"


class GateError(Exception):
    """The gate could not judge (server unreachable, not speculative, bad options); names the fix."""


@dataclass
class GateSettings:
    url: str = "http://127.0.0.1:8000"
    model: str = ""
    api_key: Optional[str] = None
    prompts: Sequence[str] = ()
    requests: int = 24
    max_tokens: int = 128
    concurrency: int = 4
    min_mean_acceptance_length: float = 2.0
    min_draft_acceptance_rate: Optional[float] = None
    min_drafts: int = 50
    timeout: float = 60.0
    # The whole run (scrapes, completions, settling); None = derived from timeout (gate_deadline()).
    deadline: Optional[float] = None
    validate_certs: bool = True
    # vLLM publishes counters asynchronously: after the last response, poll /metrics until they stop
    # moving, for at most this long.
    settle_seconds: float = 5.0
    poll_interval: float = 0.25


@dataclass
class GateOutcome:
    passed: bool
    message: str
    report: Dict[str, Any]


# ------------------------------------------------------------------------------------------------ HTTP

# Bodies are read in chunks up to these sizes: a real vLLM /metrics page is well under 1 MiB, a completion
# of max_tokens far less; anything bigger is not a vLLM answer and must not take the host's memory.
MAX_METRICS_BYTES = 16 * 1024 * 1024
MAX_COMPLETION_BYTES = 4 * 1024 * 1024
_CHUNK = 65536


class _DeadlinePassed(Exception):
    """The gate's overall deadline passed while talking to the server."""


class _TooLarge(Exception):
    """A response body larger than its cap."""


def _set_read_timeout(response: Any, seconds: float) -> None:
    """Bound the next read by `seconds`: urllib's timeout is per socket read, set once at connect."""
    raw = getattr(getattr(response, "fp", None), "raw", None)
    sock = getattr(raw, "_sock", None)
    if sock is not None:
        sock.settimeout(max(seconds, 0.001))


def gate_deadline(settings: GateSettings) -> float:
    """Seconds the whole gate may take: the option, or what a slow but healthy server needs.

    One scrape before, the completions in waves of `concurrency` (each up to `timeout`), the settling, and
    one scrape after; plus a scrape's timeout of slack.
    """
    if settings.deadline is not None:
        return settings.deadline
    waves = math.ceil(settings.requests / max(settings.concurrency, 1))
    return settings.timeout * (waves + 3) + settings.settle_seconds


def _base_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GateError(f"url {display_url(url)!r} is not an http(s) URL; use e.g. http://127.0.0.1:8000")
    if "@" in parts.netloc:
        # urllib would take `user:pass@host` for a host name and report a DNS error.
        raise GateError(
            f"url {display_url(url)!r} carries credentials (user:password@), which the gate does not send; "
            "drop them from url and give the server's --api-key in api_key (sent as a Bearer token)"
        )
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):  # people paste the OpenAI base URL
        path = path[: -len("/v1")]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def display_url(url: str) -> str:
    """`url` without user:password (never echo credentials into messages or reports)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _error_detail(exc: urllib.error.HTTPError) -> str:
    """vLLM's error message from an error response (`{"error": {"message": ...}}` or `{"message": ...}`)."""
    try:
        body = exc.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        body = ""
    try:
        data = json.loads(body)
    except ValueError:
        return (body.strip() or str(exc.reason))[:200]
    if isinstance(data, dict):
        error = data.get("error", data)
        message = error.get("message") if isinstance(error, dict) else error
        if message:
            return str(message)[:200]
    return body.strip()[:200]


class _Server:
    def __init__(self, settings: GateSettings) -> None:
        self.settings = settings
        self.base = _base_url(settings.url)
        self.shown = display_url(self.base)
        context = ssl.create_default_context()
        if not settings.validate_certs:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        # Stdlib opener (this core imports no Ansible, so not ansible.module_utils.urls.open_url).
        self.opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
        self.deadline_seconds = gate_deadline(settings)
        self.deadline = time.monotonic() + self.deadline_seconds

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def deadline_error(self) -> GateError:
        return GateError(
            f"the gate did not finish within its deadline of {self.deadline_seconds:g} s ({self.shown} answers "
            "too slowly or never ends its responses); check the server's /health and log, or raise deadline"
        )

    def _read(self, response: Any, limit: int, path: str) -> bytes:
        """The body, in chunks: each read waits at most until the deadline, and at most `limit` bytes."""
        chunks: List[bytes] = []
        size = 0
        while True:
            remaining = self.remaining()
            if remaining <= 0:
                raise _DeadlinePassed(path)
            _set_read_timeout(response, min(self.settings.timeout, remaining))
            chunk = response.read1(_CHUNK) if hasattr(response, "read1") else response.read(_CHUNK)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise _TooLarge(f"{self.shown}{path} sent more than {limit // (1024 * 1024)} MiB")
            chunks.append(chunk)

    def _request(self, path: str, payload: Optional[Dict[str, Any]] = None, limit: int = MAX_METRICS_BYTES) -> bytes:
        headers = {"Accept": "application/json, text/plain"}
        data = None
        if payload is not None:
            data = json.dumps(payload).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.settings.api_key:
            headers["Authorization"] = "Bearer " + self.settings.api_key
        request = urllib.request.Request(self.base + path, data=data, headers=headers)
        remaining = self.remaining()
        if remaining <= 0:
            raise _DeadlinePassed(path)
        try:
            with self.opener.open(request, timeout=min(self.settings.timeout, remaining)) as response:
                return self._read(response, limit, path)
        except (OSError, http.client.HTTPException):
            if self.remaining() <= 0:  # a read cut short by the deadline, not by `timeout`
                raise _DeadlinePassed(path) from None
            raise

    def explain(self, exc: BaseException, path: str, not_found_fix: str) -> str:
        """One sentence: what went wrong talking to `path`, and what to do about it."""
        where = self.shown + path
        if isinstance(exc, urllib.error.HTTPError):
            if exc.code in (401, 403):
                fix = (
                    "the api_key was rejected: set api_key to the server's --api-key (VLLM_API_KEY)"
                    if self.settings.api_key
                    else "the server requires an API key: set api_key to its --api-key (VLLM_API_KEY)"
                )
            elif exc.code == 404:
                fix = not_found_fix
            else:
                fix = "see the vLLM server log"
            return f"HTTP {exc.code} from {where}: {_error_detail(exc)}; {fix}"
        reason: object = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, ConnectionRefusedError):
            return (
                f"connection refused by {where}: nothing listens there; start the vLLM service "
                "(systemctl start vllm-<instance>) or set url to the address it serves on"
            )
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return (
                f"no answer from {where} within {self.settings.timeout:g} s: the server is overloaded, stuck or "
                "still loading; check its /health and log, or raise timeout (or lower concurrency/max_tokens)"
            )
        if isinstance(reason, ssl.SSLCertVerificationError):
            return (
                f"TLS certificate of {where} not trusted ({reason.verify_message}); install its CA on the host "
                "or set validate_certs: false"
            )
        if isinstance(reason, socket.gaierror):
            return f"cannot resolve the host of {where} ({reason}); fix url"
        return f"cannot talk to {where} ({reason}); check url and that the vLLM server is up"

    def families(self) -> List[MetricFamily]:
        try:
            text = self._request("/metrics").decode("utf-8", "replace")
        except _DeadlinePassed:
            raise self.deadline_error() from None
        except _TooLarge as exc:
            raise GateError(f"{exc}: that is not a vLLM /metrics page; is url the vLLM server?") from None
        except (OSError, http.client.HTTPException) as exc:  # URLError and timeouts are OSErrors
            raise GateError(
                self.explain(exc, "/metrics", "no metrics there: is url the vLLM server (not a proxy or another app)?")
            ) from exc
        try:
            return parse_metrics(text)
        except MetricsError as exc:
            raise GateError(f"{self.shown}/metrics: {exc}") from exc

    def scrape(self, model: Optional[str], families: Optional[List[MetricFamily]] = None) -> SpecDecodeSnapshot:
        try:
            return spec_decode_snapshot(self.families() if families is None else families, model)
        except MetricsError as exc:
            raise GateError(f"{self.shown}/metrics: {exc}") from exc

    def complete(self, prompt: str) -> Tuple[Optional[str], int]:
        """Send one completion; return (error or None, completion tokens)."""
        payload = {
            "model": self.settings.model,
            "prompt": prompt,
            "max_tokens": self.settings.max_tokens,
            "temperature": 0,
        }
        not_found = f"set model to a served model name (GET {self.shown}/v1/models lists them)"
        try:
            body = self._request("/v1/completions", payload, MAX_COMPLETION_BYTES)
            answer = json.loads(body.decode("utf-8", "replace"))
        except _DeadlinePassed:
            return f"not sent or not finished before the gate's deadline of {self.deadline_seconds:g} s", 0
        except _TooLarge as exc:
            return f"{exc} for one completion of max_tokens {self.settings.max_tokens}; is url a vLLM server?", 0
        except (OSError, http.client.HTTPException) as exc:
            return self.explain(exc, "/v1/completions", not_found), 0
        except ValueError:
            return f"{self.shown}/v1/completions answered with something that is not JSON; is url a vLLM server?", 0
        try:
            text = answer["choices"][0]["text"]
        except (KeyError, IndexError, TypeError):
            return f"{self.shown}/v1/completions answered without choices[0].text; is url a vLLM server?", 0
        usage = answer.get("usage") or {}
        tokens = usage.get("completion_tokens", 0) if isinstance(usage, dict) else None
        if tokens is None:
            tokens = 0
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            return (
                f"{self.shown}/v1/completions answered with usage.completion_tokens {tokens!r}, not a count of "
                "tokens; is url a vLLM server?",
                0,
            )
        if not isinstance(text, str) or not text.strip():
            return "empty completion text: the server generated nothing; see the vLLM server log", tokens
        return None, tokens


# ---------------------------------------------------------------------------------------------- the run


def _validate(settings: GateSettings) -> None:
    problems = []
    if not settings.model:
        problems.append("model is required (the served model name)")
    for name in ("requests", "max_tokens", "concurrency"):
        if getattr(settings, name) < 1:
            problems.append(f"{name} must be at least 1")
    if settings.min_drafts < 0:
        problems.append("min_drafts must be 0 or more")
    if settings.timeout <= 0:
        problems.append("timeout must be more than 0 seconds")
    if settings.deadline is not None and settings.deadline <= 0:
        problems.append("deadline must be more than 0 seconds")
    rate = settings.min_draft_acceptance_rate
    if rate is not None and not 0 <= rate <= 1:
        problems.append("min_draft_acceptance_rate must be between 0 and 1")
    if settings.min_mean_acceptance_length < 1:
        problems.append("min_mean_acceptance_length must be at least 1 (1 = no token accepted)")
    if any(not isinstance(p, str) or not p for p in settings.prompts):
        problems.append("prompts must be non-empty strings")
    if problems:
        raise GateError("invalid gate options: " + "; ".join(problems))


def _metrics_model_name(families: List[MetricFamily], model: str) -> str:
    """The `model_name` label to read: `model`, or the only one the server reports.

    vLLM labels its metrics with the first served model name, which an alias in `model` need not equal.
    """
    names = spec_decode_model_names(families)
    return names[0] if len(names) == 1 and model not in names else model


def _utc(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _settle(
    server: _Server, model: Optional[str], before: SpecDecodeSnapshot, settings: GateSettings
) -> SpecDecodeSnapshot:
    """Scrape until two scrapes in a row agree and the drafts have moved, or until settle_seconds.

    "Moved" includes going down: a restarted server will not count up to `before` again, and delta()
    reports the restart.
    """
    deadline = min(time.monotonic() + settings.settle_seconds, server.deadline)
    last = server.scrape(model)
    while time.monotonic() < deadline:
        time.sleep(settings.poll_interval)
        current = server.scrape(model)
        if current == last and current.drafts != before.drafts:
            return current
        last = current
    return last


def run_gate(settings: GateSettings) -> GateOutcome:
    """Run the smoke traffic against `settings.url` and judge it. Raises GateError when it cannot judge."""
    _validate(settings)
    server = _Server(settings)
    prompts = list(settings.prompts) or list(DEFAULT_PROMPTS)
    started = time.time()
    families = server.families()
    model = _metrics_model_name(families, settings.model)
    before = server.scrape(model, families)

    errors: collections.Counter[str] = collections.Counter()
    ok = completion_tokens = 0
    traffic_start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(settings.concurrency, settings.requests)) as pool:
        jobs = [pool.submit(server.complete, prompts[i % len(prompts)]) for i in range(settings.requests)]
        for job in jobs:
            error, tokens = job.result()
            completion_tokens += tokens
            if error is None:
                ok += 1
            else:
                errors[error] += 1
    traffic_seconds = time.monotonic() - traffic_start
    if server.remaining() <= 0:
        raise server.deadline_error()

    after = _settle(server, model, before, settings) if ok else server.scrape(model)
    try:
        window = delta(before, after)
        stats = acceptance_stats(window)
        check_invariants(window, stats)
    except MetricsError as exc:
        raise GateError(f"{server.shown}/metrics: {exc}") from exc
    failed = settings.requests - ok
    reasons = evaluate(stats, settings.requests, failed, errors, settings)
    passed = not reasons
    if passed:
        message = (
            f"acceptance gate passed for {settings.model} at {server.shown}: mean acceptance length "
            f"{_ci_text(stats)} >= {settings.min_mean_acceptance_length:.2f} over {stats.drafts} drafts"
        )
    else:
        message = f"acceptance gate FAILED for {settings.model} at {server.shown}: " + "; ".join(reasons)
    generated = window.generation_tokens
    report: Dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "passed": passed,
        "verdict": "pass" if passed else "fail",
        "message": message,
        "reasons": reasons,
        "url": server.shown,
        "model": settings.model,
        "metrics_model_name": model,
        "started_at": _utc(started),
        "finished_at": _utc(time.time()),
        "thresholds": {
            "min_mean_acceptance_length": settings.min_mean_acceptance_length,
            "min_draft_acceptance_rate": settings.min_draft_acceptance_rate,
            "min_drafts": settings.min_drafts,
        },
        "mean_acceptance_length": _rounded(stats.mean_acceptance_length),
        "mean_acceptance_length_ci95": (
            [_rounded(v) for v in stats.mean_acceptance_length_ci95] if stats.mean_acceptance_length_ci95 else None
        ),
        "ci_method": stats.ci_method,
        "draft_acceptance_rate": _rounded(stats.draft_acceptance_rate),
        "per_position_acceptance": [_rounded(r) for r in stats.per_position_acceptance],
        "drafts": stats.drafts,
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "generation_tokens": None if generated is None else round(generated),
        "completion_tokens": completion_tokens,
        "prompt_tokens": None if window.prompt_tokens is None else round(window.prompt_tokens),
        "tokens_per_second": None if generated is None else round(generated / max(traffic_seconds, 1e-9), 2),
        "traffic_seconds": round(traffic_seconds, 3),
        "requests": settings.requests,
        "requests_ok": ok,
        "requests_failed": failed,
        "errors": [{"error": text, "count": count} for text, count in errors.most_common()],
        "concurrency": settings.concurrency,
        "max_tokens": settings.max_tokens,
        "prompts": len(prompts),
        "prompt_set": "custom" if settings.prompts else "default",
        "parser": "prometheus_client" if library_parser_available() else "stdlib",
    }
    return GateOutcome(passed, message, report)


def _rounded(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 6)


def _ci_text(stats: AcceptanceStats) -> str:
    if stats.mean_acceptance_length is None:
        return "n/a"
    text = f"{stats.mean_acceptance_length:.2f}"
    if stats.mean_acceptance_length_ci95 is not None:
        low, high = stats.mean_acceptance_length_ci95
        text += f" (95% CI {low:.2f}-{high:.2f})"
    return text


def evaluate(
    stats: AcceptanceStats,
    requests: int,
    requests_failed: int,
    errors: collections.Counter[str],
    settings: GateSettings,
) -> List[str]:
    """The reasons the gate fails; empty when it passes."""
    reasons = []
    if requests_failed:
        common = errors.most_common(1)
        first = f" (most common: {common[0][0]})" if common else ""
        reasons.append(f"{requests_failed} of {requests} requests failed{first}")
    needed = max(settings.min_drafts, 1)  # with no draft at all there is nothing to judge
    if stats.drafts < needed or stats.mean_acceptance_length is None:
        reasons.append(
            f"not enough evidence: {stats.drafts} drafts < min_drafts {needed}; raise requests/max_tokens"
            + ("" if stats.drafts else " (or check that the drafter proposes tokens for these prompts)")
        )
        return reasons
    if stats.mean_acceptance_length < settings.min_mean_acceptance_length:
        reasons.append(
            f"mean acceptance length {_ci_text(stats)} < min_mean_acceptance_length "
            f"{settings.min_mean_acceptance_length:.2f}: the drafter's proposals are mostly rejected; check the "
            "drafter matches the target and this vLLM build (dflash_preflight, vllm_facts probes)"
        )
    minimum_rate = settings.min_draft_acceptance_rate
    if minimum_rate is not None and (stats.draft_acceptance_rate or 0.0) < minimum_rate:
        reasons.append(
            f"draft acceptance rate {stats.draft_acceptance_rate or 0.0:.3f} < min_draft_acceptance_rate "
            f"{minimum_rate:.3f}"
        )
    return reasons


# --------------------------------------------------------------------------------------------- reports


def _bar(rate: float) -> str:
    cells = max(0.0, min(1.0, rate)) * _BAR_WIDTH
    full = int(cells)
    eighths = round((cells - full) * 8)
    if eighths == 8:
        full, eighths = full + 1, 0
    return ("█" * full + (_EIGHTHS[eighths - 1] if eighths else "")).ljust(_BAR_WIDTH)


def _number(value: Optional[float], fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def render_markdown(report: Dict[str, Any]) -> str:
    """The report for people: verdict, figures against thresholds, per-position bars, reasons."""
    thresholds = report["thresholds"]
    ci = report["mean_acceptance_length_ci95"]
    length = _number(report["mean_acceptance_length"], ".2f")
    if ci:
        length += f" (95% CI {ci[0]:.2f}-{ci[1]:.2f})"
    min_rate = thresholds["min_draft_acceptance_rate"]
    lines = [
        f"# DFlash acceptance gate: {'PASSED' if report['passed'] else 'FAILED'}",
        "",
        f"- server: {report['url']}",
        f"- model: `{report['model']}` (metrics model_name `{report['metrics_model_name']}`)",
        f"- time: {report['started_at']} to {report['finished_at']} (traffic {report['traffic_seconds']:.2f} s)",
        f"- traffic: {report['requests']} completions ({report['prompts']} {report['prompt_set']} prompts), "
        f"concurrency {report['concurrency']}, max_tokens {report['max_tokens']}, temperature 0",
        "",
        "| figure | measured | threshold |",
        "|---|---|---|",
        f"| mean acceptance length | {length} | >= {thresholds['min_mean_acceptance_length']:.2f} |",
        f"| draft acceptance rate | {_number(report['draft_acceptance_rate'], '.3f')} | "
        + ("not set" if min_rate is None else f">= {min_rate:.3f}")
        + " |",
        f"| drafts | {report['drafts']} | >= {thresholds['min_drafts']} |",
        f"| failed requests | {report['requests_failed']} of {report['requests']} | 0 |",
        f"| draft tokens / accepted tokens | {report['draft_tokens']} / {report['accepted_tokens']} | |",
        f"| generation tokens/s | {_number(report['tokens_per_second'], '.1f')} | |",
        "",
    ]
    if report["per_position_acceptance"]:
        lines += ["## Acceptance rate per draft position", "", "```text"]
        rates = report["per_position_acceptance"]
        digits = len(str(len(rates) - 1))
        lines += [f"pos {i:<{digits}d} {_bar(rate)} {rate:.2f}" for i, rate in enumerate(rates)]
        lines += ["```", ""]
    if report["reasons"]:
        lines += ["## Why it failed", ""] + [f"- {reason}" for reason in report["reasons"]] + [""]
    if report["errors"]:
        lines += ["## Request errors", ""] + [f"- {e['count']} x {e['error']}" for e in report["errors"]] + [""]
    lines.append(
        f"Mean acceptance length = 1 + accepted/drafts over the window of this run ({report['ci_method']} "
        "interval); see docs/gate-report.md."
    )
    return "\n".join(lines) + "\n"


def report_paths(report_path: str) -> Tuple[str, str]:
    """(JSON path, Markdown path): `gate.json` -> `gate.md`; any other name gets `.md` appended."""
    stem, extension = os.path.splitext(report_path)
    return report_path, (stem + ".md" if extension == ".json" else report_path + ".md")


def _write_if_changed(path: str, text: str) -> bool:
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    write_text_atomic(path, text)
    return True


def write_reports(report: Dict[str, Any], report_path: str) -> bool:
    """Write the JSON and Markdown reports; True when either file's content changed."""
    json_path, markdown_path = report_paths(report_path)
    try:
        changed = _write_if_changed(json_path, json.dumps(report, indent=2, sort_keys=True) + "\n")
        return _write_if_changed(markdown_path, render_markdown(report)) or changed
    except OSError as exc:
        raise GateError(
            f"cannot write the gate report to {report_path} ({exc.strerror or exc}); choose a writable "
            "report_path or run the task with become"
        ) from exc
