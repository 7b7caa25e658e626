"""The example inventory deployed on a fresh test host: staged models at its pins, its vault, the gate passed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import testinfra
import yaml

HOST = testinfra.get_host("podman://gpu1")
PROJECT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
EXAMPLE = yaml.safe_load((PROJECT / "playbooks" / "gpu_hosts" / "group_vars" / "gpu_hosts" / "main.yml").read_text())
HUB = "/var/lib/vllm/huggingface/hub"


def _snapshot(repo_id: str, revision: str) -> str:
    return f"{HUB}/models--{repo_id.replace('/', '--')}/snapshots/{revision}"


def test_the_service_serves_the_example_release_after_its_gate():
    assert HOST.service("vllm-default.service").is_running
    state = json.loads(HOST.file("/opt/vllm/state.json").content_string)
    assert state["current"] and state["releases"][state["current"]]["status"] == "good"


def test_both_models_are_staged_at_the_examples_pins_and_served_from_there():
    target = _snapshot(EXAMPLE["vllm_model"], EXAMPLE["vllm_target_model"]["revision"])
    drafter = _snapshot(EXAMPLE["vllm_drafter_model"]["repo_id"], EXAMPLE["vllm_drafter_model"]["revision"])
    assert HOST.file(f"{target}/config.json").exists and HOST.file(f"{drafter}/config.json").exists
    serve = yaml.safe_load(HOST.file("/etc/vllm/default.yaml").content_string)
    assert (serve["model"], serve["revision"]) == (target, EXAMPLE["vllm_target_model"]["revision"])
    assert serve["served-model-name"] == EXAMPLE["vllm_served_model_name"]
    assert serve["speculative-config"]["model"] == drafter
    assert serve["speculative-config"]["num_speculative_tokens"] == 15
    unit = HOST.file("/etc/systemd/system/vllm-default.service").content_string
    assert "HF_HUB_OFFLINE=1" in unit


def test_the_api_key_came_from_the_vault():
    env = HOST.file("/etc/vllm/default.env")
    assert env.mode == 0o600
    assert "example-scenario-key-do-not-print" in env.content_string


def test_the_gate_identity_names_the_staged_commits():
    report = json.loads(HOST.file("/var/lib/vllm-gate/default.json").content_string)
    identity = report["identity"]
    assert identity["target_revision"] == EXAMPLE["vllm_target_model"]["revision"]
    assert identity["drafter_revision"] == EXAMPLE["vllm_drafter_model"]["revision"]
