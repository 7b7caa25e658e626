# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Prometheus text exposition format (0.0.4) -> metric families, for _metrics.

`prometheus_client.parser` when the host's python (the one the module runs on, not vLLM's venv) can import
it, and otherwise a standard-library parser that builds the same families (tests hold both to identical
results on real vLLM pages). Standard library only otherwise: this runs on the target's system Python (3.8+).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

__all__ = ["MetricFamily", "MetricsError", "Sample", "library_parser_available", "parse_metrics"]


class MetricsError(Exception):
    """A /metrics page that cannot give acceptance figures; the message names the cause and the fix."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Dict[str, str]
    value: float
    timestamp: Optional[float] = None


@dataclass(frozen=True)
class MetricFamily:
    name: str
    type: str
    documentation: str
    samples: Tuple[Sample, ...]


_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_LABEL_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_HELP_ESCAPES = re.compile(r"\\[\\n]")
# Which sample names belong to a family declared with `# TYPE <name> <type>` (text format 0.0.4).
_TYPE_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
_TYPES = ("counter", "gauge", "summary", "histogram", "untyped", "unknown", "info", "stateset", "gaugehistogram")

try:  # the maintained parser, when the host's python has it (rarely: vLLM's venv is not this python)
    from prometheus_client import parser as _prometheus_parser
except ImportError:  # pragma: no cover - depends on the host
    _prometheus_parser = None  # type: ignore[assignment]


def library_parser_available() -> bool:
    return _prometheus_parser is not None


def parse_metrics(text: str, use_library: Optional[bool] = None) -> List[MetricFamily]:
    """Parse a Prometheus text page into families.

    `use_library`: None = prometheus_client when importable, else the stdlib parser; True/False forces one
    (True raises when it is missing). Counter families are named without `_total` and their samples
    always end in `_total`, as prometheus_client does it.
    """
    if use_library is None:
        use_library = library_parser_available()
    if use_library:
        if _prometheus_parser is None:
            raise MetricsError("prometheus_client is not importable here; parse with use_library=False")
        try:
            return [
                MetricFamily(
                    family.name,
                    family.type,
                    family.documentation,
                    tuple(
                        Sample(s.name, dict(s.labels), float(s.value), _float_or_none(s.timestamp))
                        for s in family.samples
                    ),
                )
                for family in _prometheus_parser.text_string_to_metric_families(text)
            ]
        except (ValueError, IndexError) as exc:
            raise MetricsError(
                f"the /metrics page is not valid Prometheus text ({exc}); is the URL a vLLM server?"
            ) from exc
    return _parse_stdlib(text)


def _float_or_none(value: object) -> Optional[float]:
    if value is None:
        return None
    # prometheus_client gives OpenMetrics Timestamp objects for some inputs and floats for others.
    return float(value)  # type: ignore[arg-type]


class _FamilyBuilder:
    """Groups samples into families the way prometheus_client's text parser does."""

    def __init__(self) -> None:
        self.families: List[MetricFamily] = []
        self.name = ""
        self.documentation = ""
        self.type = "untyped"
        self.samples: List[Sample] = []
        self.allowed: Tuple[str, ...] = ()

    def flush(self) -> None:
        if self.name:
            self.families.append(_build_family(self.name, self.documentation, self.type, self.samples))
        self.name, self.documentation, self.type, self.samples, self.allowed = "", "", "untyped", [], ()

    def start(self, name: str) -> None:
        self.flush()
        self.name = name

    def help(self, name: str, documentation: str) -> None:
        if name != self.name:
            self.start(name)
            self.allowed = (name,)
        self.documentation = documentation

    def declare_type(self, name: str, type_: str) -> None:
        if name != self.name:
            self.start(name)
        self.type = type_
        self.allowed = tuple(name + suffix for suffix in _TYPE_SUFFIXES.get(type_, ("",)))

    def add(self, sample: Sample) -> None:
        if sample.name in self.allowed:
            self.samples.append(sample)
            return
        # A sample outside the declared family is a family of its own, untyped.
        self.flush()
        self.families.append(_build_family(sample.name, "", "untyped", [sample]))


def _build_family(name: str, documentation: str, type_: str, samples: List[Sample]) -> MetricFamily:
    if type_ == "untyped":
        type_ = "unknown"  # prometheus_client's (OpenMetrics') name for it
    if type_ == "counter":
        if name.endswith("_total"):
            name = name[: -len("_total")]
        else:
            samples = [Sample(s.name + "_total", s.labels, s.value, s.timestamp) for s in samples]
    return MetricFamily(name, type_, documentation, tuple(samples))


