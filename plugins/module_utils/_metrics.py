# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's /metrics page -> speculative-decoding counters -> acceptance figures.

Parsing is _metrics_parse's (prometheus_client's parser when the host has it, else the standard library's);
its names stay importable from here. Standard library only: this runs on the target's system Python (3.8+).

The formulas are vLLM's own (vllm/v1/spec_decode/metrics.py), taken over a window of counter deltas:
    mean acceptance length  = 1 + accepted_tokens / drafts        (the 1 is the bonus token)
    draft acceptance rate   = accepted_tokens / draft_tokens
    per-position rate[i]    = accepted_per_position[i] / drafts
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._metrics_parse import (
    MetricFamily,
    MetricsError,
    Sample,
    library_parser_available,
    parse_metrics,
)

__all__ = [
    "AcceptanceStats",
    "MetricFamily",
    "MetricsError",
    "Sample",
    "SpecDecodeSnapshot",
    "acceptance_stats",
    "bucket_delta",
    "check_invariants",
    "delta",
    "histogram_buckets",
    "histogram_quantile",
    "latency_percentiles",
    "library_parser_available",
    "parse_metrics",
    "process_start_times",
    "spec_decode_model_names",
    "spec_decode_snapshot",
]

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
# prometheus_client's process collector, which vLLM's API server registers (absent in multiprocess mode).
PROCESS_START = "process_start_time_seconds"

# z for a two-sided 95% normal interval.
Z95 = 1.959963984540054


# ------------------------------------------------------------------------------------------ snapshots


@dataclass(frozen=True)
class SpecDecodeSnapshot:
    """Spec-decode counters of one scrape (or the difference of two), summed over engines.

    `generation_tokens`/`prompt_tokens` are None when the page lacks them.
    """

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: Tuple[float, ...]
    generation_tokens: Optional[float] = None
    prompt_tokens: Optional[float] = None


_NO_SPEC = (
    "no spec-decode counters: speculative decoding is not enabled on this server "
    f"(its /metrics has no {DRAFTS}); start vLLM with a speculative config (e.g. method: dflash)"
)


def _samples(families: Iterable[MetricFamily], names: Sequence[str]) -> Iterable[Sample]:
    for family in families:
        for sample in family.samples:
            if sample.name in names:
                yield sample


def process_start_times(families: Iterable[MetricFamily]) -> Tuple[float, ...]:
    """The page's `process_start_time_seconds` values, sorted: which server process answered (empty: unknown)."""
    return tuple(sorted(sample.value for sample in _samples(families, (PROCESS_START,))))


def spec_decode_model_names(families: Sequence[MetricFamily]) -> List[str]:
    """The `model_name` labels the server reports spec-decode counters for."""
    return sorted({s.labels.get("model_name", "") for s in _samples(families, (DRAFTS,))})


