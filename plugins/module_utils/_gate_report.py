# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gate's reports: the markdown beside the JSON report, the one summary line, and writing both.

Standard library only.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import write_text_atomic
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate_client import GateError

__all__ = ["render_markdown", "report_paths", "summary_line", "write_reports"]

_BAR_WIDTH = 30
_EIGHTHS = "▏▎▍▌▋▊▉"


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
