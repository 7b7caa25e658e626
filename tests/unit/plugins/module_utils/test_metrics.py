# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import math
import random
import re
import statistics
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._metrics import (
    Z95,
    MetricsError,
    SpecDecodeSnapshot,
    acceptance_stats,
    delta,
    parse_metrics,
    spec_decode_model_names,
    spec_decode_snapshot,
)

PAGES = Path(__file__).resolve().parents[2] / "data" / "metrics"
REAL_PAGES = sorted(p.name for p in PAGES.glob("*.metrics.txt"))
SPEC_COUNTER_LINE = re.compile(r"^vllm:(spec_decode_num_\w+|generation_tokens|prompt_tokens)_total\{.*$", re.M)


def page(name: str) -> str:
    return (PAGES / f"{name}.metrics.txt").read_text()


def comparable(families):
    """Families as plain tuples; NaN as a string so that equal pages compare equal."""
    return [
        (
            f.name,
            f.type,
            f.documentation,
            [(s.name, sorted(s.labels.items()), repr(s.value), s.timestamp) for s in f.samples],
        )
        for f in families
    ]


def with_copies(text: str, old: str, new: str, factor: float) -> str:
    """After each spec-decode/token counter line, add a copy with `old` -> `new` and the value times `factor`."""

    def copy(match: re.Match) -> str:
        line = match.group(0)
        head, value = line.rsplit(" ", 1)
        return f"{line}\n{head.replace(old, new)} {float(value) * factor}"

    return SPEC_COUNTER_LINE.sub(copy, text)


# ------------------------------------------------------------------------------------------------ parsing


def test_real_pages_are_present():
    assert REAL_PAGES == [
        "base.metrics.txt",
        "dflash.metrics.txt",
        "dflash_synth.metrics.txt",
        "draft.metrics.txt",
        "ngram.metrics.txt",
        "synth.metrics.txt",
    ]


@pytest.mark.parametrize("name", REAL_PAGES)
def test_both_parsers_give_identical_families_on_real_pages(name):
    text = (PAGES / name).read_text()
    library = parse_metrics(text, use_library=True)
    stdlib = parse_metrics(text, use_library=False)
    assert comparable(stdlib) == comparable(library)
    assert len(library) > 80  # the whole page, not just the first family


EDGE_PAGE = r"""# HELP esc_total Help with \\ backslash and \n newline
# TYPE esc_total counter
esc_total{path="C:\\dir",quote="say \"hi\"",nl="a\nb",odd="\q"} 1.5e3 1700000000000
esc_total{ path = "x" , }  -2E-2
# TYPE plain counter
plain 7
# TYPE g gauge
g{v="nan"} NaN
g{v="inf"} +Inf
g{v="ninf"} -Inf
#  just a comment
#HELP notahelp line
untyped_metric{a="b"} 3
# TYPE s summary
s{quantile="0.5"} 1
s_sum 10
s_count 2
# TYPE h histogram
h_bucket{le="1.0"} 1
h_bucket{le="+Inf"} 2
h_sum 3
h_count 2
h_created 1.7e9
"""


def test_both_parsers_agree_on_edge_cases():
    assert comparable(parse_metrics(EDGE_PAGE, use_library=False)) == comparable(
        parse_metrics(EDGE_PAGE, use_library=True)
    )


def test_stdlib_parser_edge_cases():
    families = {f.name: f for f in parse_metrics(EDGE_PAGE, use_library=False)}
    esc = families["esc"]
    assert esc.type == "counter"
    assert esc.documentation == "Help with \\ backslash and \n newline"
    first, second = esc.samples
    assert first.labels == {"path": "C:\\dir", "quote": 'say "hi"', "nl": "a\nb", "odd": "\\q"}
    assert (first.value, first.timestamp) == (1500.0, 1700000000.0)
    assert (second.labels, second.value, second.timestamp) == ({"path": "x"}, -0.02, None)
    # a counter declared without _total: family keeps the name, samples get _total
    assert [s.name for s in families["plain"].samples] == ["plain_total"]
    values = {s.labels["v"]: s.value for s in families["g"].samples}
    assert math.isnan(values["nan"]) and values["inf"] == math.inf and values["ninf"] == -math.inf
    assert families["untyped_metric"].type == "unknown"
    assert [s.name for s in families["s"].samples] == ["s", "s_sum", "s_count"]
    assert [s.name for s in families["h"].samples] == ["h_bucket", "h_bucket", "h_sum", "h_count"]
    # a sample outside its declared family is an untyped family of its own
    assert families["h_created"].type == "unknown"
    assert "notahelp" not in families


@pytest.mark.parametrize(
    "line, problem",
    [
        ('m{a="unterminated} 1', "unterminated label value"),
        ('m{a="x"} ', "expected"),
        ("m 1_000", "invalid number"),
        ('m{a="x",a="y"} 1', "duplicate label"),
        ("m{a=x} 1", "unquoted value"),
        ("m 1 2 3", "expected"),
        ("9m 1", "no metric name"),
        ("# TYPE m2 countr", "unknown metric type"),
    ],
)
def test_stdlib_parser_rejects_malformed_lines(line, problem):
    with pytest.raises(MetricsError, match=rf"line 2: .*{problem}.*is the URL a vLLM server\?"):
        parse_metrics("# TYPE m gauge\n" + line + "\n", use_library=False)


