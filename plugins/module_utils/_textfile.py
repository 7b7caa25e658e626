# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An acceptance gate result as Prometheus metrics in node_exporter's textfile collector format.

node_exporter reads every `*.prom` file of its `--collector.textfile.directory` at each scrape, so
the file is written whole or not at all (`write_text_atomic`: a `.tmp` name, which the collector's
glob skips, renamed over the old file). The alerting rules (role `dflash_monitoring`) compare vLLM's
live counters with `dflash_gate_mean_acceptance_length` and `dflash_gate_alert_margin` from here.

Standard library only: this runs on the target host's system Python (3.8+).

Why not prometheus_client.write_to_textfile: the host's python may lack prometheus_client, and the
release venv that has it (vLLM requires it) is the wrong place to depend on: this file is written after
a failed gate and a rollback too, when that venv may be the broken one, and the module would have to
run a script in it for ~40 lines of formatting. What is ours is the format only (render, escaping); the
tests hold it to prometheus_client's own writer (write_to_textfile) and parser as oracles, so a
difference fails there. The atomic write is _common.write_text_atomic, as write_to_textfile does it
(a temporary name, then a rename).
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Any, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "ALERT_MARGIN",
    "METRIC_NAMES",
    "TextfileError",
    "escape_help",
    "escape_label_value",
    "gate_samples",
    "render",
    "render_gate",
]

# (name, help): the families written, in file order.
FAMILIES: Tuple[Tuple[str, str], ...] = (
    ("dflash_gate_info", "The last acceptance gate on this host; the labels say what was gated (value always 1)."),
    ("dflash_gate_passed", "1 when the last acceptance gate passed, 0 when it failed."),
    ("dflash_gate_mean_acceptance_length", "Mean acceptance length measured by the gate (1 + accepted / drafts)."),
    (
        "dflash_gate_mean_acceptance_length_ci95_low",
        "Lower bound of the gate's 95% interval for the acceptance length.",
    ),
    (
        "dflash_gate_mean_acceptance_length_ci95_high",
        "Upper bound of the gate's 95% interval for the acceptance length.",
    ),
    ("dflash_gate_min_mean_acceptance_length", "The gate's threshold for the mean acceptance length."),
    ("dflash_gate_alert_margin", "How far the live acceptance length may fall below the gated one before an alert."),
    ("dflash_gate_draft_acceptance_rate", "Draft acceptance rate measured by the gate (accepted / draft tokens)."),
    ("dflash_gate_per_position_acceptance", "Acceptance rate per draft position measured by the gate."),
    ("dflash_gate_drafts", "Drafts the gate's verdict rests on."),
    ("dflash_gate_tokens_per_second", "Generation tokens per second during the gate's traffic."),
    ("dflash_gate_timestamp_seconds", "When the gate's traffic ended (Unix time)."),
)
METRIC_NAMES: Tuple[str, ...] = tuple(family[0] for family in FAMILIES)

# How far below the gated acceptance length the live one may fall before the alert (acceptance_metrics).
ALERT_MARGIN = 0.5

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Labels this file sets itself; an extra label may not take one of these names.
_OWN_LABELS = ("vllm_instance", "model_name", "release", "verdict", "workload_sha256", "position")

Labels = Tuple[Tuple[str, str], ...]
Sample = Tuple[str, Labels, float]


class TextfileError(ValueError):
    """Input that cannot become a metrics file; the message names the cause and the fix."""


