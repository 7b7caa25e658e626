"""The gate on real vLLM's counters: the random DFlash drafter (AL 1.00) fails it, that rollout is rolled back to
the passing release (draft_model, AL 5.00), which serves again. Lossless: the greedy outputs of the failing
release are the passing release's, prompt for prompt (the gate's greedy_outputs rule); the random drafter has
nothing accepted, so its outputs are the target's own, and the passing release's (every token a drafter's
accepted proposal) equal them."""

from __future__ import annotations

import pytest
from deploy_helper import deploy, release_state
from real_helper import AGREEING, API_KEY, RANDOM_DFLASH_VARS, complete, gate_results, healthy


@pytest.fixture
def passing(host):
    before = {"current": release_state(host)["current"], "config": host.file("/etc/vllm/default.yaml").content_string}
    before["text"] = complete(host, "speculative decoding draft")["choices"][0]["text"]
    yield before
    assert release_state(host)["current"] == before["current"], "current moved"
    assert host.file("/etc/vllm/default.yaml").content_string == before["config"], "the config was not restored"
    assert healthy(host), "the passing release does not serve again"
    assert complete(host, "speculative decoding draft")["choices"][0]["text"] == before["text"]


def test_the_random_dflash_drafter_fails_the_gate_and_is_rolled_back(host, passing):
    good = passing["current"]
    results_before = len(gate_results(host, good))
    proc = deploy(RANDOM_DFLASH_VARS)
    out = proc.stdout + proc.stderr
    print(out[-6000:])
    assert proc.returncode != 0
    assert API_KEY not in out
    assert "verdict FAIL" in out and "rolled back to " + good in out
    # the preflight let DFlash through on this release's own capabilities, not on the fallback tables
    assert "fallback tables" not in out
    assert "< min_mean_acceptance_length" in out  # the floor (2.0), on real counters
    results = gate_results(host, good)
    assert len(results) == results_before + 1, "the failing run's result is not kept"
    failed = results[-1]
    print("failed run:", {k: failed.get(k) for k in ("passed", "mean_acceptance_length", "drafts")})
    assert failed["passed"] is False
    assert failed["mean_acceptance_length"] == pytest.approx(1.0, abs=0.01)  # nothing accepted
    assert failed["drafts"] > 0 and failed["draft_tokens"] > 0, "no drafts counted: not a real spec-decode run"
    # lossless: every prompt's greedy output equals the passing release's
    greedy = [c for c in failed["relative"]["checks"] if c["rule"] == "greedy_outputs"]
    print("greedy_outputs rule:", greedy)
    assert len(greedy) == 1 and greedy[0]["status"] == "pass", failed["relative"]
    assert greedy[0]["share"] == 1.0 and greedy[0]["compared"] == "sha256"  # whole outputs, same vLLM
    assert AGREEING["method"] in passing["config"]
