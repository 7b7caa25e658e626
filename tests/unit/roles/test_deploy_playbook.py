"""deploy_dflash.yml: the canary is a deterministic choice (issue 14 item 12)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

PLAYBOOK = Path(__file__).resolve().parents[3] / "playbooks" / "deploy_dflash.yml"
PLAYS = {play["name"]: play for play in yaml.safe_load(PLAYBOOK.read_text())}
INVENTORY = ["gpu1", "gpu2", "gpu3", "gpu4"]


def play_hosts(play: str, deploy: list, **extra: object) -> list:
    groups = {"gpu_hosts": INVENTORY, "dflash_deploy": deploy}
    templar = Templar(loader=DataLoader(), variables={"groups": groups, **extra})
    return list(templar.template(trust_as_template(PLAYS[play]["hosts"])))


@pytest.mark.parametrize("play", ["Build vLLM once for the fleet", "Roll out vLLM with DFlash"])
@pytest.mark.parametrize(
    ("deploy", "extra", "expected"),
    [
        (["gpu2", "gpu1"], {}, ["gpu1", "gpu2"]),  # group_by's order is the order hosts finished the look
        (["gpu4", "gpu3", "gpu1"], {}, ["gpu1", "gpu3", "gpu4"]),
        (["gpu3", "gpu2"], {}, ["gpu2", "gpu3"]),  # gpu1 unchanged: the first host to deploy leads
        (["gpu2", "gpu1", "gpu3"], {"dflash_canary": "gpu3"}, ["gpu3", "gpu1", "gpu2"]),
        (["gpu2", "gpu1"], {"dflash_canary": "gpu4"}, ["gpu1", "gpu2"]),  # a canary with nothing to deploy
        ([], {}, []),
    ],
)
def test_the_rollout_goes_in_inventory_order_canary_first(play, deploy, extra, expected):
    assert play_hosts(play, deploy, **extra) == expected


def test_the_first_batch_is_one_host():
    assert PLAYS["Roll out vLLM with DFlash"]["serial"] == "{{ dflash_serial | default([1, '100%']) }}"