def spec_decode_snapshot(families: Sequence[MetricFamily], model_name: Optional[str] = None) -> SpecDecodeSnapshot:
    """Sum the spec-decode and token counters over all engines (and other labels).

    `model_name` keeps only series with that `model_name` label. Raises MetricsError when the page has
    no spec-decode counters at all, or none for `model_name`.
    """
    wanted = (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS, ACCEPTED_PER_POSITION, GENERATION_TOKENS, PROMPT_TOKENS)
    totals: Dict[str, float] = {}
    per_position: Dict[int, float] = {}
    for sample in _samples(families, wanted):
        if model_name is not None and sample.labels.get("model_name") != model_name:
            continue
        if sample.name == ACCEPTED_PER_POSITION:
            try:
                position = int(sample.labels["position"])
            except (KeyError, ValueError):
                raise MetricsError(
                    f"{ACCEPTED_PER_POSITION} has a sample without an integer `position` label "
                    f"({sample.labels}); this vLLM's metrics are not understood by this gate"
                ) from None
            per_position[position] = per_position.get(position, 0.0) + sample.value
        else:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    # NaN, Inf or a negative count is no counter state vLLM can be in (and NaN defeats every comparison).
    bad = sorted(
        f"{name}={value!r}"
        for name, value in list(totals.items())
        + [(f"{ACCEPTED_PER_POSITION}[{i}]", v) for i, v in per_position.items()]
        if not math.isfinite(value) or value < 0
    )
    if bad:
        raise MetricsError(
            f"impossible counter values ({', '.join(bad)}): counters are finite and never negative; the server "
            "or a proxy in front of it reports garbage, so the gate cannot judge. Fix: check what serves url"
        )
    missing = [name for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS) if name not in totals]
    if missing:
        available = spec_decode_model_names(families)
        if not available:
            raise MetricsError(_NO_SPEC)
        if model_name is not None and model_name not in available:
            raise MetricsError(
                f"no spec-decode counters for model_name {model_name!r}; this server reports them for "
                f"{', '.join(repr(n) for n in available)}: set model to the served model name"
            )
        raise MetricsError(f"the /metrics page lacks {', '.join(missing)}; this vLLM's metrics are not understood")
    width = max(per_position) + 1 if per_position else 0
    return SpecDecodeSnapshot(
        drafts=totals[DRAFTS],
        draft_tokens=totals[DRAFT_TOKENS],
        accepted_tokens=totals[ACCEPTED_TOKENS],
        accepted_per_position=tuple(per_position.get(i, 0.0) for i in range(width)),
        generation_tokens=totals.get(GENERATION_TOKENS),
        prompt_tokens=totals.get(PROMPT_TOKENS),
    )


def delta(before: SpecDecodeSnapshot, after: SpecDecodeSnapshot) -> SpecDecodeSnapshot:
    """Counters of the window between two scrapes. A counter that went down means the server restarted."""

    def diff(name: str, old: float, new: float) -> float:
        if new < old:
            raise MetricsError(
                f"counter {name} went down ({old:g} -> {new:g}): the vLLM server restarted (or its engine was "
                "replaced) during the gate; wait until it is stable and run the gate again"
            )
        return new - old

    def optional_diff(name: str, old: Optional[float], new: Optional[float]) -> Optional[float]:
        return None if old is None or new is None else diff(name, old, new)

    def position(values: Tuple[float, ...], i: int) -> float:
        return values[i] if i < len(values) else 0.0  # a position not exposed yet has counted nothing

    width = max(len(before.accepted_per_position), len(after.accepted_per_position))
    return SpecDecodeSnapshot(
        drafts=diff(DRAFTS, before.drafts, after.drafts),
        draft_tokens=diff(DRAFT_TOKENS, before.draft_tokens, after.draft_tokens),
        accepted_tokens=diff(ACCEPTED_TOKENS, before.accepted_tokens, after.accepted_tokens),
        accepted_per_position=tuple(
            diff(
                f'{ACCEPTED_PER_POSITION}{{position="{i}"}}',
                position(before.accepted_per_position, i),
                position(after.accepted_per_position, i),
            )
            for i in range(width)
        ),
        generation_tokens=optional_diff(GENERATION_TOKENS, before.generation_tokens, after.generation_tokens),
        prompt_tokens=optional_diff(PROMPT_TOKENS, before.prompt_tokens, after.prompt_tokens),
    )


# ---------------------------------------------------------------------------------------- invariants


