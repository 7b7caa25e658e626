# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Gate results kept per release, and the relative rules that judge a release against the last good one.

Every gate run's report is kept in `<results_dir>/<release>.json` (on the host, beside state.json: the
default results_dir is `<root>/gate-results`), newest last, at most KEEP per release. The baseline of a
run is the newest passed result of the last good release.

Relative rules (each can be turned off by name in `disabled`):
    acceptance_length  the mean acceptance length must not fall more than max_acceptance_drop (a fraction)
    position0          the position-0 acceptance rate likewise (max_position0_drop)
    throughput         generation tokens/s not more than max_throughput_drop
    greedy_outputs     at least min_identical_outputs (a fraction) of the prompts give the same greedy text

They apply only to results of the same workload (its sha256) and target model + revision; the first
three also need the same drafter. Speculative decoding is lossless, so the greedy text must not depend
on the drafter; when the vLLM version changed, kernels may round differently and long outputs drift
apart, so only the first PREFIX_CHARS characters are compared. When a rule cannot apply, the result says
why (never a silent fallback to the absolute rule). Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import write_text_atomic

__all__ = [
    "PREFIX_CHARS",
    "RULES",
    "Comparison",
    "HistoryError",
    "RelativeRules",
    "baseline_result",
    "compare",
    "fingerprint",
    "load_results",
    "results_path",
    "save_result",
]

RESULTS_SCHEMA = 1
KEEP = 10
PREFIX_CHARS = 64
RULES = ("acceptance_length", "position0", "throughput", "greedy_outputs")
_RELEASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
# Identity keys that make two results comparable at all, and those the drafter adds.
TARGET_KEYS = ("target_model", "target_revision")
DRAFTER_KEYS = ("drafter_model", "drafter_revision")


class HistoryError(Exception):
    """Results that cannot be read or written; the message names the file and the fix."""