def escape_label_value(value: str) -> str:
    """A label value as the exposition format quotes it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP text escaping: backslash and newline (quotes stay as they are)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render(samples: Sequence[Sample], families: Sequence[Tuple[str, str]] = FAMILIES) -> str:
    """The exposition text: each family's HELP and TYPE (all gauges), then its samples; families
    without samples are left out (a missing figure is absent, not a made-up 0)."""
    lines: List[str] = []
    for name, help_text in families:
        rows = [(labels, value) for sample_name, labels, value in samples if sample_name == name]
        if not rows:
            continue
        lines.append(f"# HELP {name} {escape_help(help_text)}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in rows:
            body = ",".join(f'{key}="{escape_label_value(val)}"' for key, val in labels)
            lines.append(f"{name}{{{body}}} {_number(value)}" if body else f"{name} {_number(value)}")
    return "\n".join(lines) + "\n" if lines else ""


def _figure(gate: Mapping[str, Any], report: Mapping[str, Any], key: str) -> Any:
    value = gate.get(key)
    return report.get(key) if value is None else value


def _epoch(stamp: Any) -> Optional[float]:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        parsed = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return parsed.replace(tzinfo=datetime.timezone.utc).timestamp()


def _float(key: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TextfileError(
            f"gate figure {key} is {value!r}, not a number. Fix: pass the registered result of "
            "vllm_ops.dflash.acceptance_gate (or its report) as gate"
        )
    try:
        return float(value)
    except ValueError:
        raise TextfileError(
            f"gate figure {key} is {value!r}, not a number. Fix: pass the registered result of "
            "vllm_ops.dflash.acceptance_gate (or its report) as gate"
        ) from None


def _extra_labels(labels: Mapping[str, Any]) -> Labels:
    out = []
    for key in sorted(labels):
        if not _LABEL_NAME.match(str(key)) or str(key).startswith("__"):
            raise TextfileError(
                f"label name {key!r} is not a valid Prometheus label name. Fix: use letters, "
                "digits and underscores, not starting with a digit or '__'"
            )
        if key in _OWN_LABELS:
            raise TextfileError(
                f"label {key!r} is set by the metrics file itself. Fix: remove it from labels "
                f"(reserved: {', '.join(_OWN_LABELS)})"
            )
        out.append((str(key), "" if labels[key] is None else str(labels[key])))
    return tuple(out)


def gate_samples(
    gate: Mapping[str, Any],
    vllm_instance: str,
    release: str = "",
    alert_margin: float = ALERT_MARGIN,
    labels: Optional[Mapping[str, Any]] = None,
) -> List[Sample]:
    """The samples of one gate result: `gate` is acceptance_gate's registered result or its report.

    Every series carries `vllm_instance` and `model_name` (the `model_name` label the gate read on
    /metrics, so rules can match vLLM's own series) plus the extra `labels`; the info series adds
    `release`, `verdict` and `workload_sha256` (empty until the gate reports one).
    """
    if not isinstance(gate, Mapping):
        raise TextfileError("gate is not a dict. Fix: pass the registered result of vllm_ops.dflash.acceptance_gate")
    nested = gate.get("report")
    report: Mapping[str, Any] = nested if isinstance(nested, Mapping) else gate
    if _figure(gate, report, "mean_acceptance_length") is None or _figure(gate, report, "passed") is None:
        raise TextfileError(
            "the gate result has no verdict or no acceptance length (check mode, a skipped gate, or "
            "no drafts). Fix: write the metrics only after a gate that measured"
        )
    if (
        not isinstance(alert_margin, (int, float))
        or isinstance(alert_margin, bool)
        or (math.isnan(alert_margin) or alert_margin < 0)
    ):
        raise TextfileError(
            f"alert_margin {alert_margin!r} is not a number >= 0. Fix: give the acceptance length "
            "drop to tolerate, e.g. 0.5"
        )
    if not vllm_instance:
        raise TextfileError("vllm_instance is empty. Fix: name the instance (vllm_instance, e.g. default)")
    model = report.get("metrics_model_name") or report.get("model") or gate.get("model") or ""
    common: Labels = (("vllm_instance", vllm_instance), ("model_name", str(model)), *_extra_labels(labels or {}))
    passed = bool(_figure(gate, report, "passed"))
    workload = _figure(gate, report, "workload_sha256") or ""
    release = release or str(_figure(gate, report, "release") or "")
    info = (*common, ("release", release), ("verdict", "pass" if passed else "fail"), ("workload_sha256", workload))
    samples: List[Sample] = [("dflash_gate_info", info, 1.0), ("dflash_gate_passed", common, 1.0 if passed else 0.0)]

    def add(name: str, value: Any, key: str, extra: Labels = ()) -> None:
        number = _float(key, value)
        if number is not None:
            samples.append((name, common + extra, number))

    add("dflash_gate_mean_acceptance_length", _figure(gate, report, "mean_acceptance_length"), "mean_acceptance_length")
    interval = _figure(gate, report, "mean_acceptance_length_ci95")
    if isinstance(interval, Sequence) and not isinstance(interval, str) and len(interval) == 2:
        add("dflash_gate_mean_acceptance_length_ci95_low", interval[0], "mean_acceptance_length_ci95")
        add("dflash_gate_mean_acceptance_length_ci95_high", interval[1], "mean_acceptance_length_ci95")
    given = report.get("thresholds")
    thresholds: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    add("dflash_gate_min_mean_acceptance_length", thresholds.get("min_mean_acceptance_length"), "thresholds")
    add("dflash_gate_alert_margin", alert_margin, "alert_margin")
    add("dflash_gate_draft_acceptance_rate", _figure(gate, report, "draft_acceptance_rate"), "draft_acceptance_rate")
    for position, rate in enumerate(_figure(gate, report, "per_position_acceptance") or ()):
        add("dflash_gate_per_position_acceptance", rate, "per_position_acceptance", (("position", str(position)),))
    add("dflash_gate_drafts", _figure(gate, report, "drafts"), "drafts")
    add("dflash_gate_tokens_per_second", _figure(gate, report, "tokens_per_second"), "tokens_per_second")
    add("dflash_gate_timestamp_seconds", _epoch(report.get("finished_at")), "finished_at")
    return samples


def render_gate(
    gate: Mapping[str, Any],
    vllm_instance: str,
    release: str = "",
    alert_margin: float = ALERT_MARGIN,
    labels: Optional[Mapping[str, Any]] = None,
) -> str:
    """The metrics file for one gate result (see gate_samples)."""
    return render(gate_samples(gate, vllm_instance, release, alert_margin, labels))