def check_invariants(
    window: SpecDecodeSnapshot, stats: AcceptanceStats, num_speculative_tokens: Optional[int] = None
) -> None:
    """Refuse a window no vLLM can produce, naming each counter and its figures.

    vLLM (v1/spec_decode/metrics.py) exports one accepted-per-position series per position 0..K-1
    (K = num_speculative_tokens) from the start, and counts, per draft of at most K proposed tokens, the
    accepted prefix: the positions 0..A-1 each once (SpecDecodingStats.observe_draft). So over any window:
    the positions number K; the per-position counts sum to the accepted tokens; a count never grows with
    the position (position i+1 is accepted only where i was); each is at most the drafts; accepted <= draft
    tokens <= drafts * K; and the mean acceptance length is at most 1 + K. Deltas below 0 are refused by
    delta() (a restart), NaN/Inf/negative values by spec_decode_snapshot().
    """
    problems = []
    per_position = window.accepted_per_position
    width = len(per_position)
    if window.accepted_tokens > window.draft_tokens:
        problems.append(
            f"accepted tokens {window.accepted_tokens:g} > draft tokens {window.draft_tokens:g} "
            f"({ACCEPTED_TOKENS} > {DRAFT_TOKENS})"
        )
    if num_speculative_tokens is not None and width != num_speculative_tokens:
        problems.append(
            f"{ACCEPTED_PER_POSITION} has {width} positions, but the server runs num_speculative_tokens "
            f"{num_speculative_tokens} (vLLM exports one series per speculative token)"
        )
    if not width and (window.drafts or window.draft_tokens or window.accepted_tokens):
        problems.append(
            f"{window.drafts:g} drafts but no {ACCEPTED_PER_POSITION} series (vLLM exports one per speculative "
            "token from the start)"
        )
    if width:
        accepted_sum = sum(per_position)
        if accepted_sum != window.accepted_tokens:
            problems.append(
                f"{ACCEPTED_PER_POSITION} sums to {accepted_sum:g}, but {ACCEPTED_TOKENS} counted "
                f"{window.accepted_tokens:g} (each accepted token is counted at its position)"
            )
        for i in range(1, width):
            if per_position[i] > per_position[i - 1]:
                problems.append(
                    f"{ACCEPTED_PER_POSITION} position {i} accepted {per_position[i]:g} > position {i - 1} "
                    f"{per_position[i - 1]:g} (a token is accepted only after every earlier one)"
                )
        if window.draft_tokens > window.drafts * width:
            problems.append(
                f"{DRAFT_TOKENS} {window.draft_tokens:g} > drafts {window.drafts:g} * K {width} (a draft proposes "
                "at most K tokens)"
            )
    for i, count in enumerate(per_position):
        if count > window.drafts:
            problems.append(f"position {i} accepted {count:g} times in {window.drafts:g} drafts")
    if width:
        length = stats.mean_acceptance_length
        if length is not None and length > 1 + width + 1e-9:
            problems.append(f"mean acceptance length {length:.2f} > 1 + K = {1 + width} (K = {width} positions)")
    interval = stats.mean_acceptance_length_ci95
    if interval is not None and stats.mean_acceptance_length is not None:
        low, high = interval
        if not low <= stats.mean_acceptance_length <= high:
            problems.append(
                f"95% interval [{low:.2f}, {high:.2f}] does not hold the mean acceptance length "
                f"{stats.mean_acceptance_length:.2f}"
            )
    if problems:
        raise MetricsError(
            "impossible spec-decode counters over the gate's window: "
            + "; ".join(problems)
            + ". vLLM cannot count this; the server (or a proxy in front of it) reports wrong metrics, so the "
            "gate cannot judge. Fix: check what serves url and its vLLM version"
        )


# ---------------------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class AcceptanceStats:
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    mean_acceptance_length: Optional[float]
    mean_acceptance_length_ci95: Optional[Tuple[float, float]]
    draft_acceptance_rate: Optional[float]
    per_position_acceptance: Tuple[float, ...]
    ci_method: str


