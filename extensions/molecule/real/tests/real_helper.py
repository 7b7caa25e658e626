"""What the real-engine verifiers share: the scenario's names and the look at the unit and its journal."""

from __future__ import annotations

import json

from deploy_helper import release_state, service_pid

API_KEY = "real-engine-secret-key-do-not-print"
UNIT = "vllm-default.service"
HEALTH = "http://127.0.0.1:8000/health"
TARGET = "/srv/models/tiny-qwen3"
# molecule.yml's release: the target as its own drafter, every draft token accepted (AL = K + 1 = 5)
AGREEING = {"method": "draft_model", "model": TARGET, "num_speculative_tokens": 4}
# the random-init DFlash drafter of tests/gpu/mkmodel.py: it accepts nothing (AL 1.00)
RANDOM_DFLASH = {"method": "dflash", "model": "/srv/models/tiny-qwen3-dflash", "num_speculative_tokens": 7}
RANDOM_DFLASH_VARS = {
    "vllm_speculative_config": RANDOM_DFLASH,
    "dflash_config_drafter_config": "/srv/models/tiny-qwen3-dflash/config.json",
}


def unit_property(host, name: str) -> str:
    return host.check_output(f"systemctl show -p {name} --value {UNIT}")


def healthy(host) -> bool:
    return host.run(f"curl -sf -o /dev/null {HEALTH}").rc == 0


def journal_cursor(host) -> str:
    return host.check_output("journalctl -n 1 --no-pager --show-cursor -o cat | sed -n 's/^-- cursor: //p'")


def journal_since(host, cursor: str, unit: str = UNIT) -> str:
    return host.check_output(f"journalctl -u {unit} --no-pager -o short-precise --after-cursor='{cursor}'")


def engine_core_pid(host) -> int:
    return int(host.check_output(f"pgrep -P {service_pid(host)} -x VLLM::EngineCor"))


def gate_results(host, release: str) -> list:
    path = f"/opt/vllm/gate-results/{release}.json"
    return json.loads(host.file(path).content_string)["results"] if host.file(path).exists else []


def completion(host, prompt: str, max_tokens: int = 16) -> tuple:
    """(HTTP status, body) of one greedy completion; status 0 when nothing answered."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    out = host.run(
        f"curl -s -w '\\n%{{http_code}}' -H 'Authorization: Bearer {API_KEY}' -H 'Content-Type: application/json' "
        f"-d '{body}' http://127.0.0.1:8000/v1/completions"
    ).stdout
    text, _newline, status = out.rpartition("\n")
    return (int(status) if status.strip().isdigit() else 0), text


def complete(host, prompt: str, max_tokens: int = 16) -> dict:
    status, text = completion(host, prompt, max_tokens)
    assert status == 200, f"a completion got HTTP {status}: {text[:1000]}"
    return json.loads(text)


def serves(host) -> bool:
    """What the role's readiness wait asks before it calls a start done: /health, then a real completion (the
    API server answers /health before the first completion goes through after a restart)."""
    return healthy(host) and completion(host, "ready", 1)[0] == 200


def current(host) -> str:
    return release_state(host)["current"]
