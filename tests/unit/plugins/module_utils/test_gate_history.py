# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate_history import (
    KEEP,
    PREFIX_CHARS,
    HistoryError,
    RelativeRules,
    baseline_result,
    compare,
    fingerprint,
    load_results,
    save_result,
)

IDENTITY = {
    "target_model": "Qwen/Qwen3-8B",
    "target_revision": "abc",
    "drafter_model": "z-lab/Qwen3-8B-DFlash",
    "drafter_revision": "def",
    "vllm_version": "0.27.1",
}
TEXTS = {f"p{i}": f"output {i} " * 20 for i in range(10)}


def result(length=3.2, pos0=0.8, tps=400.0, texts=None, identity=None, workload="w1", passed=True):
    return {
        "passed": passed,
        "mean_acceptance_length": length,
        "mean_acceptance_length_ci95": [length - 0.1, length + 0.1],
        "per_position_acceptance": [pos0, pos0 / 2],
        "tokens_per_second": tps,
        "fingerprints": {k: fingerprint(v) for k, v in (texts or TEXTS).items()},
        "identity": dict(IDENTITY, **(identity or {})),
        "workload": {"name": "default", "sha256": workload, "greedy": True},
    }


def checks(comparison):
    return {c["rule"]: c["status"] for c in comparison.checks}


def test_an_unchanged_release_passes_every_rule():
    comparison = compare(result(), result(), "r1", RelativeRules())
    assert comparison.skipped is None and comparison.reasons == []
    assert checks(comparison) == dict.fromkeys(
        ("acceptance_length", "position0", "throughput", "greedy_outputs"), "pass"
    )


def test_an_acceptance_fall_of_3_2_to_2_7_fails_the_relative_rule_above_any_floor():
    comparison = compare(result(length=2.7), result(length=3.2), "r1", RelativeRules())
    assert checks(comparison)["acceptance_length"] == "fail"
    [reason] = comparison.reasons
    assert "acceptance_length" in reason and "2.70" in reason and "3.20" in reason and "15.6%" in reason
    assert "max_acceptance_drop 10.0%" in reason and "r1" in reason
    # within the allowed drop
    assert compare(result(length=3.0), result(length=3.2), "r1", RelativeRules()).reasons == []


@pytest.mark.parametrize(
    ("current", "rule"),
    [({"pos0": 0.6}, "position0"), ({"tps": 250.0}, "throughput")],
)
def test_position0_and_throughput_rules(current, rule):
    comparison = compare(result(**current), result(), "r1", RelativeRules())
    assert [c["rule"] for c in comparison.checks if c["status"] == "fail"] == [rule]
    off = compare(result(**current), result(), "r1", RelativeRules(disabled=frozenset({rule})))
    assert checks(off)[rule] == "off" and off.reasons == []


def test_a_changed_greedy_output_fails_the_lossless_check_and_names_the_prompts():
    texts = dict(TEXTS, p3="something else entirely")
    comparison = compare(result(texts=texts), result(), "r1", RelativeRules())
    [reason] = comparison.reasons
    assert "greedy_outputs" in reason and "9 of 10" in reason and "p3" in reason and "synthetic" in reason
    assert compare(result(texts=texts), result(), "r1", RelativeRules(min_identical_outputs=0.9)).reasons == []


def test_another_vllm_version_compares_only_the_prefix_of_the_outputs():
    drifted = {k: v[:PREFIX_CHARS] + "drift" for k, v in TEXTS.items()}
    newer = {"vllm_version": "0.28.0"}
    comparison = compare(result(texts=drifted, identity=newer), result(), "r1", RelativeRules())
    assert comparison.reasons == [] and "first 64 characters" in comparison.checks[-1]["message"]
    # the same drift on the same vLLM version is a failure
    assert compare(result(texts=drifted), result(), "r1", RelativeRules()).reasons
    early = {k: "X" + v for k, v in TEXTS.items()}
    assert compare(result(texts=early, identity=newer), result(), "r1", RelativeRules()).reasons


def test_another_drafter_skips_the_acceptance_rules_but_keeps_the_lossless_check():
    other = {"drafter_model": "z-lab/other-DFlash"}
    comparison = compare(result(length=1.5, identity=other, texts=dict(TEXTS, p0="x")), result(), "r1", RelativeRules())
    assert checks(comparison) == {
        "acceptance_length": "skipped",
        "position0": "skipped",
        "throughput": "skipped",
        "greedy_outputs": "fail",
    }
    assert "other drafter" in comparison.checks[0]["message"]


@pytest.mark.parametrize(
    ("current", "baseline", "release", "needle"),
    [
        (result(), None, None, "no last good release"),
        (result(), None, "r1", "has no passed gate result"),
        (result(workload="w2"), result(), "r1", "other workload"),
        (result(identity={"target_revision": "new"}), result(), "r1", "other target model"),
    ],
)
def test_skipped_relative_rules_say_why(current, baseline, release, needle):
    comparison = compare(current, baseline, release, RelativeRules())
    assert needle in comparison.skipped and comparison.checks == [] and comparison.reasons == []


def test_rule_options_are_checked():
    assert RelativeRules(max_acceptance_drop=1.5, disabled=frozenset({"speed"})).problems() == [
        "max_acceptance_drop must be a fraction from 0 to 1, got 1.5",
        "disabled_rules has unknown rules speed (rules: acceptance_length, position0, throughput, greedy_outputs)",
    ]


def test_results_are_kept_per_release_newest_last_and_the_baseline_is_the_newest_pass(tmp_path):
    directory = str(tmp_path / "gate-results")
    assert baseline_result(directory, "r1") is None and load_results(directory, "r1") == []
    save_result(directory, "r1", result(length=3.0))
    save_result(directory, "r1", result(length=3.1))
    path = save_result(directory, "r1", result(length=1.0, passed=False))
    assert [r["mean_acceptance_length"] for r in load_results(directory, "r1")] == [3.0, 3.1, 1.0]
    assert baseline_result(directory, "r1")["mean_acceptance_length"] == 3.1
    assert json.loads(Path(path).read_text())["release"] == "r1"
    for _attempt in range(KEEP + 3):
        save_result(directory, "r2", result())
    assert len(load_results(directory, "r2")) == KEEP


def test_a_corrupt_results_file_or_a_bad_release_name_is_refused(tmp_path):
    (tmp_path / "r1.json").write_text("{not json")
    with pytest.raises(HistoryError, match="repair or remove"):
        baseline_result(str(tmp_path), "r1")
    with pytest.raises(HistoryError, match="not a release name"):
        save_result(str(tmp_path), "../etc/passwd", result())


def test_fingerprints_hold_no_text():
    mark = fingerprint("secret answer " * 10)
    assert "secret" not in json.dumps(mark) and mark["chars"] == 140
    assert copy.deepcopy(mark) == fingerprint("secret answer " * 10)
