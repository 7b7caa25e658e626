# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The acceptance gate: pinned workload -> /metrics window -> verdict (absolute and relative) -> report.

One run: scrape /metrics, send the workload's requests (_workload.py: completions and chats,
`concurrency` at a time, its temperature and seed), wait until the spec-decode counters settle, scrape
again, and judge the difference with vLLM's own formulas (_metrics.py). The absolute verdict fails on
any failed request, on too few drafts to judge, and on a mean acceptance length (or draft acceptance
rate) under its threshold; the relative rules (_gate_history.py) judge the run against the last good
release's result. Each greedy output is fingerprinted (sha256), latency percentiles come from vLLM's
TTFT / TPOT histograms. Standard library only.
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
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils import _untrusted_json
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import NoRedirectHandler, write_text_atomic
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate_history import (
    RULES,
    Comparison,
    RelativeRules,
    compare,
    fingerprint,
    results_path,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._metrics import (
    TPOT_HISTOGRAMS,
    TTFT_HISTOGRAMS,
    AcceptanceStats,
    MetricFamily,
    MetricsError,
    SpecDecodeSnapshot,
    acceptance_stats,
    bucket_delta,
    check_invariants,
    delta,
    histogram_buckets,
    latency_percentiles,
    library_parser_available,
    parse_metrics,
    process_start_times,
    spec_decode_model_names,
    spec_decode_snapshot,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._prompts import DEFAULT_PROMPTS
from ansible_collections.vllm_ops.dflash.plugins.module_utils._workload import Prompt, Workload, inline_workload

__all__ = [
    "GateError",
    "GateOutcome",
    "GateSettings",
    "evaluate",
    "gate_deadline",
    "render_markdown",
    "report_paths",
    "run_gate",
    "summary_line",
    "write_reports",
]

REPORT_SCHEMA = 2
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
    max_tokens: int = Workload.max_tokens  # a workload's sizes, written once in _workload
    concurrency: int = Workload.concurrency
    min_mean_acceptance_length: float = 2.0
    min_draft_acceptance_rate: Optional[float] = None
    min_drafts: int = 50
    # The server's num_speculative_tokens (K): the per-position series must number K. None = not checked.
    num_speculative_tokens: Optional[int] = None
    timeout: float = 60.0
    # The whole run (scrapes, completions, settling); None = derived from timeout (gate_deadline()).
    deadline: Optional[float] = None
    validate_certs: bool = True
    # vLLM publishes counters asynchronously: after the last response, poll /metrics until they stop
    # moving, for at most this long.
    settle_seconds: float = 5.0
    poll_interval: float = 0.25
    # The pinned workload; None = `prompts` (or the shipped ones) cycled over `requests` completions.
    workload: Optional[Workload] = None
    # Who served: target_model/_revision, drafter_model/_revision, vllm_version, vllm_commit, release.
    identity: Dict[str, Any] = field(default_factory=dict)
    rules: RelativeRules = field(default_factory=RelativeRules)
    # The last good release's passed result (_gate_history.baseline_result) and that release's name.
    baseline: Optional[Dict[str, Any]] = None
    baseline_release: Optional[str] = None
    results_dir: str = ""


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
    requests, concurrency = settings.requests, settings.concurrency
    if settings.workload is not None:
        requests, concurrency = settings.workload.total_requests, settings.workload.concurrency
    waves = math.ceil(requests / max(concurrency, 1))
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
        data = _untrusted_json.loads(body)
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
        self.opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), NoRedirectHandler())
        self.deadline_seconds = gate_deadline(settings)
        self.deadline = time.monotonic() + self.deadline_seconds
        # process_start_time_seconds of the first scrape: every later scrape must come from that process.
        self.process_start: Optional[Tuple[float, ...]] = None

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
            elif 300 <= exc.code < 400:
                location = display_url(str(exc.headers.get("Location") or "")) or "no Location"
                return (
                    f"HTTP {exc.code} from {where}: a redirect to {location}, which the gate does not follow (it "
                    "would send the api_key there and judge another server's counters); set url to the vLLM "
                    "server itself, not a proxy or a name that redirects"
                )
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

    def version(self) -> Optional[str]:
        """The server's GET /version, None when it has none (then greedy outputs compare by prefix only)."""
        try:
            answer = _untrusted_json.loads(
                self._request("/version", limit=MAX_COMPLETION_BYTES).decode("utf-8", "replace")
            )
        except (OSError, http.client.HTTPException, ValueError, _DeadlinePassed, _TooLarge):
            return None
        version = answer.get("version") if isinstance(answer, dict) else None
        return str(version) if version else None

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
            families = parse_metrics(text)
        except MetricsError as exc:
            raise GateError(f"{self.shown}/metrics: {exc}") from exc
        self._same_process(process_start_times(families))
        return families

    def _same_process(self, started: Tuple[float, ...]) -> None:
        """Refuse a scrape of another server process than the first one's (a restart, or another backend).

        Counters that went down already say "restarted"; a restart whose new counters grew past the old
        ones before the last scrape does not, and would mix two processes' counters into one window.
        """
        if self.process_start is None:
            self.process_start = started
            return
        if started != self.process_start:
            raise GateError(
                f"the vLLM server restarted during the gate: {self.shown}/metrics reports "
                f"process_start_time_seconds {_starts(started)}, first {_starts(self.process_start)}, so the "
                "window would mix two server processes' counters; wait until the server is stable (no restart "
                "loop, one backend behind url) and run the gate again"
            )

    def scrape(self, model: Optional[str], families: Optional[List[MetricFamily]] = None) -> SpecDecodeSnapshot:
        try:
            return spec_decode_snapshot(self.families() if families is None else families, model)
        except MetricsError as exc:
            raise GateError(f"{self.shown}/metrics: {exc}") from exc

    def complete(self, prompt: Prompt, workload: Workload) -> Tuple[Optional[str], int, str]:
        """Send one request of the workload; return (error or None, completion tokens, generated text)."""
        max_tokens = workload.max_tokens_of(prompt)
        payload: Dict[str, Any] = {
            "model": self.settings.model,
            "max_tokens": max_tokens,
            "temperature": 0 if workload.greedy else workload.temperature,
        }
        if workload.seed is not None:
            payload["seed"] = workload.seed
        if prompt.kind == "chat":
            path = "/v1/chat/completions"
            payload["messages"] = [dict(m) for m in prompt.messages or ()]
            if prompt.chat_template_kwargs:
                payload["chat_template_kwargs"] = dict(prompt.chat_template_kwargs)
        else:
            path = "/v1/completions"
            payload["prompt"] = prompt.prompt
        not_found = f"set model to a served model name (GET {self.shown}/v1/models lists them)"
        try:
            body = self._request(path, payload, MAX_COMPLETION_BYTES)
            answer = _untrusted_json.loads(body.decode("utf-8", "replace"))
        except _DeadlinePassed:
            return f"not sent or not finished before the gate's deadline of {self.deadline_seconds:g} s", 0, ""
        except _TooLarge as exc:
            return f"{exc} for one completion of max_tokens {max_tokens}; is url a vLLM server?", 0, ""
        except urllib.error.HTTPError as exc:
            if exc.code == 400:
                # vLLM's 400 is about the request: too long for the context, no chat template, bad kwargs.
                return (
                    f"prompt {prompt.id!r} of workload {workload.name!r} refused by the served model (HTTP 400 "
                    f"from {self.shown}{path}: {_error_detail(exc)}). Fix: change or drop that prompt (or its "
                    f"max_tokens) in the workload ({workload.source}), or serve a model that takes it",
                    0,
                    "",
                )
            return self.explain(exc, path, not_found), 0, ""
        except (OSError, http.client.HTTPException) as exc:
            return self.explain(exc, path, not_found), 0, ""
        except ValueError:
            # Nested past _untrusted_json.MAX_DEPTH too: json would recurse into a RecursionError.
            return f"{self.shown}{path} answered with something that is not JSON; is url a vLLM server?", 0, ""
        try:
            choice = answer["choices"][0]
            if prompt.kind == "chat":
                message = choice["message"]
                # With a reasoning parser the thinking comes apart from the answer; both are the output.
                text = (message.get("reasoning_content") or "") + (message.get("content") or "")
            else:
                text = choice["text"]
        except (KeyError, IndexError, TypeError, AttributeError):
            field_name = "choices[0].message" if prompt.kind == "chat" else "choices[0].text"
            return f"{self.shown}{path} answered without {field_name}; is url a vLLM server?", 0, ""
        usage = answer.get("usage") or {}
        tokens = usage.get("completion_tokens", 0) if isinstance(usage, dict) else None
        if tokens is None:
            tokens = 0
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            return (
                f"{self.shown}{path} answered with usage.completion_tokens {tokens!r}, not a count of "
                "tokens; is url a vLLM server?",
                0,
                "",
            )
        if not isinstance(text, str) or not text.strip():
            return "empty completion text: the server generated nothing; see the vLLM server log", tokens, ""
        return None, tokens, text


