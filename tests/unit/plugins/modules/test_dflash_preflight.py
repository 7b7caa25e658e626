# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""dflash_preflight run as Ansible runs it: a subprocess fed ANSIBLE_MODULE_ARGS from an args file."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path
from typing import Any, Dict

import pytest
from ansible_collections.vllm_ops.dflash.tests.helpers import module_runner
from ansible_collections.vllm_ops.dflash.tests.helpers.capabilities import captured

ROOT = Path(__file__).resolve().parents[4]
DRAFTERS = ROOT / "tests" / "unit" / "data" / "drafters"
PROBES_026 = {
    "dflash_aux_layer_offset": True,
    "dflash_aux_layer_offset_v2": True,
    "dflash_v2_runner": True,
    "dflash_sliding_window": True,
    "dflash_mixed_attention_v2": True,
    "dflash_mixed_attention_auto_v2": True,
}
FACTS_026 = {"version": "0.26.0", "probes": PROBES_026, "capabilities": captured("0.26.0")}
FACTS_0201 = {"version": "0.20.1", "probes": {name: False for name in PROBES_026}, "capabilities": captured("0.20.1")}


def run_module(tmp_path: Path, **args: Any) -> Dict[str, Any]:
    result, proc = module_runner.run_module("dflash_preflight", tmp_path, args, timeout=60)
    result["rc"] = proc.returncode
    return result


def test_real_drafter_passes_and_gets_its_default_k(tmp_path: Path) -> None:
    result = run_module(
        tmp_path,
        speculative_config={"method": "dflash", "model": "/root/models/tiny-qwen3-dflash"},
        drafter_config=str(DRAFTERS / "tiny_dflash.json"),
        vllm_facts=FACTS_026,
    )
    assert result["rc"] == 0 and not result.get("failed")
    assert result["changed"] is False
    assert result["speculative_config"] == {
        "method": "dflash",
        "model": "/root/models/tiny-qwen3-dflash",
        "num_speculative_tokens": 7,
    }
    assert (result["findings"], result["error_count"], result["warning_count"]) == ([], 0, 0)
    assert result["drafter_config_path"] == str(DRAFTERS / "tiny_dflash.json")
    assert result["drafter_config_sha256"] == hashlib.sha256((DRAFTERS / "tiny_dflash.json").read_bytes()).hexdigest()


def test_seed_deployment_fails_with_both_bugs_in_msg(tmp_path: Path) -> None:
    result = run_module(
        tmp_path,
        speculative_config={"method": "dflash", "model": "z-lab/Qwen3.6-27B-DFlash", "num_speculative_tokens": 15},
        drafter_config=str(DRAFTERS / "qwen36_dflash.json"),
        vllm_facts={"changed": False, "ansible_facts": {"vllm": FACTS_0201}},
    )
    assert result["failed"] is True and result["rc"] == 1
    assert result["changed"] is False
    assert result["error_count"] == 2
    assert result["msg"].startswith("2 preflight finding(s): ")
    assert "one layer too early" in result["msg"]
    assert "runs sliding-window drafter layers as full attention" in result["msg"]
    assert [f["field"] for f in result["findings"]] == [
        "drafter_config.dflash_config.target_layer_ids",
        "drafter_config.layer_types",
    ]


def test_broken_drafter_json_fails(tmp_path: Path) -> None:
    result = run_module(
        tmp_path,
        speculative_config={"method": "dflash", "model": "m", "num_speculative_tokens": 7},
        drafter_config=str(DRAFTERS / "broken.json"),
        vllm_facts=FACTS_026,
    )
    assert result["failed"] is True
    assert "broken.json is not valid JSON" in result["msg"]


def test_check_mode_runs_the_same_checks(tmp_path: Path) -> None:
    args = {
        "speculative_config": {"model": "z-lab/Qwen3.6-27B-DFlash"},
        "drafter_config": str(DRAFTERS / "qwen36_dflash.json"),
        "vllm_facts": dict(FACTS_026, probes=dict(PROBES_026, dflash_mixed_attention_auto_v2=False)),
    }
    normal = run_module(tmp_path, **args)
    checked = run_module(tmp_path, _ansible_check_mode=True, **args)
    assert normal["failed"] is True and checked["failed"] is True
    assert normal["findings"] == checked["findings"]
    assert "set VLLM_USE_V2_MODEL_RUNNER=1" in checked["msg"]


