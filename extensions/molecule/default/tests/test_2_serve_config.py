"""The serve config: judged by the release's own `vllm serve` parser, and a config the preflight fills in
(no num_speculative_tokens: block_size - 1) is a no-op on a re-run.

The deploy's first look renders the serve config on the controller from the config as given; dflash_config
writes the preflight's normalised one. The host's render record (/etc/vllm/default.render.json) says which
input gave the written file, so the look still sees nothing to do.
"""

from __future__ import annotations

import json
import re

import yaml
from deploy_helper import deploy, service_pid

# The scenario's config without num_speculative_tokens; the tiny drafter's block_size is 8.
FILLED_IN = {
    "vllm_speculative_config": {
        "method": "dflash",
        "model": "/srv/models/tiny-dflash",
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 4.0,
    }
}


def test_a_config_the_preflight_fills_in_is_one_look_on_a_re_run(host):
    first = deploy(FILLED_IN)
    assert first.returncode == 0, first.stdout[-3000:]
    config = yaml.safe_load(host.file("/etc/vllm/default.yaml").content_string)
    assert config["speculative-config"]["num_speculative_tokens"] == 7
    record = json.loads(host.file("/etc/vllm/default.render.json").content_string)
    assert record["path"] == "/etc/vllm/default.yaml"
    pid = service_pid(host)
    gated = host.file("/var/lib/vllm-gate/default.json").mtime
    proc = deploy(FILLED_IN)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "nothing would change" in proc.stdout
    assert proc.stdout.count("skipping: no hosts matched") == 2, proc.stdout[-3000:]
    assert re.search(r"gpu1\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", proc.stdout)
    assert service_pid(host) == pid
    assert host.file("/var/lib/vllm-gate/default.json").mtime == gated, "gate traffic on a no-op"


def test_back_to_the_scenario_config_is_one_look_too(host):
    # the scenario's own config normalises to the file as it is: no render record needed
    proc = deploy()
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "nothing would change" in proc.stdout


def test_an_unknown_serve_flag_is_refused_before_any_change(host):
    config = host.file("/etc/vllm/default.yaml").content_string
    pid = service_pid(host)
    proc = deploy({"vllm_serve_extra_args": {"enable-prefix-cachin": True}})
    assert proc.returncode != 0
    # ansible-core 2.19 prints a failed task's message on stderr; the YAML callback folds long messages
    out = " ".join((proc.stdout + proc.stderr).split())
    assert "--enable-prefix-cachin is not a flag of vLLM" in out, proc.stdout[-3000:]
    assert "rename it enable-prefix-caching" in out
    assert host.file("/etc/vllm/default.yaml").content_string == config
    assert service_pid(host) == pid
    assert host.run("curl -sf http://127.0.0.1:8000/health").rc == 0
