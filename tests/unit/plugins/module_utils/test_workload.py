# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.plugins.module_utils._workload import (
    WorkloadError,
    inline_workload,
    load_workload,
)

ROOT = Path(__file__).resolve().parents[4]
DEFAULT_FILE = ROOT / "roles" / "dflash_gate" / "files" / "workload-default.yml"

MINIMAL = {
    "name": "w",
    "prompts": [
        {"id": "a", "prompt": "def f():"},
        {"id": "b", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": True}},
    ],
}


def test_the_shipped_workload_is_valid_with_completions_and_chats_thinking_on_and_off():
    workload = load_workload(yaml.safe_load(DEFAULT_FILE.read_text()), str(DEFAULT_FILE))
    kinds = {p.kind for p in workload.prompts}
    thinking = {p.chat_template_kwargs.get("enable_thinking") for p in workload.prompts if p.kind == "chat"}
    assert kinds == {"completion", "chat"} and thinking == {True, False}
    assert workload.greedy and workload.seed == 0 and workload.total_requests == 24
    assert len(workload.sha256) == 64


def test_defaults_are_filled_and_requests_cycle_the_prompts():
    workload = load_workload(dict(MINIMAL, requests=5))
    assert (workload.temperature, workload.max_tokens, workload.concurrency, workload.seed) == (0.0, 128, 4, 0)
    assert [p.id for p in workload.schedule()] == ["a", "b", "a", "b", "a"]
    assert load_workload(MINIMAL).total_requests == 2


def test_the_hash_ignores_formatting_and_key_order_but_not_the_traffic():
    base = load_workload(MINIMAL).sha256
    reordered = {"prompts": list(MINIMAL["prompts"]), "name": "w", "max_tokens": 128}  # default written out
    assert load_workload(reordered, "other/file.yml").sha256 == base
    for change in ({"max_tokens": 64}, {"seed": 1}, {"temperature": 0.5}, {"concurrency": 8}, {"requests": 3}):
        assert load_workload(dict(MINIMAL, **change)).sha256 != base, change
    thinking_off = copy.deepcopy(MINIMAL)
    thinking_off["prompts"][1]["chat_template_kwargs"] = {"enable_thinking": False}
    assert load_workload(thinking_off).sha256 != base


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ([], "is not a mapping"),
        ({"prompts": MINIMAL["prompts"]}, "name must be a non-empty string"),
        ({"name": "w", "prompts": []}, "prompts must be a non-empty list"),
        ({"name": "w", "prompts": [{"prompt": "x"}]}, "prompts[0].id must be a non-empty string"),
        ({"name": "w", "prompts": [{"id": "a"}]}, "needs exactly one of prompt"),
        ({"name": "w", "prompts": [{"id": "a", "prompt": "x", "messages": []}]}, "needs exactly one of prompt"),
        ({"name": "w", "prompts": [{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}]}, "a repeated"),
        ({"name": "w", "prompts": [{"id": "a", "messages": [{"role": "bot", "content": "x"}]}]}, "role must be"),
        ({"name": "w", "prompts": [{"id": "a", "prompt": "x", "chat_template_kwargs": {}}]}, "applies to messages"),
        ({"name": "w", "prompts": [{"id": "a", "prompt": "x", "tokens": 3}]}, "unknown keys tokens"),
        (dict(MINIMAL, max_tokens="128"), "max_tokens must be an integer"),
        (dict(MINIMAL, temperature=3), "temperature must be a number from 0 to 2"),
        (dict(MINIMAL, concurrency=0), "concurrency must be at least 1"),
        (dict(MINIMAL, schema=2), "schema 2 is not supported"),
        (dict(MINIMAL, prompt="x"), "unknown keys prompt"),
    ],
)
def test_invalid_workloads_name_the_entry_the_source_and_the_fix(data, needle):
    with pytest.raises(WorkloadError) as caught:
        load_workload(data, "/etc/gate/mine.yml")
    message = str(caught.value)
    assert needle in message and "/etc/gate/mine.yml" in message and "Fix:" in message


def test_inline_workload_of_the_module_options():
    workload = inline_workload(["x", "y"], requests=3, max_tokens=16, concurrency=2)
    assert [p.prompt for p in workload.schedule()] == ["x", "y", "x"]
    assert workload.seed is None and workload.greedy
    assert workload.sha256 != inline_workload(["x", "y"], requests=4, max_tokens=16, concurrency=2).sha256
