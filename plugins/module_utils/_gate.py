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

This file is the run and the verdict; the HTTP client of the server is _gate_client, the markdown report and
the summary line _gate_report.
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate_client import (
    GateError,
    Server,
    base_url,
    display_url,
    start_time,
    utc,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate_history import (
    RULES,
    Comparison,
    RelativeRules,
    compare,
    fingerprint,
    results_path,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate_report import report_paths
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
    spec_decode_model_names,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._prompts import DEFAULT_PROMPTS
from ansible_collections.vllm_ops.dflash.plugins.module_utils._workload import Prompt, Workload, inline_workload

__all__ = [
    "GateError",
    "GateOutcome",
    "GateSettings",
    "evaluate",
    "gate_deadline",
    "run_gate",
]

REPORT_SCHEMA = 2


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


def _settle(
    server: Server, model: Optional[str], before: SpecDecodeSnapshot, settings: GateSettings
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
    url = display_url(base_url(settings.url))
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
    server = Server(
        settings.url, settings.model, settings.api_key, settings.timeout, settings.validate_certs,
        gate_deadline(settings),
    )  # fmt: skip
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
        "server_started_at": [start_time(value) for value in server.process_start] if server.process_start else None,
        "started_at": utc(started),
        "finished_at": utc(time.time()),
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