# ---------------------------------------------------------------------------------------------- the run


def _starts(started: Tuple[float, ...]) -> str:
    if not started:
        return "none"
    return ", ".join(f"{value:.2f} ({_start_time(value)})" for value in started)


def _start_time(value: float) -> str:
    """A process start as UTC, or as given when no clock can show it (the page is hostile or broken)."""
    try:
        return _utc(value)
    except (OverflowError, OSError, ValueError):
        return repr(value)


def _validate(settings: GateSettings) -> None:
    problems = []
    if not settings.model:
        problems.append("model is required (the served model name)")
    for name in ("requests", "max_tokens", "concurrency"):
        if getattr(settings, name) < 1:
            problems.append(f"{name} must be at least 1")
    if settings.min_drafts < 0:
        problems.append("min_drafts must be 0 or more")
    if settings.num_speculative_tokens is not None and settings.num_speculative_tokens < 1:
        problems.append("num_speculative_tokens must be at least 1 (the server's speculative_config value)")
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
    problems += settings.rules.problems()
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


def _percentiles(values: List[float]) -> Optional[Dict[str, float]]:
    """Nearest-rank p50/p90/p99 of client-side durations."""
    if not values:
        return None
    ordered = sorted(values)
    return {
        f"p{q}": round(ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))], 6)
        for q in (50, 90, 99)
    }


