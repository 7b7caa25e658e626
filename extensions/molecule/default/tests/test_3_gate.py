"""The gate against the release it replaces (issue 15): real playbook runs, real host, fixture engine.

A floor cannot catch a fall from 3.2 to 2.7 (both above 2.0); the relative rule does. The synthetic
rejection sampler keeps a fine acceptance length but changes the greedy text; the lossless check does.
Each bad bump is rolled back, and a re-run afterwards is still one look (no new gate traffic).
"""

from __future__ import annotations

import json

import pytest
from deploy_helper import deploy, release_state

DRAFTER = {"method": "dflash", "model": "/srv/models/tiny-dflash", "num_speculative_tokens": 7}
SYNTHETIC = {**DRAFTER, "rejection_sample_method": "synthetic"}
MOLECULE_SPEC = {**SYNTHETIC, "synthetic_acceptance_length": 4.0}  # what molecule.yml deploys
RULES = ["acceptance_length", "position0", "throughput", "greedy_outputs"]


def _results(host, release: str) -> list:
    path = f"/opt/vllm/gate-results/{release}.json"
    if not host.file(path).exists:
        return []
    return json.loads(host.file(path).content_string)["results"]


def _good_deploy(extra: dict, disabled: list) -> None:
    """A deploy that must pass; `disabled` relative rules are turned off for it (a wanted change)."""
    proc = deploy({**extra, "dflash_gate_disabled_rules": disabled})
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "verdict PASS, report /var/lib/vllm-gate/default.md" in proc.stdout, "no summary line at the end"


@pytest.fixture
def restore_molecule_config(host):
    yield
    # Back to molecule.yml's config for whatever runs next: a wanted change, every relative rule off.
    _good_deploy({"vllm_speculative_config": MOLECULE_SPEC}, RULES)


def test_a_fall_from_3_2_to_2_7_above_the_floor_is_rolled_back_by_the_relative_rule(host, restore_molecule_config):
    base = {"vllm_speculative_config": {**SYNTHETIC, "synthetic_acceptance_length": 3.2}}
    _good_deploy(base, ["acceptance_length", "position0", "throughput"])  # 4.0 -> 3.2 is wanted here
    good = release_state(host)["current"]
    assert _results(host, good)[-1]["mean_acceptance_length"] == pytest.approx(3.2, abs=0.05)

    proc = deploy({**base, "vllm_ref": "fault/acceptance-drop"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "relative rule acceptance_length" in out and "2.70" in out and "3.20" in out, out[-4000:]
    assert "< min_mean_acceptance_length" not in out  # above the floor: only the relative rule fails it
    assert "rolled back to " + good in out
    assert "vs 3.20" in out and "verdict FAIL, report /var/lib/vllm-gate/default.md" in out  # the summary line
    state = release_state(host)
    assert state["current"] == good
    failed = [name for name, r in state["releases"].items() if r["status"] == "failed" and name != good]
    assert failed and _results(host, failed[-1])[-1]["passed"] is False  # the failed result is kept too
    assert _results(host, failed[-1])[-1]["relative"]["baseline_release"] == good


def test_turning_the_synthetic_sampler_on_is_rolled_back_by_the_lossless_check(host, restore_molecule_config):
    _good_deploy({"vllm_speculative_config": DRAFTER}, RULES)  # the standard sampler: real greedy text
    good = release_state(host)["current"]
    standard_length = _results(host, good)[-1]["mean_acceptance_length"]

    # A synthetic length above the standard one: only the text gives the sampler away.
    synthetic = {**SYNTHETIC, "synthetic_acceptance_length": round(min(standard_length + 0.3, 8.0), 2)}
    proc = deploy({"vllm_speculative_config": synthetic})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "relative rule greedy_outputs: 0 of 12 prompts" in out and "synthetic" in out, out[-4000:]
    # The lossless rule is what must fire; whether the acceptance rules also do depends on which earlier
    # result of the last good release is the baseline, so they are not asserted either way.
    assert "rolled back to " + good in out
    assert release_state(host)["current"] == good

    # A re-run with the good config: the host is unchanged, so one look and no new gate traffic.
    before = len(_results(host, good))
    proc = deploy({"vllm_speculative_config": DRAFTER})
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert len(_results(host, good)) == before, "the re-run sent gate traffic again"