def test_library_parser_errors_become_metrics_errors():
    with pytest.raises(MetricsError, match="not valid Prometheus text"):
        parse_metrics('m{a="x",a="y"} 1\n', use_library=True)


# --------------------------------------------------------------------------------------------- snapshots


@pytest.mark.parametrize(
    "name, length, rate, per_position",
    [
        # the figures of the fixtures' README (vLLM 0.26.0 on an H200)
        ("dflash_synth", 3.0, 840 / 2940, [1, 1, 0, 0, 0, 0, 0]),
        ("synth", 2.9953, 856 / 1716, [0.80, 0.61, 0.40, 0.19]),
        ("ngram", 2.2618, 429 / 999, [0.68, 0.31, 0.18, 0.09]),
        ("draft", 4.98, 1040 / 1044, [0.996] * 4),
        ("dflash", 1.0, 0.0, [0] * 7),
    ],
)
@pytest.mark.parametrize("use_library", [True, False])
def test_real_page_figures(name, length, rate, per_position, use_library):
    stats = acceptance_stats(spec_decode_snapshot(parse_metrics(page(name), use_library), "tiny"))
    assert stats.mean_acceptance_length == pytest.approx(length, abs=5e-3 if name == "draft" else 5e-5)
    assert stats.draft_acceptance_rate == pytest.approx(rate)
    assert stats.per_position_acceptance == pytest.approx(per_position, abs=0.005)
    low, high = stats.mean_acceptance_length_ci95
    assert low <= stats.mean_acceptance_length <= high


def test_dflash_synth_snapshot_counters():
    snapshot = spec_decode_snapshot(parse_metrics(page("dflash_synth")))
    assert snapshot == SpecDecodeSnapshot(420, 2940, 840, (420, 420, 0, 0, 0, 0, 0), 1280, 238)
    # synthetic acceptance is deterministic: every draft accepts exactly 2, so the interval is a point
    assert acceptance_stats(snapshot).mean_acceptance_length_ci95 == (3.0, 3.0)


@pytest.mark.parametrize("use_library", [True, False])
def test_base_page_has_no_spec_decode_counters(use_library):
    with pytest.raises(MetricsError) as error:
        spec_decode_snapshot(parse_metrics(page("base"), use_library), "tiny")
    assert str(error.value).startswith("no spec-decode counters: speculative decoding is not enabled on this server")
    assert "speculative config" in str(error.value)


def test_counters_are_summed_over_engines():
    text = with_copies(page("ngram"), 'engine="0"', 'engine="1"', 2)
    for use_library in (True, False):
        snapshot = spec_decode_snapshot(parse_metrics(text, use_library), "tiny")
        assert (snapshot.drafts, snapshot.draft_tokens, snapshot.accepted_tokens) == (3 * 340, 3 * 999, 3 * 429)
        assert snapshot.accepted_per_position == (3 * 230, 3 * 105, 3 * 62, 3 * 32)
        assert (snapshot.generation_tokens, snapshot.prompt_tokens) == (3 * 1280, 3 * 238)


def test_model_name_filter():
    families = parse_metrics(with_copies(page("ngram"), 'model_name="tiny"', 'model_name="other"', 2))
    assert spec_decode_model_names(families) == ["other", "tiny"]
    assert spec_decode_snapshot(families, "tiny").drafts == 340
    assert spec_decode_snapshot(families, "other").drafts == 680
    assert spec_decode_snapshot(families).drafts == 1020
    with pytest.raises(
        MetricsError, match=r"no spec-decode counters for model_name 'qwen'.*'other', 'tiny'.*set model"
    ):
        spec_decode_snapshot(families, "qwen")


def test_position_label_must_be_an_integer():
    text = page("ngram").replace('position="2"', 'position="two"')
    with pytest.raises(MetricsError, match="integer `position` label"):
        spec_decode_snapshot(parse_metrics(text))


# ------------------------------------------------------------------------------------------------- delta


def test_delta_is_the_window_between_scrapes():
    before = SpecDecodeSnapshot(100, 700, 150, (80, 50, 20), 1000, 300)
    after = SpecDecodeSnapshot(160, 1120, 270, (130, 90, 45, 5), 1500, 420)
    assert delta(before, after) == SpecDecodeSnapshot(60, 420, 120, (50, 40, 25, 5), 500, 120)


def test_delta_without_token_counters():
    window = delta(SpecDecodeSnapshot(1, 7, 2, ()), SpecDecodeSnapshot(3, 21, 6, (), 10, None))
    assert (window.generation_tokens, window.prompt_tokens) == (None, None)