def _latency(
    before: List[MetricFamily], after: List[MetricFamily], model: str, durations: List[float]
) -> Dict[str, Any]:
    figures: Dict[str, Any] = {"e2e_seconds": _percentiles(durations), "source": "vllm /metrics histograms"}
    for key, names in (("ttft_seconds", TTFT_HISTOGRAMS), ("tpot_seconds", TPOT_HISTOGRAMS)):
        window = bucket_delta(histogram_buckets(before, names, model), histogram_buckets(after, names, model))
        figures[key] = latency_percentiles(window) if window else None
    return figures


def _workload_of(settings: GateSettings) -> Workload:
    if settings.workload is not None:
        return settings.workload
    prompts = list(settings.prompts) or list(DEFAULT_PROMPTS)
    return inline_workload(prompts, settings.requests, settings.max_tokens, settings.concurrency)


def plan_gate(settings: GateSettings, report_path: Optional[str] = None) -> Dict[str, Any]:
    """What run_gate would send and how it would judge, without a byte to the server (check mode).

    Runs every check that needs no traffic: the options (as run_gate refuses them), the url, the workload
    (already parsed into settings.workload) and the baseline (read by the caller from results_dir). The
    verdict itself is not predicted: it needs the server's counters after real traffic.
    """
    _validate(settings)
    url = display_url(_base_url(settings.url))
    workload = _workload_of(settings)
    absolute = [f"mean acceptance length >= {settings.min_mean_acceptance_length:g}"]
    absolute.append(f"at least {max(settings.min_drafts, 1)} drafts")
    if settings.min_draft_acceptance_rate is not None:
        absolute.append(f"draft acceptance rate >= {settings.min_draft_acceptance_rate:g}")
    if settings.num_speculative_tokens is not None:
        absolute.append(f"{settings.num_speculative_tokens} per-position counters")
    absolute.append("no failed request")
    rules = [rule for rule in RULES if rule not in settings.rules.disabled]
    if not settings.baseline_release:
        relative_skipped: Optional[str] = "no last good release (baseline_release) given"
    elif not settings.results_dir:
        relative_skipped = "no results_dir to read the last good release's result from"
    elif settings.baseline is None:
        relative_skipped = (
            f"no passed result of the last good release {settings.baseline_release!r} in {settings.results_dir}"
        )
    elif not rules:
        relative_skipped = "every relative rule is in disabled_rules"
    else:
        relative_skipped = None
    writes = []
    release = settings.identity.get("release")
    if settings.results_dir and release:
        writes.append(results_path(settings.results_dir, release))
    if report_path:
        writes.extend(report_paths(report_path))
    if relative_skipped is None:
        relative = f"relative rules {', '.join(rules)} against {settings.baseline_release!r}'s last passed result"
    else:
        relative = f"no relative rule ({relative_skipped})"
    message = (
        f"check mode: would send {workload.total_requests} requests of the workload {workload.name!r} "
        f"({workload.sha256}) to {url}, {workload.concurrency} at a time, within {gate_deadline(settings):g} s, "
        f"and judge against {', '.join(absolute)}; {relative}"
        + (f"; would write {', '.join(writes)}" if writes else "")
        + "; no traffic sent, so no verdict"
    )
    return {
        "url": url,
        "model": settings.model,
        "workload": {
            "name": workload.name,
            "sha256": workload.sha256,
            "requests": workload.total_requests,
            "concurrency": workload.concurrency,
            "max_tokens": workload.max_tokens,
            "source": workload.source,
        },
        "deadline": gate_deadline(settings),
        "thresholds": {
            "min_mean_acceptance_length": settings.min_mean_acceptance_length,
            "min_draft_acceptance_rate": settings.min_draft_acceptance_rate,
            "min_drafts": settings.min_drafts,
            "num_speculative_tokens": settings.num_speculative_tokens,
        },
        "relative": {
            "baseline_release": settings.baseline_release,
            "baseline_found": settings.baseline is not None,
            "rules": rules,
            "skipped": relative_skipped,
            "max_acceptance_drop": settings.rules.max_acceptance_drop,
            "max_position0_drop": settings.rules.max_position0_drop,
            "max_throughput_drop": settings.rules.max_throughput_drop,
            "min_identical_outputs": settings.rules.min_identical_outputs,
        },
        "would_write": writes,
        "message": message,
    }