@dataclass
class RelativeRules:
    max_acceptance_drop: float = 0.10
    max_position0_drop: float = 0.10
    max_throughput_drop: float = 0.25
    min_identical_outputs: float = 1.0
    disabled: FrozenSet[str] = field(default_factory=frozenset)

    def problems(self) -> List[str]:
        found = []
        for name in ("max_acceptance_drop", "max_position0_drop", "max_throughput_drop", "min_identical_outputs"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                found.append(f"{name} must be a fraction from 0 to 1, got {value}")
        unknown = sorted(set(self.disabled) - set(RULES))
        if unknown:
            found.append(f"disabled_rules has unknown rules {', '.join(unknown)} (rules: {', '.join(RULES)})")
        return found


@dataclass
class Comparison:
    """What the relative rules found; `skipped` says why none applied (None when some did)."""

    baseline_release: Optional[str]
    skipped: Optional[str]
    checks: List[Dict[str, Any]]
    baseline: Optional[Dict[str, Any]] = None
    # A few words for one-line summaries: "no last good release", "other workload", ...
    skipped_short: Optional[str] = None

    @property
    def reasons(self) -> List[str]:
        return [c["message"] for c in self.checks if c["status"] == "fail"]

    def as_dict(self) -> Dict[str, Any]:
        return {
            "baseline_release": self.baseline_release,
            "skipped": self.skipped,
            "skipped_short": self.skipped_short,
            "checks": self.checks,
        }


def fingerprint(text: str) -> Dict[str, Any]:
    """sha256 of a greedy output and of its first PREFIX_CHARS characters (the text itself is not kept)."""
    return {
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "prefix_sha256": hashlib.sha256(text[:PREFIX_CHARS].encode("utf-8")).hexdigest(),
        "chars": len(text),
    }


# ------------------------------------------------------------------------------------------- storage


def results_path(results_dir: str, release: str) -> str:
    if not _RELEASE_NAME.match(release or ""):
        raise HistoryError(
            f"release {release!r} is not a release name (letters, digits, . _ + -); "
            "Fix: pass the name vllm_release reports as current"
        )
    return os.path.join(results_dir, release + ".json")


def load_results(results_dir: str, release: str) -> List[Dict[str, Any]]:
    """The kept results of `release`, oldest first; [] when it has none."""
    path = results_path(results_dir, release)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise HistoryError(
            f"cannot read the gate results {path} ({exc}); Fix: repair or remove that file (the release's "
            "next gate run writes it anew)"
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise HistoryError(f"{path} is not a gate results file (no results list); Fix: repair or remove it")
    return [r for r in data["results"] if isinstance(r, dict)]


def save_result(results_dir: str, release: str, report: Dict[str, Any]) -> str:
    """Append `report` to the release's results (keeping the newest KEEP); returns the file's path."""
    path = results_path(results_dir, release)
    results = [*load_results(results_dir, release), report]
    text = json.dumps(
        {"schema": RESULTS_SCHEMA, "release": release, "results": results[-KEEP:]}, indent=2, sort_keys=True
    )
    try:
        os.makedirs(results_dir, mode=0o755, exist_ok=True)
        write_text_atomic(path, text + "\n")
    except OSError as exc:
        raise HistoryError(
            f"cannot write the gate results {path} ({exc.strerror or exc}); Fix: make {results_dir} writable "
            "or run the task with become"
        ) from exc
    return path


def baseline_result(results_dir: str, release: Optional[str]) -> Optional[Dict[str, Any]]:
    """The newest passed result of `release`, None when it has none."""
    if not release:
        return None
    for report in reversed(load_results(results_dir, release)):
        if report.get("passed"):
            return report
    return None


# ---------------------------------------------------------------------------------------- comparison


def _identity_text(identity: Dict[str, Any], keys: Any) -> str:
    return ", ".join(f"{k}={identity.get(k) or '?'}" for k in keys)


def _drop(old: Optional[float], new: Optional[float]) -> Optional[float]:
    if old is None or new is None or old <= 0:
        return None
    return (old - new) / old


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def compare(
    current: Dict[str, Any],
    baseline: Optional[Dict[str, Any]],
    baseline_release: Optional[str],
    rules: RelativeRules,
    results_dir: str = "",
) -> Comparison:
    """Judge `current` (a gate report) against `baseline` (the last good release's passed report)."""
    if not baseline_release:
        return Comparison(
            None,
            "no last good release on this host yet (first gated rollout): absolute rules only",
            [],
            skipped_short="no last good release",
        )
    if baseline is None:
        where = f" in {results_dir}" if results_dir else ""
        return Comparison(
            baseline_release,
            f"the last good release {baseline_release} has no passed gate result{where} (gated before results "
            "were kept?): absolute rules only; its next passed gate run records one",
            [],
            skipped_short="no result kept for the last good release",
        )
    old_workload, new_workload = baseline.get("workload") or {}, current.get("workload") or {}
    if old_workload.get("sha256") != new_workload.get("sha256"):
        return Comparison(
            baseline_release,
            f"other workload: the last good release {baseline_release} was measured on workload "
            f"{old_workload.get('name', '?')!r} (sha256 {str(old_workload.get('sha256'))[:12]}), this run on "
            f"{new_workload.get('name', '?')!r} (sha256 {str(new_workload.get('sha256'))[:12]}); figures of "
            "different workloads are not comparable. Fix: gate with the same workload, or accept that this "
            "rollout is judged by the absolute rules only",
            [],
            baseline,
            "other workload",
        )
    old_id, new_id = baseline.get("identity") or {}, current.get("identity") or {}
    if any(old_id.get(k) != new_id.get(k) for k in TARGET_KEYS):
        return Comparison(
            baseline_release,
            f"other target model: the last good release {baseline_release} served "
            f"{_identity_text(old_id, TARGET_KEYS)}, this one {_identity_text(new_id, TARGET_KEYS)}; "
            "acceptance and outputs of different models are not comparable: absolute rules only",
            [],
            baseline,
            "other target model",
        )
    same_drafter = all(old_id.get(k) == new_id.get(k) for k in DRAFTER_KEYS)
    same_vllm = old_id.get("vllm_version") == new_id.get("vllm_version")
    checks: List[Dict[str, Any]] = []

    def add(rule: str, status: str, message: str, **figures: Any) -> None:
        checks.append(dict({"rule": rule, "status": status, "message": message}, **figures))

    other_drafter = (
        f"other drafter ({_identity_text(old_id, DRAFTER_KEYS)} -> {_identity_text(new_id, DRAFTER_KEYS)}): "
        "its acceptance is not comparable"
    )
    scalar_rules = (
        ("acceptance_length", "mean acceptance length", "mean_acceptance_length", rules.max_acceptance_drop,
         "max_acceptance_drop", ".2f"),
        ("position0", "position-0 acceptance rate", None, rules.max_position0_drop, "max_position0_drop", ".3f"),
        ("throughput", "generation tokens/s", "tokens_per_second", rules.max_throughput_drop,
         "max_throughput_drop", ".1f"),
    )  # fmt: skip
    for rule, label, key, limit, option, fmt in scalar_rules:
        if rule in rules.disabled:
            add(rule, "off", f"{rule}: turned off (disabled_rules)")
            continue
        if not same_drafter:
            add(rule, "skipped", f"{rule}: skipped, {other_drafter}")
            continue
        if key is None:
            old_v = (baseline.get("per_position_acceptance") or [None])[0]
            new_v = (current.get("per_position_acceptance") or [None])[0]
        else:
            old_v, new_v = baseline.get(key), current.get(key)
        drop = _drop(old_v, new_v)
        if drop is None:
            add(rule, "skipped", f"{rule}: skipped, no {label} in one of the results", current=new_v, baseline=old_v)
            continue
        status = "fail" if drop > limit + 1e-12 else "pass"
        change = f"fell {_pct(drop)}" if drop > 0 else (f"rose {_pct(-drop)}" if drop < 0 else "unchanged")
        message = (
            f"relative rule {rule}: {label} {format(new_v, fmt)} {change} from "
            f"{format(old_v, fmt)} of the last good release {baseline_release}"
        )
        if status == "fail":
            message += (
                f", more than {option} {_pct(limit)}; this release is worse than the one it replaces "
                f"(set {option} higher, or add {rule} to disabled_rules, if that is expected)"
            )
        add(rule, status, message, current=new_v, baseline=old_v, drop=round(drop, 6), limit=limit)

    rule = "greedy_outputs"
    if rule in rules.disabled:
        add(rule, "off", f"{rule}: turned off (disabled_rules)")
    elif not (baseline.get("workload") or {}).get("greedy", True):
        add(rule, "skipped", f"{rule}: skipped, the workload is not greedy (temperature > 0)")
    else:
        old_fp = baseline.get("fingerprints") or {}
        new_fp = current.get("fingerprints") or {}
        key = "sha256" if same_vllm else "prefix_sha256"
        ids = sorted(set(old_fp) & set(new_fp))
        if not ids:
            add(rule, "skipped", f"{rule}: skipped, no prompt has an output in both results")
        else:
            same = [i for i in ids if old_fp[i].get(key) == new_fp[i].get(key)]
            share = len(same) / len(ids)
            what = (
                "identical greedy outputs"
                if same_vllm
                else f"greedy outputs identical in their first {PREFIX_CHARS} characters (vLLM "
                f"{old_id.get('vllm_version') or '?'} -> {new_id.get('vllm_version') or '?'})"
            )
            status = "fail" if share < rules.min_identical_outputs - 1e-12 else "pass"
            message = (
                f"relative rule {rule}: {len(same)} of {len(ids)} prompts ({_pct(share)}) gave {what} as the "
                f"last good release {baseline_release}"
            )
            if status == "fail":
                differing = [i for i in ids if i not in same]
                message += (
                    f", fewer than min_identical_outputs {_pct(rules.min_identical_outputs)} (differ: "
                    f"{', '.join(differing[:5])}{' ...' if len(differing) > 5 else ''}); speculative decoding is "
                    "lossless, so a broken sampler or drafter path changes the text (e.g. "
                    "rejection_sample_method: synthetic). Fix: check the speculative config and this vLLM build"
                )
            add(rule, status, message, current=len(same), baseline=len(ids), share=round(share, 6),
                limit=rules.min_identical_outputs, compared=key)  # fmt: skip
    return Comparison(baseline_release, None, checks, baseline)