@pytest.mark.parametrize(
    "after",
    [
        SpecDecodeSnapshot(10, 700, 150, (80, 50, 20)),
        SpecDecodeSnapshot(100, 700, 150, (80, 49, 20)),
        SpecDecodeSnapshot(100, 700, 150, (80, 50, 20), generation_tokens=3),
    ],
)
def test_counter_reset_is_a_clear_error(after):
    before = SpecDecodeSnapshot(100, 700, 150, (80, 50, 20), generation_tokens=1000)
    with pytest.raises(MetricsError, match=r"went down .* restarted .* run the gate again"):
        delta(before, after)


# -------------------------------------------------------------------------------------------- statistics


def window_of(accepted, width):
    """The counters vLLM would report for drafts that accepted `accepted` tokens each (a prefix)."""
    return SpecDecodeSnapshot(
        drafts=len(accepted),
        draft_tokens=width * len(accepted),
        accepted_tokens=sum(accepted),
        accepted_per_position=tuple(float(sum(1 for a in accepted if a > i)) for i in range(width)),
    )


@pytest.mark.parametrize("seed, width", [(1, 4), (2, 7), (3, 15)])
def test_interval_from_per_position_counters_equals_the_per_draft_interval(seed, width):
    rng = random.Random(seed)
    accepted = [min(width, int(rng.expovariate(1 / 3))) for _draft in range(400)]
    stats = acceptance_stats(window_of(accepted, width))
    mean = 1 + statistics.mean(accepted)
    half = Z95 * math.sqrt(statistics.variance(accepted) / len(accepted))
    assert stats.ci_method == "prefix"
    assert stats.mean_acceptance_length == pytest.approx(mean)
    assert stats.mean_acceptance_length_ci95 == pytest.approx((mean - half, mean + half))
    assert sum(stats.per_position_acceptance) == pytest.approx(statistics.mean(accepted))


def test_interval_is_clipped_to_possible_lengths():
    stats = acceptance_stats(window_of([0, 0, 7], 7))
    assert stats.mean_acceptance_length_ci95[0] == 1.0
    assert stats.mean_acceptance_length_ci95[1] <= 8.0


def test_without_per_position_counters_the_bound_interval_is_wider():
    rng = random.Random(7)
    accepted = [rng.randint(0, 4) for _draft in range(300)]
    exact = acceptance_stats(window_of(accepted, 4))
    bound = acceptance_stats(SpecDecodeSnapshot(len(accepted), 4 * len(accepted), sum(accepted), ()))
    assert bound.ci_method == "bhatia-davis"
    assert bound.mean_acceptance_length == exact.mean_acceptance_length
    assert bound.mean_acceptance_length_ci95[0] < exact.mean_acceptance_length_ci95[0]
    assert bound.mean_acceptance_length_ci95[1] > exact.mean_acceptance_length_ci95[1]


def test_no_drafts_gives_no_figures():
    stats = acceptance_stats(SpecDecodeSnapshot(0, 0, 0, (0.0, 0.0)))
    assert (stats.mean_acceptance_length, stats.mean_acceptance_length_ci95, stats.draft_acceptance_rate) == (
        None,
        None,
        None,
    )
    assert stats.ci_method == "none"


# ------------------------------------------------------------------------------------------- latency


def test_ttft_and_tpot_percentiles_from_a_real_vllm_page():
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._metrics import (
        TPOT_HISTOGRAMS,
        TTFT_HISTOGRAMS,
        bucket_delta,
        histogram_buckets,
        latency_percentiles,
    )

    families = parse_metrics(page("dflash"))
    ttft = histogram_buckets(families, TTFT_HISTOGRAMS, "tiny")
    tpot = histogram_buckets(families, TPOT_HISTOGRAMS, "tiny")
    assert ttft is not None and tpot is not None and ttft[math.inf] > 0
    figures = latency_percentiles(bucket_delta(None, ttft))
    assert figures is not None and 0 < figures["p50"] <= figures["p90"] <= figures["p99"]
    # nothing observed in the window -> no percentiles (not zeros)
    assert latency_percentiles(bucket_delta(ttft, ttft)) is None
    assert histogram_buckets(families, ("vllm:no_such_histogram",), "tiny") is None


def test_histogram_quantile_interpolates_like_prometheus():
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._metrics import bucket_delta, histogram_quantile

    buckets = {0.1: 10.0, 0.2: 30.0, 0.4: 40.0, math.inf: 40.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.15)  # rank 20: halfway through (0.1, 0.2]
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    assert histogram_quantile(1.0, {0.1: 1.0, math.inf: 2.0}) == 0.1  # in +Inf: the highest finite bound
    assert bucket_delta({0.1: 5.0, math.inf: 5.0}, {0.1: 4.0, math.inf: 4.0}) == {}  # restarted server


@pytest.mark.parametrize("name", REAL_PAGES)
def test_both_parsers_read_the_process_start_of_real_pages(name):
    # The gate's proof of one server process (issue 28, case 19b) rests on this gauge of every real page.
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._metrics import parse_metrics, process_start_times

    starts = [process_start_times(parse_metrics((PAGES / name).read_text(), use_library=lib)) for lib in (True, False)]
    assert starts[0] == starts[1] and len(starts[0]) == 1 and starts[0][0] > 1.7e9