def _parse_stdlib(text: str) -> List[MetricFamily]:
    builder = _FamilyBuilder()
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            if line.startswith("#"):
                _parse_comment(line, builder)
            else:
                builder.add(_parse_sample(line))
        except ValueError as exc:
            raise MetricsError(
                f"the /metrics page is not valid Prometheus text (line {number}: {exc}: {line[:120]!r}); "
                "is the URL a vLLM server?"
            ) from exc
    builder.flush()
    return builder.families


def _parse_comment(line: str, builder: _FamilyBuilder) -> None:
    parts = line.split(None, 3)
    if len(parts) < 3 or parts[0] != "#" or parts[1] not in ("HELP", "TYPE"):
        return  # a plain comment
    keyword, name = parts[1], parts[2]
    if not _METRIC_NAME.fullmatch(name):
        raise ValueError(f"invalid metric name {name!r}")
    rest = parts[3] if len(parts) > 3 else ""
    if keyword == "HELP":
        builder.help(name, _HELP_ESCAPES.sub(lambda m: "\\" if m.group(0) == "\\\\" else "\n", rest))
    else:
        if rest.strip() not in _TYPES:
            raise ValueError(f"unknown metric type {rest.strip()!r}")
        builder.declare_type(name, rest.strip())


def _parse_sample(line: str) -> Sample:
    match = _METRIC_NAME.match(line)
    if not match:
        raise ValueError("no metric name")
    name, pos = match.group(0), match.end()
    labels: Dict[str, str] = {}
    brace = _skip_spaces(line, pos)
    if line[brace : brace + 1] == "{":
        pos = _parse_labels(line, brace + 1, labels)
    elif pos < len(line) and not line[pos].isspace():
        raise ValueError("invalid character after the metric name")
    fields = line[pos:].split()
    if not fields or len(fields) > 2:
        raise ValueError("expected `name{labels} value [timestamp]`")
    value = _parse_float(fields[0])
    timestamp = _parse_float(fields[1]) / 1000 if len(fields) == 2 else None  # milliseconds on the wire
    return Sample(name, labels, value, timestamp)


def _parse_labels(line: str, pos: int, labels: Dict[str, str]) -> int:
    """Parse `a="x",b="y\\"z"}` starting after `{`; fill `labels`, return the index after `}`."""
    while True:
        pos = _skip_spaces(line, pos)
        if pos < len(line) and line[pos] == "}":
            return pos + 1
        match = _LABEL_NAME.match(line, pos)
        if not match:
            raise ValueError("invalid label name")
        label = match.group(0)
        pos = _skip_spaces(line, match.end())
        if line[pos : pos + 1] != "=":
            raise ValueError(f"expected `=` after label {label!r}")
        pos = _skip_spaces(line, pos + 1)
        if line[pos : pos + 1] != '"':
            raise ValueError(f"label {label!r} has an unquoted value")
        value, pos = _read_quoted(line, pos + 1)
        if label in labels:
            raise ValueError(f"duplicate label {label!r}")
        labels[label] = value
        pos = _skip_spaces(line, pos)
        if line[pos : pos + 1] == ",":
            pos += 1
        elif line[pos : pos + 1] != "}":
            raise ValueError("expected `,` or `}` between labels")


def _read_quoted(line: str, pos: int) -> Tuple[str, int]:
    """Read a label value after its opening quote; return it unescaped and the index after the closing quote."""
    out: List[str] = []
    while pos < len(line):
        char = line[pos]
        if char == '"':
            return "".join(out), pos + 1
        if char == "\\" and pos + 1 < len(line):
            following = line[pos + 1]
            # Unknown escapes are kept verbatim, as prometheus_client keeps them.
            out.append(_LABEL_ESCAPES.get(following, "\\" + following))
            pos += 2
            continue
        out.append(char)
        pos += 1
    raise ValueError("unterminated label value")


def _skip_spaces(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos


def _parse_float(token: str) -> float:
    # Python's float() also takes `1_000`, which the exposition format does not.
    if "_" in token:
        raise ValueError(f"invalid number {token!r}")
    try:
        return float(token)  # handles NaN, +Inf, -Inf, exponents
    except ValueError:
        raise ValueError(f"invalid number {token!r}") from None
