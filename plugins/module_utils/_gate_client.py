# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gate's HTTP client of the vLLM server: /metrics, /version and one completion, each within the gate's
deadline and a size cap, every failure a GateError that names the fix. Standard library only.
"""

from __future__ import annotations

import datetime
import http.client
import json
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils import _untrusted_json
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import NoRedirectHandler
from ansible_collections.vllm_ops.dflash.plugins.module_utils._metrics import (
    MetricFamily,
    MetricsError,
    SpecDecodeSnapshot,
    parse_metrics,
    process_start_times,
    spec_decode_snapshot,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._workload import Prompt, Workload

__all__ = [
    "MAX_COMPLETION_BYTES",
    "MAX_METRICS_BYTES",
    "GateError",
    "Server",
    "base_url",
    "display_url",
    "start_time",
    "utc",
]


class GateError(Exception):
    """The gate could not judge (server unreachable, not speculative, bad options); names the fix."""


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


def base_url(url: str) -> str:
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


class Server:
    """vLLM's HTTP API as the gate uses it, within one deadline: /metrics, /version, the completions."""

    def __init__(
        self, url: str, model: str, api_key: Optional[str], timeout: float, validate_certs: bool, deadline: float
    ) -> None:
        self.model, self.api_key, self.timeout = model, api_key, timeout
        self.base = base_url(url)
        self.shown = display_url(self.base)
        context = ssl.create_default_context()
        if not validate_certs:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        # Stdlib opener (this core imports no Ansible, so not ansible.module_utils.urls.open_url).
        self.opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), NoRedirectHandler())
        self.deadline_seconds = deadline
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
            _set_read_timeout(response, min(self.timeout, remaining))
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
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        request = urllib.request.Request(self.base + path, data=data, headers=headers)
        remaining = self.remaining()
        if remaining <= 0:
            raise _DeadlinePassed(path)
        try:
            with self.opener.open(request, timeout=min(self.timeout, remaining)) as response:
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
                    if self.api_key
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
                f"no answer from {where} within {self.timeout:g} s: the server is overloaded, stuck or "
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
            "model": self.model,
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


def _starts(started: Tuple[float, ...]) -> str:
    if not started:
        return "none"
    return ", ".join(f"{value:.2f} ({start_time(value)})" for value in started)


def start_time(value: float) -> str:
    """A process start as UTC, or as given when no clock can show it (the page is hostile or broken)."""
    try:
        return utc(value)
    except (OverflowError, OSError, ValueError):
        return repr(value)


def utc(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