@pytest.mark.parametrize(("fail_on_warnings", "failed"), [(False, False), (True, True)])
def test_warnings_are_shown_and_can_fail(tmp_path: Path, fail_on_warnings: bool, failed: bool) -> None:
    result = run_module(
        tmp_path,
        speculative_config={
            "method": "dflash",
            "model": "m",
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_length": 3.0,
        },
        drafter_config=str(DRAFTERS / "tiny_dflash.json"),
        vllm_facts=FACTS_026,
        fail_on_warnings=fail_on_warnings,
    )
    assert bool(result.get("failed")) is failed
    assert (result["error_count"], result["warning_count"]) == (0, 1)
    assert "test-only" in json.dumps(result["warnings"])  # ansible-core 2.19 wraps each warning in an Event


def test_serve_config_is_judged_by_the_installed_parser(tmp_path: Path) -> None:
    result = run_module(
        tmp_path,
        serve_config={"model": "m", "port": 8000, "enable-prefix-cachin": True, "no-enable-prefix-caching": True},
        vllm_facts=FACTS_026,
    )
    assert result["failed"] is True
    assert [f["field"] for f in result["findings"]] == ["serve_config.enable-prefix-cachin"]
    assert "rename it enable-prefix-caching" in result["msg"]
    assert result["capabilities_used"] == "vllm" and result["fallback_release"] is None


def test_without_capabilities_the_fallback_is_named(tmp_path: Path) -> None:
    facts = dict(FACTS_026, capabilities=None, capabilities_error="the import did not finish within 90s")
    result = run_module(tmp_path, speculative_config={"method": "medusa", "model": "m"}, vllm_facts=facts)
    assert result["capabilities_used"] == "fallback" and result["fallback_release"] == "0.26.0"
    assert "speculative_methods" in result["fallback_keys"]
    assert "the import did not finish within 90s" in json.dumps(result["warnings"])


def test_secret_env_values_are_masked(tmp_path: Path) -> None:
    result = run_module(
        tmp_path,
        speculative_config={"method": "dflash", "model": "m"},
        drafter_config=str(DRAFTERS / "qwen36_dflash.json"),
        vllm_facts=FACTS_026,
        env={
            "HF_TOKEN": "hf_0123456789secret",
            "VLLM_API_KEY": "sk-topsecret",
            "VLLM_USE_V2_MODEL_RUNNER": "1",
            "TOKENIZERS_PARALLELISM": "false",
        },
    )
    assert result["rc"] == 0
    dumped = json.dumps(result)
    assert "hf_0123456789secret" not in dumped and "sk-topsecret" not in dumped
    # a name that merely contains a marker is not a secret: its value must not be masked everywhere
    assert result["invocation"]["module_args"]["env"]["TOKENIZERS_PARALLELISM"] == "false"
    assert result["invocation"]["module_args"]["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "1"


def test_wrong_option_type_is_refused_by_ansible(tmp_path: Path) -> None:
    result = run_module(tmp_path, speculative_config="method=dflash")
    assert result["failed"] is True
    assert "speculative_config" in result["msg"]


def test_module_is_python38_syntax() -> None:
    """The module runs on the target's system Python."""
    ast.parse((ROOT / "plugins" / "modules" / "dflash_preflight.py").read_text(), feature_version=(3, 8))


def test_secret_env_values_are_masked_by_the_one_rule_of_every_module(tmp_path: Path) -> None:
    """Issue 28, case 7b: names with the marker inside a word (HFTOKEN, OPENAI_APIKEY) or a marker the old
    word list lacked (DB_PASS, GITHUB_PAT) came back in clear in the module's arguments."""
    secrets = {
        "HFTOKEN": "hf_glued_s3cret",
        "OPENAI_APIKEY": "sk-glued-s3cret",
        "DB_PASS": "db-s3cret-pass",
        "GITHUB_PAT": "ghp_s3cretpat",
        "api_key": "lower-s3cret-key",
    }
    plain = {"TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin:/bin", "VLLM_USE_V2_MODEL_RUNNER": "1"}
    result = run_module(
        tmp_path,
        speculative_config={"method": "dflash", "model": "m"},
        drafter_config=str(DRAFTERS / "qwen36_dflash.json"),
        vllm_facts=FACTS_026,
        env={**secrets, **plain},
    )
    assert result["rc"] == 0
    dumped = json.dumps(result)
    for name, value in secrets.items():
        assert value not in dumped, name
    assert {name: result["invocation"]["module_args"]["env"][name] for name in plain} == plain