def acceptance_stats(window: SpecDecodeSnapshot) -> AcceptanceStats:
    """vLLM's acceptance figures over a window, plus a 95% interval for the mean acceptance length.

    Interval: each draft accepts A tokens, A in [0, K]; acceptance is a prefix (position i is accepted
    only if every earlier one was), so P(A >= i+1) = rate[i] and
        E[A] = sum(rate[i]),   E[A^2] = sum((2i+1) * rate[i]),   var(A) = E[A^2] - E[A]^2,
    exactly, from the per-position counters alone. The interval is AL +- z95 * sqrt(s^2 / drafts) with the
    unbiased s^2 = var * n/(n-1), clipped to [1, 1+K]. It treats drafts as independent, which drafts of
    one request are not quite: read it as the counting noise, not a bound on prompt-set variation.
    Without per-position counters, the Bhatia-Davis bound var <= m(K-m) for A in [0, K] is used instead,
    with K = the largest draft length implied by draft_tokens/drafts (rounded up).
    """
    drafts = window.drafts
    if drafts <= 0:
        return AcceptanceStats(
            0, round(window.draft_tokens), round(window.accepted_tokens), None, None, None, (), "none"
        )
    rates = tuple(c / drafts for c in window.accepted_per_position)
    mean_accepted = window.accepted_tokens / drafts
    mean_length = 1.0 + mean_accepted
    rate = window.accepted_tokens / window.draft_tokens if window.draft_tokens > 0 else None
    if rates:
        width = len(rates)
        first = sum(rates)
        second = sum((2 * i + 1) * r for i, r in enumerate(rates))
        variance = second - first * first
        method = "prefix"
    else:
        width = math.ceil(window.draft_tokens / drafts)
        variance = mean_accepted * (width - mean_accepted)
        method = "bhatia-davis"
    variance = max(variance, 0.0)
    if drafts > 1:
        variance *= drafts / (drafts - 1)
    half = Z95 * math.sqrt(variance / drafts)
    interval = (max(1.0, mean_length - half), min(1.0 + width, mean_length + half))
    return AcceptanceStats(
        drafts=round(drafts),
        draft_tokens=round(window.draft_tokens),
        accepted_tokens=round(window.accepted_tokens),
        mean_acceptance_length=mean_length,
        mean_acceptance_length_ci95=interval,
        draft_acceptance_rate=rate,
        per_position_acceptance=rates,
        ci_method=method,
    )


# ------------------------------------------------------------------------------------------ latency

# vLLM's latency histograms; the TPOT one was renamed in 0.11 (request_time_per_output_token_seconds),
# the older name is read when the newer is absent.
TTFT_HISTOGRAMS = ("vllm:time_to_first_token_seconds",)
TPOT_HISTOGRAMS = ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds")
QUANTILES = (0.5, 0.9, 0.99)


def histogram_buckets(
    families: Sequence[MetricFamily], names: Sequence[str], model_name: Optional[str] = None
) -> Optional[Dict[float, float]]:
    """Cumulative bucket counts {upper bound: count} of the first histogram of `names` the page has,
    summed over engines; None when it has none of them."""
    for name in names:
        buckets: Dict[float, float] = {}
        for sample in _samples(families, (name + "_bucket",)):
            if model_name is not None and sample.labels.get("model_name") != model_name:
                continue
            try:
                bound = float(sample.labels["le"])
            except (KeyError, ValueError):
                continue
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
        if buckets:
            return buckets
    return None


def bucket_delta(before: Optional[Dict[float, float]], after: Optional[Dict[float, float]]) -> Dict[float, float]:
    """Bucket counts of the window; empty when the page lacks the histogram or it went backwards (restart).
    A histogram absent before and present after (the server's first requests) counts from zero."""
    if not after:
        return {}
    before = before or {}
    window = {bound: count - before.get(bound, 0.0) for bound, count in after.items()}
    return {} if any(v < 0 for v in window.values()) else window


def histogram_quantile(q: float, buckets: Dict[float, float]) -> Optional[float]:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket that holds rank q * count.

    None without observations; the highest finite bound when the rank falls in the +Inf bucket.
    """
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, count
    return lower  # pragma: no cover - the +Inf bucket holds every observation


def latency_percentiles(buckets: Dict[float, float]) -> Optional[Dict[str, float]]:
    """{"p50": s, "p90": s, "p99": s} of a window's histogram, None without observations."""
    values = {f"p{round(q * 100)}": histogram_quantile(q, buckets) for q in QUANTILES}
    if any(v is None for v in values.values()):
        return None
    return {k: round(float(v), 6) for k, v in values.items() if v is not None}
