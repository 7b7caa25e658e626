# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gate's pinned workload: which prompts, sent how, and the hash that names it.

Acceptance length depends on the text (thinking on or off, language, code or prose), so a gate figure
means something only next to the workload it was measured on. A workload is a mapping (the role reads
it from YAML on the controller):

    name: default
    temperature: 0          # greedy: the outputs are fingerprinted and compared between releases
    max_tokens: 128
    concurrency: 4
    seed: 0                 # sent with every request
    requests: 24            # prompts are cycled; default one request per prompt
    prompts:
      - id: merge-intervals          # unique; names the prompt's fingerprint
        prompt: "def merge(...):"    # a completion (POST /v1/completions) ...
      - id: thinking-math
        messages:                    # ... or a chat (POST /v1/chat/completions, the model's chat template)
          - {role: user, content: "What is 17 * 23?"}
        chat_template_kwargs: {enable_thinking: true}
        max_tokens: 256              # optional, per prompt

The hash is sha256 over the normalised workload (defaults filled in, keys sorted, compact JSON), so the
same workload written with other formatting or key order hashes the same. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["Prompt", "Workload", "WorkloadError", "inline_workload", "load_workload"]

SCHEMA = 1
_TOP_KEYS = ("schema", "name", "description", "temperature", "max_tokens", "concurrency", "seed", "requests", "prompts")
_PROMPT_KEYS = ("id", "prompt", "messages", "chat_template_kwargs", "max_tokens")
_ROLES = ("system", "user", "assistant")


class WorkloadError(Exception):
    """A workload that cannot be sent; the message names the entry and the fix."""


