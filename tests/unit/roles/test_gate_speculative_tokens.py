"""The deploy's gate compares the number of per-position series with the K the server was configured with."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

TASKS = Path(__file__).resolve().parents[3] / "roles" / "dflash_gate" / "tasks" / "main.yml"


def _gate_args() -> dict:
    def walk(items):
        for item in items:
            if "vllm_ops.dflash.acceptance_gate" in item:
                return item["vllm_ops.dflash.acceptance_gate"]
            for key in ("block", "rescue", "always"):
                found = walk(item.get(key) or [])
                if found:
                    return found
        return None

    return walk(yaml.safe_load(TASKS.read_text()))


OMIT = "__omit_place_holder__test"


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        # the preflight completed the config (a DFlash drafter's block_size - 1): that is what the server runs
        ({"dflash_config_result": {"speculative_config": {"num_speculative_tokens": 7}}}, "7"),
        ({"vllm_speculative_config": {"num_speculative_tokens": 4}}, "4"),
        ({"vllm_speculative_config": {"method": "dflash"}}, OMIT),
    ],
)
def test_the_gate_is_given_the_configured_k(variables, expected):
    expression = _gate_args()["num_speculative_tokens"]
    templar = Templar(loader=DataLoader(), variables={"omit": OMIT, **variables})
    assert str(templar.template(trust_as_template(expression))).strip() == expected
