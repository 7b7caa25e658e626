"""Bad input that real vLLM itself refuses under the role's unit: the deploy ends with the journal lines that say
why, and the previous release serves again with its config."""

from __future__ import annotations

import pytest
from deploy_helper import deploy, release_state
from real_helper import API_KEY, TARGET, UNIT, healthy


@pytest.fixture
def serving(host):
    before = {"current": release_state(host)["current"], "config": host.file("/etc/vllm/default.yaml").content_string}
    yield before
    assert release_state(host)["current"] == before["current"], "current moved"
    assert host.file("/etc/vllm/default.yaml").content_string == before["config"], "the config was not restored"
    assert healthy(host), "the previous release is not serving"


def test_a_model_path_that_does_not_exist_fails_with_vllms_own_words_and_is_rolled_back(host, serving):
    # real vLLM takes 60-90 s on 2 busy cores to import and refuse the path; the role waits out the ready
    # timeout while the unit restarts it, so it is short here
    proc = deploy({"vllm_model": "/srv/models/no-such-model", "vllm_ready_timeout": 150})
    out = proc.stdout + proc.stderr
    print(out[-6000:])
    assert proc.returncode != 0
    assert API_KEY not in out, "the API key was printed"
    assert "Lines that say why" in out and "/srv/models/no-such-model" in out
    assert "rolled back to " + serving["current"] in out


def test_the_preflight_judges_on_the_releases_own_capabilities_before_any_change(host, serving):
    pid = host.check_output(f"systemctl show -p MainPID --value {UNIT}")
    # vLLM 0.32.0 has dflash, draft_model, eagle3 ... but not this one: refused from its own answer
    spec = {"method": "eagle7", "model": TARGET, "num_speculative_tokens": 4}
    proc = deploy({"vllm_speculative_config": spec})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "'eagle7' is not a speculative method of vLLM 0.32.0" in out, out[-4000:]
    assert "fallback table" not in out
    assert host.check_output(f"systemctl show -p MainPID --value {UNIT}") == pid, "the service was restarted"