def run_gate(settings: GateSettings) -> GateOutcome:
    """Run the workload against `settings.url` and judge it. Raises GateError when it cannot judge."""
    _validate(settings)
    server = _Server(settings)
    workload = _workload_of(settings)
    schedule = workload.schedule()
    started = time.time()
    families = server.families()
    model = _metrics_model_name(families, settings.model)
    before = server.scrape(model, families)
    identity = dict(settings.identity)
    if not identity.get("vllm_version"):
        identity["vllm_version"] = server.version()

    errors: collections.Counter[str] = collections.Counter()
    ok = completion_tokens = 0
    fingerprints: Dict[str, Dict[str, Any]] = {}
    unstable: List[str] = []
    durations: List[float] = []

    def timed(prompt: Prompt) -> Tuple[Optional[str], int, str, float]:
        begin = time.monotonic()
        error, tokens, text = server.complete(prompt, workload)
        return error, tokens, text, time.monotonic() - begin

    traffic_start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(workload.concurrency, len(schedule))) as pool:
        jobs = [(prompt, pool.submit(timed, prompt)) for prompt in schedule]
        for prompt, job in jobs:
            error, tokens, text, seconds = job.result()
            completion_tokens += tokens
            if error is not None:
                errors[error] += 1
                continue
            ok += 1
            durations.append(seconds)
            mark = fingerprint(text)
            seen = fingerprints.setdefault(prompt.id, mark)
            if seen["sha256"] != mark["sha256"] and prompt.id not in unstable:
                unstable.append(prompt.id)  # greedy yet not repeatable: batch-variant kernels, or not greedy
    traffic_seconds = time.monotonic() - traffic_start
    if server.remaining() <= 0:
        raise server.deadline_error()

    after = _settle(server, model, before, settings) if ok else server.scrape(model)
    latency = _latency(families, server.families(), model, durations)
    try:
        window = delta(before, after)
        stats = acceptance_stats(window)
        check_invariants(window, stats, settings.num_speculative_tokens)
    except MetricsError as exc:
        raise GateError(f"{server.shown}/metrics: {exc}") from exc
    requests = len(schedule)
    failed = requests - ok
    reasons = evaluate(stats, requests, failed, errors, settings)
    generated = window.generation_tokens
    report: Dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "url": server.shown,
        "model": settings.model,
        "metrics_model_name": model,
        "release": settings.identity.get("release"),
        "identity": identity,
        # The one server process every scrape came from (None: the page has no process collector).
        "server_started_at": [_start_time(value) for value in server.process_start] if server.process_start else None,
        "started_at": _utc(started),
        "finished_at": _utc(time.time()),
        "thresholds": {
            "min_mean_acceptance_length": settings.min_mean_acceptance_length,
            "min_draft_acceptance_rate": settings.min_draft_acceptance_rate,
            "min_drafts": settings.min_drafts,
            "max_acceptance_drop": settings.rules.max_acceptance_drop,
            "max_position0_drop": settings.rules.max_position0_drop,
            "max_throughput_drop": settings.rules.max_throughput_drop,
            "min_identical_outputs": settings.rules.min_identical_outputs,
            "disabled_rules": sorted(settings.rules.disabled),
        },
        "workload": {
            "name": workload.name,
            "sha256": workload.sha256,
            "source": workload.source,
            "greedy": workload.greedy,
            "temperature": workload.temperature,
            "seed": workload.seed,
            "prompts": len(workload.prompts),
            "chat_prompts": sum(1 for p in workload.prompts if p.kind == "chat"),
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
        "latency": latency,
        "fingerprints": fingerprints,
        "unstable_outputs": unstable,
        "traffic_seconds": round(traffic_seconds, 3),
        "requests": requests,
        "requests_ok": ok,
        "requests_failed": failed,
        "errors": [{"error": text, "count": count} for text, count in errors.most_common()],
        "concurrency": workload.concurrency,
        "max_tokens": workload.max_tokens,
        "prompts": len(workload.prompts),
        "prompt_set": (
            workload.name if settings.workload is not None else ("custom" if settings.prompts else "default")
        ),
        "parser": "prometheus_client" if library_parser_available() else "stdlib",
    }
    comparison = compare(report, settings.baseline, settings.baseline_release, settings.rules, settings.results_dir)
    reasons += comparison.reasons
    passed = not reasons
    report.update(passed=passed, verdict="pass" if passed else "fail", reasons=reasons)
    report["relative"] = comparison.as_dict()
    report["baseline"] = _baseline_summary(comparison)
    report["message"] = _message(report, comparison, settings, server.shown, stats)
    return GateOutcome(passed, report["message"], report)