@dataclass(frozen=True)
class Prompt:
    id: str
    prompt: Optional[str] = None
    messages: Optional[Tuple[Dict[str, str], ...]] = None
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    max_tokens: Optional[int] = None

    @property
    def kind(self) -> str:
        return "chat" if self.messages is not None else "completion"

    def as_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {"id": self.id}
        if self.messages is not None:
            data["messages"] = [dict(m) for m in self.messages]
            data["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        else:
            data["prompt"] = self.prompt
        data["max_tokens"] = self.max_tokens
        return data


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: Tuple[Prompt, ...]
    temperature: float = 0.0
    max_tokens: int = 128
    concurrency: int = 4
    seed: Optional[int] = 0
    requests: int = 0  # 0 = one per prompt
    source: str = "inline"
    description: str = ""

    @property
    def total_requests(self) -> int:
        return self.requests or len(self.prompts)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def normalised(self) -> Dict[str, Any]:
        """What the hash covers: everything that changes the traffic, nothing about where it came from."""
        return {
            "schema": SCHEMA,
            "name": self.name,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "concurrency": self.concurrency,
            "seed": self.seed,
            "requests": self.total_requests,
            "prompts": [p.as_dict() for p in self.prompts],
        }

    @property
    def sha256(self) -> str:
        text = json.dumps(self.normalised(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def schedule(self) -> List[Prompt]:
        """The prompts of each request, in order (cycled)."""
        return [self.prompts[i % len(self.prompts)] for i in range(self.total_requests)]

    def max_tokens_of(self, prompt: Prompt) -> int:
        return prompt.max_tokens or self.max_tokens


def _int(value: Any, where: str, minimum: int, problems: List[str]) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int):
        # YAML gives ints; a string "128" is a quoting mistake, refused rather than guessed.
        problems.append(f"{where} must be an integer, got {value!r}")
        return None
    if value < minimum:
        problems.append(f"{where} must be at least {minimum}, got {value}")
        return None
    return value


def _prompt(raw: Any, index: int, problems: List[str]) -> Optional[Prompt]:
    where = f"prompts[{index}]"
    if not isinstance(raw, Mapping):
        problems.append(f"{where} must be a mapping with id and prompt (or messages), got {type(raw).__name__}")
        return None
    unknown = sorted(str(k) for k in raw if k not in _PROMPT_KEYS)
    if unknown:
        problems.append(f"{where} has unknown keys {', '.join(unknown)} (known: {', '.join(_PROMPT_KEYS)})")
    pid = raw.get("id")
    if not isinstance(pid, str) or not pid.strip():
        problems.append(f"{where}.id must be a non-empty string (it names the prompt's output fingerprint)")
        pid = f"#{index}"
    where = f"prompts[{index}] ({pid})"
    has_prompt, has_messages = "prompt" in raw, "messages" in raw
    if has_prompt == has_messages:
        problems.append(f"{where} needs exactly one of prompt (a completion) or messages (a chat)")
        return None
    max_tokens = None
    if raw.get("max_tokens") is not None:
        max_tokens = _int(raw["max_tokens"], f"{where}.max_tokens", 1, problems)
    if has_prompt:
        if "chat_template_kwargs" in raw:
            problems.append(f"{where}: chat_template_kwargs applies to messages (a chat), not to a completion prompt")
        text = raw["prompt"]
        if not isinstance(text, str) or not text.strip():
            problems.append(f"{where}.prompt must be a non-empty string")
            return None
        return Prompt(id=pid, prompt=text, max_tokens=max_tokens)
    messages = raw["messages"]
    if not isinstance(messages, list) or not messages:
        problems.append(f"{where}.messages must be a non-empty list of {{role, content}}")
        return None
    parsed = []
    for number, message in enumerate(messages):
        spot = f"{where}.messages[{number}]"
        if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
            problems.append(f"{spot} must be a mapping of exactly role and content")
            continue
        if message["role"] not in _ROLES:
            problems.append(f"{spot}.role must be one of {', '.join(_ROLES)}, got {message['role']!r}")
        if not isinstance(message["content"], str) or not message["content"].strip():
            problems.append(f"{spot}.content must be a non-empty string")
        parsed.append({"role": str(message["role"]), "content": str(message["content"])})
    kwargs = raw.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        problems.append(f"{where}.chat_template_kwargs must be a mapping (e.g. {{enable_thinking: false}})")
        kwargs = {}
    return Prompt(id=pid, messages=tuple(parsed), chat_template_kwargs=dict(kwargs), max_tokens=max_tokens)


def load_workload(data: Any, source: str = "inline") -> Workload:
    """Validate a workload mapping; raises WorkloadError naming every problem (and `source`)."""
    fix = f"Fix: correct the workload ({source}); the format is in roles/dflash_gate/README.md"
    if not isinstance(data, Mapping):
        raise WorkloadError(f"workload {source} is not a mapping (got {type(data).__name__}). {fix}")
    problems: List[str] = []
    unknown = sorted(str(k) for k in data if k not in _TOP_KEYS)
    if unknown:
        problems.append(f"unknown keys {', '.join(unknown)} (known: {', '.join(_TOP_KEYS)})")
    if data.get("schema", SCHEMA) != SCHEMA:
        problems.append(f"schema {data.get('schema')!r} is not supported (this collection reads schema {SCHEMA})")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append("name must be a non-empty string")
        name = "?"
    temperature = data.get("temperature", 0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        problems.append(f"temperature must be a number from 0 to 2, got {temperature!r}")
        temperature = 0
    sizes = Workload  # the defaults, the dataclass's own
    max_tokens = _int(data.get("max_tokens", sizes.max_tokens), "max_tokens", 1, problems) or sizes.max_tokens
    concurrency = _int(data.get("concurrency", sizes.concurrency), "concurrency", 1, problems) or sizes.concurrency
    seed = data.get("seed", 0)
    if seed is not None:
        seed = _int(seed, "seed", 0, problems)
    requests = 0
    if data.get("requests") is not None:
        requests = _int(data["requests"], "requests", 1, problems) or 0
    raw_prompts = data.get("prompts")
    prompts: List[Prompt] = []
    if not isinstance(raw_prompts, list) or not raw_prompts:
        problems.append("prompts must be a non-empty list")
    else:
        for index, raw in enumerate(raw_prompts):
            parsed = _prompt(raw, index, problems)
            if parsed is not None:
                prompts.append(parsed)
        seen: Dict[str, int] = {}
        for prompt in prompts:
            seen[prompt.id] = seen.get(prompt.id, 0) + 1
        duplicates = sorted(pid for pid, n in seen.items() if n > 1)
        if duplicates:
            problems.append(f"prompt ids must be unique: {', '.join(duplicates)} repeated")
    if problems:
        raise WorkloadError(f"invalid gate workload {source}: " + "; ".join(problems) + f". {fix}")
    return Workload(
        name=str(name),
        prompts=tuple(prompts),
        temperature=float(temperature),
        max_tokens=max_tokens,
        concurrency=concurrency,
        seed=seed,
        requests=requests,
        source=source,
        description=str(data.get("description") or ""),
    )


def inline_workload(prompts: Sequence[str], requests: int, max_tokens: int, concurrency: int) -> Workload:
    """The workload of the module's plain options (prompts cycled over `requests` completions, greedy)."""
    return Workload(
        name="inline",
        prompts=tuple(Prompt(id=f"p{i + 1}", prompt=text) for i, text in enumerate(prompts)),
        temperature=0.0,
        max_tokens=max_tokens,
        concurrency=concurrency,
        seed=None,
        requests=requests,
        source="module options",
    )