# What of the last good release's result the report keeps for the side-by-side table (not its history).
_BASELINE_FIELDS = (
    "release", "identity", "started_at", "workload", "mean_acceptance_length", "mean_acceptance_length_ci95",
    "draft_acceptance_rate", "per_position_acceptance", "drafts", "tokens_per_second", "latency", "verdict",
)  # fmt: skip


def _baseline_summary(comparison: Comparison) -> Optional[Dict[str, Any]]:
    if comparison.baseline is None:
        return None
    summary = {k: comparison.baseline.get(k) for k in _BASELINE_FIELDS}
    summary["release"] = comparison.baseline_release
    return summary


def _message(
    report: Dict[str, Any], comparison: Comparison, settings: GateSettings, shown: str, stats: AcceptanceStats
) -> str:
    if report["passed"]:
        message = (
            f"acceptance gate passed for {settings.model} at {shown}: mean acceptance length "
            f"{_ci_text(stats)} >= {settings.min_mean_acceptance_length:.2f} over {stats.drafts} drafts"
        )
        applied = [c["message"] for c in comparison.checks if c["status"] == "pass"]
        if applied:
            message += "; " + "; ".join(applied)
    else:
        message = f"acceptance gate FAILED for {settings.model} at {shown}: " + "; ".join(report["reasons"])
    if comparison.skipped:
        message += f"; relative rules skipped: {comparison.skipped}"
    else:
        skipped = [c["message"] for c in comparison.checks if c["status"] == "skipped"]
        if skipped:
            message += "; " + "; ".join(skipped)
    return message


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


def _length_text(result: Dict[str, Any]) -> str:
    text = _number(result.get("mean_acceptance_length"), ".2f")
    ci = result.get("mean_acceptance_length_ci95")
    if ci:
        text += f" (95% CI {ci[0]:.2f}-{ci[1]:.2f})"
    return text


def _latency_text(result: Dict[str, Any], key: str) -> str:
    figures = (result.get("latency") or {}).get(key)
    if not figures:
        return "n/a"
    return " / ".join(f"{figures[p] * 1000:.1f}" for p in ("p50", "p90", "p99")) + " ms"


def _chart(rates: Sequence[float]) -> List[str]:
    digits = len(str(max(len(rates) - 1, 0)))
    return ["```text"] + [f"pos {i:<{digits}d} {_bar(rate)} {rate:.2f}" for i, rate in enumerate(rates)] + ["```"]


def render_markdown(report: Dict[str, Any]) -> str:
    """The report for people: verdict, figures against thresholds and beside the last good release,
    per-position bars of each, the relative rules, reasons."""
    thresholds = report["thresholds"]
    min_rate = thresholds["min_draft_acceptance_rate"]
    workload = report.get("workload") or {}
    identity = report.get("identity") or {}
    lines = [
        f"# DFlash acceptance gate: {'PASSED' if report['passed'] else 'FAILED'}",
        "",
        f"- server: {report['url']}",
        f"- model: `{report['model']}` (metrics model_name `{report['metrics_model_name']}`)",
        f"- release: {report.get('release') or 'n/a'}"
        + (f" (vLLM {identity.get('vllm_version')}, commit {identity.get('vllm_commit')})" if identity else ""),
        f"- time: {report['started_at']} to {report['finished_at']} (traffic {report['traffic_seconds']:.2f} s)",
        f"- workload: `{workload.get('name')}` sha256 `{workload.get('sha256')}` ({workload.get('source')}): "
        f"{report['requests']} requests over {report['prompts']} prompts ({workload.get('chat_prompts', 0)} chat), "
        f"concurrency {report['concurrency']}, max_tokens {report['max_tokens']}, "
        f"temperature {workload.get('temperature', 0):g}, seed {workload.get('seed')}",
        "",
        "| figure | measured | threshold |",
        "|---|---|---|",
        f"| mean acceptance length | {_length_text(report)} | >= {thresholds['min_mean_acceptance_length']:.2f} |",
        f"| draft acceptance rate | {_number(report['draft_acceptance_rate'], '.3f')} | "
        + ("not set" if min_rate is None else f">= {min_rate:.3f}")
        + " |",
        f"| drafts | {report['drafts']} | >= {thresholds['min_drafts']} |",
        f"| failed requests | {report['requests_failed']} of {report['requests']} | 0 |",
        f"| draft tokens / accepted tokens | {report['draft_tokens']} / {report['accepted_tokens']} | |",
        f"| generation tokens/s | {_number(report['tokens_per_second'], '.1f')} | |",
        f"| TTFT p50 / p90 / p99 | {_latency_text(report, 'ttft_seconds')} | |",
        f"| TPOT p50 / p90 / p99 | {_latency_text(report, 'tpot_seconds')} | |",
        "",
    ]
    baseline = report.get("baseline")
    relative = report.get("relative") or {}
    if baseline:
        this, last = report.get("release") or "this release", baseline.get("release") or "last good"
        rows = (
            ("mean acceptance length", _length_text(report), _length_text(baseline)),
            (
                "position-0 acceptance",
                _number((report["per_position_acceptance"] or [None])[0], ".3f"),
                _number((baseline.get("per_position_acceptance") or [None])[0], ".3f"),
            ),
            ("draft acceptance rate", _number(report["draft_acceptance_rate"], ".3f"),
             _number(baseline.get("draft_acceptance_rate"), ".3f")),
            ("generation tokens/s", _number(report["tokens_per_second"], ".1f"),
             _number(baseline.get("tokens_per_second"), ".1f")),
            ("TTFT p50 / p90 / p99", _latency_text(report, "ttft_seconds"), _latency_text(baseline, "ttft_seconds")),
            ("TPOT p50 / p90 / p99", _latency_text(report, "tpot_seconds"), _latency_text(baseline, "tpot_seconds")),
            ("drafts", str(report["drafts"]), str(baseline.get("drafts"))),
            ("vLLM", str(identity.get("vllm_version")), str((baseline.get("identity") or {}).get("vllm_version"))),
            ("measured", report["started_at"], str(baseline.get("started_at"))),
        )  # fmt: skip
        lines += ["## Against the last good release", "", f"| figure | {this} | {last} (last good) |", "|---|---|---|"]
        lines += [f"| {name} | {new} | {old} |" for name, new, old in rows] + [""]
    if relative.get("checks"):
        lines += ["## Relative rules", "", "| rule | result | detail |", "|---|---|---|"]
        lines += [f"| {c['rule']} | {c['status']} | {c['message']} |" for c in relative["checks"]] + [""]
    if relative.get("skipped"):
        lines += [f"Relative rules skipped: {relative['skipped']}.", ""]
    if report["per_position_acceptance"]:
        title = f" ({report.get('release')})" if baseline else ""
        lines += [f"## Acceptance rate per draft position{title}", "", *_chart(report["per_position_acceptance"])]
        lines.append("")
    if baseline and baseline.get("per_position_acceptance"):
        lines += [f"## Acceptance rate per draft position ({baseline.get('release')}, last good)", ""]
        lines += [*_chart(baseline["per_position_acceptance"]), ""]
    if report["reasons"]:
        lines += ["## Why it failed", ""] + [f"- {reason}" for reason in report["reasons"]] + [""]
    if report["errors"]:
        lines += ["## Request errors", ""] + [f"- {e['count']} x {e['error']}" for e in report["errors"]] + [""]
    if report.get("unstable_outputs"):
        lines += [
            "Greedy outputs that differed between repeats of the same prompt in this run: "
            + ", ".join(report["unstable_outputs"]),
            "",
        ]
    lines.append(
        f"Mean acceptance length = 1 + accepted/drafts over the window of this run ({report['ci_method']} "
        "interval); see docs/gate-report.md."
    )
    return "\n".join(lines) + "\n"


def summary_line(report: Dict[str, Any], report_path: Optional[str] = None) -> str:
    """One line for the end of a deploy: release, commit, AL (CI95) vs the last good, tokens/s, verdict, report."""
    identity = report.get("identity") or {}
    baseline = report.get("baseline")
    relative = report.get("relative") or {}
    commit = str(identity.get("vllm_commit") or "?")[:12]
    versus = f"vs {_length_text(baseline)} of last good {baseline.get('release')}" if baseline else "vs none"
    if relative.get("skipped_short"):
        versus += f" (relative rules skipped: {relative['skipped_short']})"
    tokens = _number(report.get("tokens_per_second"), ".1f") + " tokens/s"
    if baseline:
        tokens += f" (last good {_number(baseline.get('tokens_per_second'), '.1f')})"
    markdown = report_paths(report_path)[1] if report_path else "none"
    return (
        f"release {report.get('release') or '?'} commit {commit}: AL {_length_text(report)} {versus}, "
        f"{tokens}, verdict {report['verdict'].upper()}, report {markdown}"
    )


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
