# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests of the preflight core (serve config, speculative config, drafter) and of the probe patterns it relies on.

Fixtures (tests/unit/data/):
- drafters/tiny_dflash.json: the real drafter config served by vLLM 0.26.0 on the H200
  (shared/fixtures/vllm-0.26.0-h200/dflash_config.json): 1 full-attention layer, block_size 8.
- drafters/qwen3_target_not_dflash.json: the real target config of that run (Qwen3ForCausalLM).
- drafters/qwen36_dflash.json: synthetic, shaped like z-lab/Qwen3.6-27B-DFlash (4 sliding + 1 full layers,
  block_size 16, num_target_layers 64, target_layer_ids [1, 16, 31, 46, 61]).
- drafters/speculators_dflash.json: synthetic, in the vllm-project/speculators format vLLM converts.
- drafters/broken.json: the real config cut off mid-file.
- vllm_snippets/<version>/<path>.txt: verbatim excerpts of the files the probes read, from the PyPI wheels.
- capabilities/<version>.json: what the capability script answered on each PyPI wheel (tests/helpers/capabilities.py).
"""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _drafter, _preflight, _vllm_data
from ansible_collections.vllm_ops.dflash.plugins.module_utils._drafter import (
    PreflightError,
    dflash_needs_non_causal,
    load_drafter_config,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._preflight import (
    DEFAULT_CAPABILITY_PROBES,
    parse_env_flag,
    preflight,
)
from ansible_collections.vllm_ops.dflash.tests.helpers.capabilities import captured as capabilities

ROOT = Path(__file__).resolve().parents[4]
FIXTURES = ROOT / "tests" / "unit" / "data"
DRAFTERS = FIXTURES / "drafters"
SNIPPETS = FIXTURES / "vllm_snippets"
PROBES_YML = FIXTURES / "probes.yml"


def drafter(name: str) -> Dict[str, Any]:
    return json.loads((DRAFTERS / name).read_text())


TINY = drafter("tiny_dflash.json")
QWEN36 = drafter("qwen36_dflash.json")
ALL_TRUE = {name: True for name in DEFAULT_CAPABILITY_PROBES.values()}


def facts(version: str = "0.26.0", caps: Optional[str] = "0.26.0", **overrides: Optional[bool]) -> Dict[str, Any]:
    """vllm_facts of a 0.26.0-like vLLM; an override of None removes the probe (not run).

    `caps` names the release whose captured capabilities the facts carry; None: no capabilities gathered.
    """
    probes: Dict[str, Any] = dict(ALL_TRUE)
    for name, value in overrides.items():
        if value is None:
            probes.pop(name)
        else:
            probes[name] = value
    result: Dict[str, Any] = {"version": version, "probes": probes, "probe_errors": {}}
    if caps is None:
        result.update(capabilities=None, capabilities_source="unavailable", capabilities_error="timed out")
    else:
        result.update(capabilities=capabilities(caps), capabilities_source="cache")
    return result


# vLLM 0.20.1 as the probes see it: none of the fixes.
FACTS_0201 = facts("0.20.1", "0.20.1", **{name: False for name in ALL_TRUE})
# vLLM 0.25.0: offsets and uniform sliding windows, but no mixed drafters.
FACTS_0250 = facts("0.25.0", "0.24.0", dflash_mixed_attention_v2=False, dflash_mixed_attention_auto_v2=False)


def with_changes(config: Dict[str, Any], **changes: Any) -> Dict[str, Any]:
    """A deep copy of a drafter config; `dflash_config__x` sets dflash_config.x; a value of None deletes."""
    out = copy.deepcopy(config)
    for key, value in changes.items():
        target, name = (
            (out["dflash_config"], key.split("__", 1)[1]) if key.startswith("dflash_config__") else (out, key)
        )
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value
    return out


def levels_and_fields(result: Dict[str, Any]) -> List[Tuple[str, str]]:
    return sorted((f["level"], f["field"]) for f in result["findings"])


DFLASH = {"method": "dflash", "model": "z-lab/Qwen3.6-27B-DFlash"}
E, W = "error", "warning"

# id, speculative_config, preflight kwargs, expected (level, field) findings, a phrase of the first message
CASES = [
    ("real tiny drafter on 0.26.0", {"method": "dflash", "model": "/m/tiny"}, {"drafter_config": TINY}, [], None),
    ("qwen3.6-like drafter on 0.26.0", DFLASH, {"drafter_config": QWEN36}, [], None),
    (
        "method inferred from the model name",
        {"model": "z-lab/Qwen3.6-27B-DFlash"},
        {"drafter_config": QWEN36},
        [],
        None,
    ),
    (
        "explicit draft_model renamed by vLLM",
        {"method": "draft_model", "model": "z-lab/Qwen3.6-27B-DFlash"},
        {"drafter_config": QWEN36},
        [(W, "speculative_config.method")],
        "vLLM runs draft_model as dflash",
    ),
    (
        "unknown method",
        {"method": "dflsh", "model": "x", "num_speculative_tokens": 3},
        {},
        [(E, "speculative_config.method")],
        "use dflash",
    ),
    (
        "deprecated mtp alias",
        {"method": "deepseek_mtp", "num_speculative_tokens": 1},
        {},
        [(W, "speculative_config.method")],
        "replaces it with mtp",
    ),
    (
        "ngram needs no model and no probes",
        {"method": "ngram", "num_speculative_tokens": 4},
        {"vllm_facts": {}},
        [(W, "vllm_facts.capabilities")],
        "judged against the fallback tables of vLLM 0.26.0",
    ),
    (
        "model missing",
        {"method": "dflash", "num_speculative_tokens": 3},
        {"drafter_config": TINY},
        [(E, "speculative_config.model")],
        "loads a draft checkpoint",
    ),
    (
        "K zero",
        dict(DFLASH, num_speculative_tokens=0),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.num_speculative_tokens")],
        "greater than zero",
    ),
    (
        "K negative string",
        dict(DFLASH, num_speculative_tokens="-2"),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.num_speculative_tokens")],
        "greater than zero",
    ),
    (
        "K not an integer",
        dict(DFLASH, num_speculative_tokens=7.5),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.num_speculative_tokens")],
        "must be an integer",
    ),
    (
        "K boolean",
        dict(DFLASH, num_speculative_tokens=True),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.num_speculative_tokens")],
        "must be an integer",
    ),
    (
        "K above block_size - 1",
        dict(DFLASH, num_speculative_tokens=16),
        {"drafter_config": QWEN36},
        [(W, "speculative_config.num_speculative_tokens")],
        "set num_speculative_tokens: 15",
    ),
    (
        "K missing and no block_size",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, block_size=None)},
        [(E, "speculative_config.num_speculative_tokens")],
        "no block_size",
    ),
    (
        "K missing for draft_model",
        {"method": "draft_model", "model": "Qwen/Qwen3-0.6B"},
        {},
        [(E, "speculative_config.num_speculative_tokens")],
        "missing",
    ),
    ("K missing for suffix", {"method": "suffix"}, {}, [], None),
    (
        "tensor_parallel_size inside",
        dict(DFLASH, tensor_parallel_size=2),
        {"drafter_config": QWEN36, "tensor_parallel_size": 2},
        [(E, "speculative_config.tensor_parallel_size")],
        "draft_tensor_parallel_size",
    ),
    (
        "draft TP neither 1 nor target",
        dict(DFLASH, draft_tensor_parallel_size=2),
        {"drafter_config": QWEN36, "tensor_parallel_size": 4},
        [(E, "speculative_config.draft_tensor_parallel_size")],
        "set 1 or 4",
    ),
    (
        "draft TP equal to target",
        dict(DFLASH, draft_tensor_parallel_size=4),
        {"drafter_config": QWEN36, "tensor_parallel_size": 4},
        [],
        None,
    ),
    (
        "draft TP 1",
        dict(DFLASH, draft_tensor_parallel_size=1),
        {"drafter_config": QWEN36, "tensor_parallel_size": 4},
        [],
        None,
    ),
    (
        "target TP not positive",
        DFLASH,
        {"drafter_config": QWEN36, "tensor_parallel_size": 0},
        [(E, "tensor_parallel_size")],
        "positive integer",
    ),
    (
        "synthetic without its parameters",
        dict(DFLASH, rejection_sample_method="synthetic"),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.synthetic_acceptance_length")],
        "exactly one of",
    ),
    (
        "synthetic with both parameters",
        dict(
            DFLASH,
            rejection_sample_method="synthetic",
            synthetic_acceptance_length=3.0,
            synthetic_acceptance_rates=[0.5] * 15,
        ),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.synthetic_acceptance_length")],
        "exactly one of",
    ),
    (
        "synthetic length: test-only",
        dict(DFLASH, rejection_sample_method="synthetic", synthetic_acceptance_length=3.0),
        {"drafter_config": QWEN36},
        [(W, "speculative_config.rejection_sample_method")],
        "test-only",
    ),
    (
        "synthetic length out of range",
        dict(DFLASH, num_speculative_tokens=7, rejection_sample_method="synthetic", synthetic_acceptance_length=9.5),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.synthetic_acceptance_length"), (W, "speculative_config.rejection_sample_method")],
        "test-only",
    ),
    (
        "synthetic rates of the wrong length",
        dict(DFLASH, num_speculative_tokens=4, rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.8]),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.synthetic_acceptance_rates"), (W, "speculative_config.rejection_sample_method")],
        "test-only",
    ),
    (
        "synthetic rates increasing",
        dict(
            DFLASH,
            num_speculative_tokens=3,
            rejection_sample_method="synthetic",
            synthetic_acceptance_rates=[0.4, 0.6, 0.2],
        ),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.synthetic_acceptance_rates"), (W, "speculative_config.rejection_sample_method")],
        "test-only",
    ),
    (
        "synthetic parameter without synthetic",
        dict(DFLASH, synthetic_acceptance_length=3.0),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.synthetic_acceptance_length")],
        "only valid with rejection_sample_method: synthetic",
    ),
    (
        "unknown rejection sampler",
        dict(DFLASH, rejection_sample_method="greedy"),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.rejection_sample_method")],
        "standard, synthetic, block",
    ),
    (
        "causal-only backend for a non-causal drafter",
        dict(DFLASH, attention_backend="TRITON_MLA"),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.attention_backend")],
        "non-causal",
    ),
    (
        "causal-only backend for an all-causal drafter",
        dict(DFLASH, attention_backend="TRITON_MLA"),
        {"drafter_config": with_changes(QWEN36, layer_types=["sliding_attention"] * 5)},
        [],
        None,
    ),
    ("flash_attn in lower case", dict(DFLASH, attention_backend="flash_attn"), {"drafter_config": QWEN36}, [], None),
    ("auto backend", dict(DFLASH, attention_backend="auto"), {"drafter_config": QWEN36}, [], None),
    (
        "misspelt backend",
        dict(DFLASH, attention_backend="FLASH_ATN"),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.attention_backend")],
        "use FLASH_ATTN",
    ),
    (
        "misspelt key",
        dict(DFLASH, num_speculative_token=15),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.num_speculative_token")],
        "rename it num_speculative_tokens",
    ),
    (
        "unknown key",
        dict(DFLASH, brand_new_knob=1),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.brand_new_knob")],
        "refuses unknown fields",
    ),
    (
        "unknown key judged by a fallback table",
        dict(DFLASH, brand_new_knob=1),
        {"drafter_config": QWEN36, "vllm_facts": facts(caps=None)},
        [(W, "speculative_config.brand_new_knob"), (W, "vllm_facts.capabilities")],
        "unless the installed vLLM added this field",
    ),
    (
        "kebab-case keys",
        {"method": "dflash", "model": "m", "num-speculative-tokens": "15"},
        {"drafter_config": QWEN36},
        [],
        None,
    ),
    (
        "not a DFlash architecture",
        DFLASH,
        {"drafter_config": drafter("qwen3_target_not_dflash.json")},
        [
            (E, "drafter_config.architectures"),
            (E, "drafter_config.dflash_config.mask_token_id"),
            (E, "speculative_config.num_speculative_tokens"),
            (W, "drafter_config.dflash_config.target_layer_ids"),
        ],
        "missing",
    ),
    (
        "Laguna DFlash architecture",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, architectures=["DFlashLagunaForCausalLM"])},
        [],
        None,
    ),
    (
        "target layer out of range",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, dflash_config__target_layer_ids=[1, 16, 31, 46, 64])},
        [(E, "drafter_config.dflash_config.target_layer_ids")],
        "[64] out of range for num_target_layers 64",
    ),
    (
        "target layers not integers",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, dflash_config__target_layer_ids="1,16")},
        [(E, "drafter_config.dflash_config.target_layer_ids")],
        "list of integers",
    ),
    (
        "target layers missing",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, dflash_config__target_layer_ids=None)},
        [(W, "drafter_config.dflash_config.target_layer_ids")],
        "default auxiliary layers",
    ),
    (
        "mask token missing",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, dflash_config__mask_token_id=None)},
        [(E, "drafter_config.dflash_config.mask_token_id")],
        "mask token",
    ),
    (
        "layer_types shorter than the layers",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, num_hidden_layers=6)},
        [(E, "drafter_config.layer_types")],
        "5 entries for num_hidden_layers 6",
    ),
    (
        "sliding layers without a window",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, sliding_window=None)},
        [(E, "drafter_config.sliding_window")],
        "no window size",
    ),
    (
        "bug 1: no +1 offset on V1 (0.20.1, tiny drafter)",
        {"method": "dflash", "model": "/m/tiny"},
        {"drafter_config": TINY, "vllm_facts": FACTS_0201},
        [(E, "drafter_config.dflash_config.target_layer_ids")],
        "one layer too early",
    ),
    (
        "bug 1: no +1 offset on V2",
        DFLASH,
        {"drafter_config": QWEN36, "vllm_facts": facts(dflash_aux_layer_offset_v2=False)},
        [(E, "drafter_config.dflash_config.target_layer_ids")],
        "V2 model runner",
    ),
    (
        "no DFlash on V2: its offset does not matter (0.22-like)",
        DFLASH,
        {"drafter_config": TINY, "vllm_facts": facts(dflash_v2_runner=False, dflash_aux_layer_offset_v2=False)},
        [],
        None,
    ),
    (
        "explicit aux layer ids bypass the offset",
        DFLASH,
        {
            "drafter_config": with_changes(TINY, eagle_aux_hidden_state_layer_ids=[1, 2, 3]),
            "vllm_facts": facts(dflash_aux_layer_offset=None, dflash_aux_layer_offset_v2=None),
        },
        [],
        None,
    ),
    (
        "bugs 1 and 2 on 0.20.1 (qwen3.6-like drafter)",
        DFLASH,
        {"drafter_config": QWEN36, "vllm_facts": FACTS_0201},
        [(E, "drafter_config.dflash_config.target_layer_ids"), (E, "drafter_config.layer_types")],
        "one layer too early",
    ),
    (
        "bug 2 alone",
        DFLASH,
        {"drafter_config": QWEN36, "vllm_facts": facts(dflash_sliding_window=False)},
        [(E, "drafter_config.layer_types")],
        "runs sliding-window drafter layers as full attention",
    ),
    (
        "bug 2 for dflash_config.use_swa",
        DFLASH,
        {
            "drafter_config": with_changes(TINY, dflash_config__use_swa=True, sliding_window=512),
            "vllm_facts": facts(dflash_sliding_window=False),
        },
        [(E, "drafter_config.layer_types")],
        "as full attention",
    ),
    (
        "mixed layers on 0.25.0",
        DFLASH,
        {"drafter_config": QWEN36, "vllm_facts": FACTS_0250},
        [(E, "drafter_config.layer_types")],
        "cannot run",
    ),
    (
        "uniform sliding layers on 0.25.0",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, layer_types=["sliding_attention"] * 5), "vllm_facts": FACTS_0250},
        [],
        None,
    ),
    (
        "mixed layers, V2 disabled in env",
        DFLASH,
        {"drafter_config": QWEN36, "env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}},
        [(E, "env.VLLM_USE_V2_MODEL_RUNNER")],
        "only on the V2 model runner",
    ),
    (
        "mixed layers, no automatic V2, env unset",
        DFLASH,
        {"drafter_config": QWEN36, "vllm_facts": facts(dflash_mixed_attention_auto_v2=False)},
        [(E, "env.VLLM_USE_V2_MODEL_RUNNER")],
        "set VLLM_USE_V2_MODEL_RUNNER=1",
    ),
    (
        "mixed layers, no automatic V2, env 1",
        DFLASH,
        {
            "drafter_config": QWEN36,
            "vllm_facts": facts(dflash_mixed_attention_auto_v2=None),
            "env": {"VLLM_USE_V2_MODEL_RUNNER": 1},
        },
        [],
        None,
    ),
    (
        "env flag not an integer",
        DFLASH,
        {"drafter_config": TINY, "env": {"VLLM_USE_V2_MODEL_RUNNER": "true"}},
        [(E, "env.VLLM_USE_V2_MODEL_RUNNER")],
        "int()",
    ),
    (
        "env flag a YAML boolean",
        DFLASH,
        {"drafter_config": QWEN36, "env": {"VLLM_USE_V2_MODEL_RUNNER": True}},
        [(E, "env.VLLM_USE_V2_MODEL_RUNNER")],
        "quoted in YAML",
    ),
    (
        "probe not run",
        DFLASH,
        {"drafter_config": QWEN36, "vllm_facts": facts(dflash_sliding_window=None)},
        [(E, "vllm_facts.probes.dflash_sliding_window")],
        "probe dflash_sliding_window not run. Fix: add it to vllm_probes",
    ),
    (
        "no facts at all",
        {"method": "dflash", "model": "/m/tiny"},
        {"drafter_config": TINY, "vllm_facts": None},
        [
            (E, "vllm_facts.probes.dflash_aux_layer_offset"),
            (E, "vllm_facts.probes.dflash_v2_runner"),
            (W, "vllm_facts.capabilities"),
        ],
        "not run",
    ),
    (
        "probe failed",
        DFLASH,
        {
            "drafter_config": QWEN36,
            "vllm_facts": dict(
                facts(dflash_sliding_window=None), probe_errors={"dflash_sliding_window": "no such file"}
            ),
        },
        [(E, "vllm_facts.probes.dflash_sliding_window")],
        "failed on vLLM 0.26.0: no such file",
    ),
    (
        "capability_probes remapped",
        DFLASH,
        {
            "drafter_config": QWEN36,
            "vllm_facts": dict(facts(dflash_sliding_window=None), probes=dict(ALL_TRUE, pr40898_swa=True)),
            "capability_probes": {"sliding_window": "pr40898_swa"},
        },
        [],
        None,
    ),
    (
        "registered vllm_facts result",
        DFLASH,
        {"drafter_config": QWEN36, "vllm_facts": {"changed": False, "ansible_facts": {"vllm": FACTS_0201}}},
        [(E, "drafter_config.dflash_config.target_layer_ids"), (E, "drafter_config.layer_types")],
        "0.20.1",
    ),
    (
        "no drafter for a hub id",
        DFLASH,
        {},
        [(E, "drafter_config"), (E, "speculative_config.num_speculative_tokens")],
        "not a directory on this host",
    ),
    (
        "speculators-format drafter",
        DFLASH,
        {"drafter_config": drafter("speculators_dflash.json"), "vllm_facts": facts(dflash_aux_layer_offset=False)},
        [],
        None,
    ),
]


F033 = facts("0.33.0", "0.33.0", dflash_mixed_attention_auto_v2=None)
MIXED_033 = {"drafter_config": QWEN36, "vllm_facts": F033}

# What changed by 0.33.0, judged by what each release answered (its captured capabilities).
CASES += [
    ("medusa on 0.26.0", {"method": "medusa", "model": "m", "num_speculative_tokens": 3}, {}, [], None),
    (
        "medusa dropped by 0.33.0",
        {"method": "medusa", "model": "m", "num_speculative_tokens": 3},
        {"vllm_facts": F033},
        [(E, "speculative_config.method")],
        "'medusa' is not a speculative method of vLLM 0.33.0",
    ),
    (
        "mlp_speculator dropped by 0.33.0",
        {"method": "mlp_speculator", "model": "m", "num_speculative_tokens": 3},
        {"vllm_facts": F033},
        [(E, "speculative_config.method")],
        "is not a speculative method of vLLM 0.33.0",
    ),
    ("dspark on 0.33.0", {"method": "dspark", "model": "z-lab/x-DSpark"}, {"vllm_facts": F033}, [], None),
    (
        "an MTP alias 0.33.0 added",
        {"method": "kimi_k3_mtp", "num_speculative_tokens": 1},
        {"vllm_facts": F033},
        [(W, "speculative_config.method")],
        "replaces it with mtp",
    ),
    (
        "an MTP alias 0.26.0 does not know",
        {"method": "kimi_k3_mtp", "num_speculative_tokens": 1},
        {},
        [(E, "speculative_config.method")],
        "not a speculative method of vLLM 0.26.0",
    ),
    ("fly sampler on 0.33.0", dict(DFLASH, rejection_sample_method="fly"), MIXED_033, [], None),
    (
        "fly sampler on 0.26.0",
        dict(DFLASH, rejection_sample_method="fly"),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.rejection_sample_method")],
        "use one of standard, synthetic, block",
    ),
    ("a field 0.33.0 added", dict(DFLASH, fly_window_size=4), MIXED_033, [], None),
    (
        "a field 0.33.0 added, misspelt",
        dict(DFLASH, fly_window_sise=4),
        MIXED_033,
        [(E, "speculative_config.fly_window_sise")],
        "rename it fly_window_size",
    ),
    (
        "a field 0.26.0 lacks",
        dict(DFLASH, xpress_topc=4),
        {"drafter_config": QWEN36},
        [(E, "speculative_config.xpress_topc")],
        "not a SpeculativeConfig field of vLLM 0.26.0",
    ),
    (
        "DFlash2 drafter on 0.33.0",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, architectures=["DFlash2DraftModel"]), "vllm_facts": F033},
        [],
        None,
    ),
    (
        "LiLiCorr drafter on 0.33.0 (loaded unprefixed)",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, architectures=["LiLiCorrDraftModel"]), "vllm_facts": F033},
        [],
        None,
    ),
    (
        "XPress drafter on 0.33.0",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, architectures=["DFlashQwen3XPressModel"]), "vllm_facts": F033},
        [],
        None,
    ),
    (
        "DFlash2 drafter on 0.26.0",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, architectures=["DFlash2DraftModel"])},
        [(E, "drafter_config.architectures")],
        "which vLLM 0.26.0 does not register",
    ),
    (
        "top-level mask_token_id",
        DFLASH,
        {"drafter_config": with_changes(QWEN36, dflash_config__mask_token_id=None, mask_token_id=248070)},
        [],
        None,
    ),
    (
        "top-level is_causal on 0.33.0 makes a causal-only backend fine",
        dict(DFLASH, attention_backend="TRITON_MLA"),
        {"drafter_config": with_changes(QWEN36, is_causal=True), "vllm_facts": F033},
        [],
        None,
    ),
    (
        "top-level is_causal is not read by 0.26.0",
        dict(DFLASH, attention_backend="TRITON_MLA"),
        {"drafter_config": with_changes(QWEN36, is_causal=True)},
        [(E, "speculative_config.attention_backend")],
        "non-causal",
    ),
    (
        "serve-level backend inherited by the drafter",
        DFLASH,
        {"drafter_config": QWEN36, "vllm_facts": F033, "serve_config": {"attention-backend": "TRITON_MLA"}},
        [(E, "serve_config.attention-backend")],
        "speculative_config.attention_backend: FLASH_ATTN",
    ),
    (
        "serve-level backend overridden by the drafter's own",
        dict(DFLASH, attention_backend="FLASH_ATTN"),
        {"drafter_config": QWEN36, "vllm_facts": F033, "serve_config": {"attention-backend": "TRITON_MLA"}},
        [],
        None,
    ),
    (
        "serve-level backend unknown",
        DFLASH,
        {"drafter_config": QWEN36, "vllm_facts": F033, "serve_config": {"attention-backend": "FLASH_ATN"}},
        [(E, "serve_config.attention-backend")],
        "use FLASH_ATTN",
    ),
    # 0.29.0+: V2 by default, so the mixed drafter needs no VLLM_USE_V2_MODEL_RUNNER (and no 0.26 probe).
    ("mixed layers on 0.33.0, env unset", DFLASH, MIXED_033, [], None),
    (
        "mixed layers on 0.33.0, V2 disabled in env",
        DFLASH,
        dict(MIXED_033, env={"VLLM_USE_V2_MODEL_RUNNER": "0"}),
        [(E, "env.VLLM_USE_V2_MODEL_RUNNER")],
        "V1 refuses it",
    ),
    (
        "mixed layers without capabilities: the 0.33.0 table says V2 by default",
        DFLASH,
        {"drafter_config": QWEN36, "vllm_facts": facts("0.33.0", None, dflash_mixed_attention_auto_v2=False)},
        [(W, "vllm_facts.capabilities")],
        "fallback tables of vLLM 0.33.0",
    ),
]


@pytest.mark.parametrize(
    ("spec", "kwargs", "expected", "phrase"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_preflight_findings(
    spec: Dict[str, Any], kwargs: Dict[str, Any], expected: List[Tuple[str, str]], phrase: Optional[str]
) -> None:
    kwargs = dict(kwargs)
    kwargs.setdefault("vllm_facts", facts())
    result = preflight(spec, **kwargs)
    assert levels_and_fields(result) == sorted(expected), result["findings"]
    assert result["error_count"] == sum(1 for finding in expected if finding[0] == E)
    assert result["warning_count"] == sum(1 for finding in expected if finding[0] == W)
    for finding in result["findings"]:
        # Each message names its field and a fix.
        assert finding["message"].startswith(finding["field"] + ": ")
        assert ". Fix: " in finding["message"]
    if phrase:
        assert any(phrase in finding["message"] for finding in result["findings"]), result["findings"]


def test_normalised_config_gets_vllm_spelling_method_and_default_k() -> None:
    spec = {"model": "z-lab/Qwen3.6-27B-DFlash", "attention-backend": "flash_attn"}
    result = preflight(spec, drafter_config=QWEN36, vllm_facts=facts())
    assert result["speculative_config"] == {
        "model": "z-lab/Qwen3.6-27B-DFlash",
        "attention_backend": "flash_attn",
        "method": "dflash",
        "num_speculative_tokens": 15,
    }
    assert spec == {"model": "z-lab/Qwen3.6-27B-DFlash", "attention-backend": "flash_attn"}  # input untouched


def test_k_of_the_real_drafter_is_its_block_size_minus_one() -> None:
    result = preflight({"method": "dflash", "model": "/m"}, drafter_config=TINY, vllm_facts=facts())
    assert result["speculative_config"]["num_speculative_tokens"] == TINY["block_size"] - 1 == 7


def test_templated_k_string_becomes_an_int() -> None:
    result = preflight(dict(DFLASH, num_speculative_tokens="15"), drafter_config=QWEN36, vllm_facts=facts())
    assert result["speculative_config"]["num_speculative_tokens"] == 15


def test_keys_given_twice_with_different_values() -> None:
    spec = dict(DFLASH, num_speculative_tokens=15, **{"num-speculative-tokens": 7})
    result = preflight(spec, drafter_config=QWEN36, vllm_facts=facts())
    assert levels_and_fields(result) == [(E, "speculative_config.num_speculative_tokens")]


def test_probes_are_only_asked_when_they_matter() -> None:
    # A full-attention drafter on a vLLM with the offsets: the sliding-window probes are never read.
    result = preflight(
        DFLASH,
        drafter_config=TINY,
        vllm_facts=facts(
            dflash_sliding_window=None, dflash_mixed_attention_v2=None, dflash_mixed_attention_auto_v2=None
        ),
    )
    assert result["findings"] == []


def test_speculators_format_is_converted_like_vllm() -> None:
    config, path = load_drafter_config(drafter("speculators_dflash.json"))
    assert path is None
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 17, 32, 47, 62]
    assert config["dflash_config"] == {
        "mask_token_id": 248070,
        "target_layer_ids": [1, 16, 31, 46, 61],
        "causal": False,
    }
    assert config["num_hidden_layers"] == 5 and config["block_size"] == 16


def test_broken_json_is_an_error_finding() -> None:
    result = preflight(DFLASH, drafter_config=str(DRAFTERS / "broken.json"), vllm_facts=facts())
    assert levels_and_fields(result) == [(E, "drafter_config"), (E, "speculative_config.num_speculative_tokens")]
    assert "broken.json is not valid JSON" in result["findings"][0]["message"]


def test_not_a_mapping() -> None:
    with pytest.raises(PreflightError, match=r"^speculative_config: expected a dict"):
        preflight(["method", "dflash"])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("layer_types", "dflash_extra", "expected"),
    [
        (["full_attention"] * 5, {}, True),
        (["sliding_attention"] * 5, {}, False),
        (["sliding_attention"] * 4 + ["full_attention"], {}, True),
        (["full_attention"] * 5, {"causal": True}, False),
        (["sliding_attention"] * 5, {"causal": False}, True),
        (None, {}, True),
    ],
)
def test_dflash_needs_non_causal(
    layer_types: Optional[List[str]], dflash_extra: Dict[str, Any], expected: bool
) -> None:
    config = with_changes(QWEN36, layer_types=layer_types)
    config["dflash_config"].update(dflash_extra)
    assert dflash_needs_non_causal(config) is expected


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), ("1", True), ("0", False), (1, True), (" 2 ", True), ("00", False)]
)
def test_parse_env_flag(value: Any, expected: Optional[bool]) -> None:
    assert parse_env_flag(value) is expected


@pytest.mark.parametrize("value", ["true", "", "yes", True, False])
def test_parse_env_flag_refuses_what_vllm_cannot_read(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_env_flag(value)


def test_cores_are_python38_syntax() -> None:
    for core in (_preflight, _drafter, _vllm_data):
        ast.parse(Path(core.__file__).read_text(), feature_version=(3, 8))


# --------------------------------------------------------------------------- probes (data)

PROBES = yaml.safe_load(PROBES_YML.read_text())
PROBE_BY_NAME = {probe["name"]: probe for probe in PROBES["vllm_probes"]}
VERSIONS = ("0.20.1", "0.22.0", "0.24.0", "0.25.0", "0.26.0", "0.28.0", "0.30.0", "0.33.0")
SINCE_024 = ("0.24.0", "0.25.0", "0.26.0", "0.28.0", "0.30.0", "0.33.0")
SINCE_026 = ("0.26.0", "0.28.0", "0.30.0", "0.33.0")
# Which probes match which release (docs/probes.md has the full table, 0.20.1 to 0.33.0).
EXPECTED_MATCHES = {
    "dflash_aux_layer_offset": ("0.22.0", *SINCE_024),
    "dflash_aux_layer_offset_v2": SINCE_024,
    "dflash_v2_runner": SINCE_024,
    "dflash_sliding_window": SINCE_024[1:],
    "dflash_mixed_attention_v2": SINCE_026,
    # 0.26-0.28: V2 forced for such a drafter; 0.29+: V2 is the default and V1 lists it as unsupported
    "dflash_mixed_attention_auto_v2": SINCE_026,
}


def snippet(version: str, path: str) -> str:
    return (SNIPPETS / version / (path + ".txt")).read_text()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(EXPECTED_MATCHES))
def test_probe_matches_exactly_the_fixed_releases(name: str, version: str) -> None:
    probe = PROBE_BY_NAME[name]
    found = re.findall(probe["pattern"], snippet(version, probe["path"]))
    assert len(found) == (1 if version in EXPECTED_MATCHES[name] else 0)


@pytest.mark.parametrize("version", ["0.26.0", "0.33.0"])
@pytest.mark.parametrize("name", sorted(EXPECTED_MATCHES))
def test_probe_survives_rewrapping(name: str, version: str) -> None:
    """Black/ruff may re-wrap the code: one line, or every token on its own line, still matches."""
    probe = PROBE_BY_NAME[name]
    text = snippet(version, probe["path"])
    one_line = re.sub(r"\s*\n\s*", " ", text)
    spread = re.sub(r"([(\[,])\s*", "\\1\n        ", text)
    for variant in (one_line, spread, text.replace("    ", "\t")):
        assert re.search(probe["pattern"], variant), variant


def test_probe_data_covers_the_default_questions() -> None:
    assert PROBES["dflash_config_capability_probes"] == DEFAULT_CAPABILITY_PROBES
    assert set(PROBE_BY_NAME) == set(DEFAULT_CAPABILITY_PROBES.values()) == set(EXPECTED_MATCHES)


def test_docs_hold_the_same_probe_yaml() -> None:
    doc = (ROOT / "docs" / "probes.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", doc, re.S)
    assert block is not None
    assert yaml.safe_load(block.group(1)) == PROBES


# --------------------------------------------------------------------------- serve config

SERVE_CASES = [
    ("known flags", {"model": "m", "port": 8000, "enable-prefix-caching": True}, [], None),
    ("underscore spelling", {"served_model_name": "tiny"}, [], None),
    (
        "unknown flag with a close match",
        {"enable-prefix-cachin": True},
        [(E, "serve_config.enable-prefix-cachin")],
        "rename it enable-prefix-caching",
    ),
    ("unknown flag", {"brand-new-knob": 1}, [(E, "serve_config.brand-new-knob")], "not a flag of vLLM 0.26.0"),
    ("negated the way vLLM honours", {"no-enable-prefix-caching": True}, [], None),
    (
        "false, which vLLM drops",
        {"enable-prefix-caching": False},
        [(E, "serve_config.enable-prefix-caching")],
        "write no-enable-prefix-caching: true",
    ),
    (
        "false for a switch without a negative form",
        {"no-headless": True},
        [(E, "serve_config.headless")],
        "remove headless from vllm_serve_extra_args",
    ),
    ("true for a flag with a value", {"port": True}, [(E, "serve_config.port")], "give its value, quoted"),
    ("a value outside the choices", {"kv-cache-dtype": "fp4"}, [(E, "serve_config.kv-cache-dtype")], "fp8"),
    ("an empty list", {"served-model-name": []}, [(E, "serve_config.served-model-name")], "dropped"),
]


@pytest.mark.parametrize(("serve", "expected", "phrase"), [pytest.param(*case[1:], id=case[0]) for case in SERVE_CASES])
def test_serve_config_against_the_installed_parser(
    serve: Dict[str, Any], expected: List[Tuple[str, str]], phrase: Optional[str]
) -> None:
    result = preflight({}, vllm_facts=facts(), serve_config=serve)
    assert levels_and_fields(result) == sorted(expected), result["findings"]
    if phrase:
        assert phrase in result["findings"][0]["message"], result["findings"]


def test_false_for_a_switch_whose_negative_0_33_spells_disable() -> None:
    # 0.33.0: --enable-cascade-attn is an alias of --no-disable-cascade-attn; there is no --no-enable-cascade-attn
    result = preflight({}, vllm_facts=facts("0.33.0", "0.33.0"), serve_config={"no-enable-cascade-attn": True})
    assert levels_and_fields(result) == [(E, "serve_config.enable-cascade-attn")]
    assert "Fix: set disable-cascade-attn: true instead" in result["findings"][0]["message"]
    # what the negatable flags that have a --no- form get instead: accepted
    assert (
        preflight({}, vllm_facts=facts("0.33.0", "0.33.0"), serve_config={"no-enable-prefix-caching": True})["findings"]
        == []
    )


def test_serve_config_without_capabilities_is_not_checked_and_says_so() -> None:
    result = preflight({}, vllm_facts=facts(caps=None), serve_config={"brand-new-knob": 1})
    assert levels_and_fields(result) == [(W, "serve_config")]
    assert "timed out" in result["findings"][0]["message"]


def test_serve_config_must_be_a_mapping() -> None:
    with pytest.raises(PreflightError, match=r"^serve_config: expected a dict"):
        preflight({}, vllm_facts=facts(), serve_config=["port"])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- every release, as captured

# The seed's drafter (4 sliding + 1 full layers) with the serve config dflash_config writes, on each release:
# what its captured capabilities and its probes (run on its sources' excerpts) make of it.
SEED_VERDICT = {
    "0.20.1": ["drafter_config.dflash_config.target_layer_ids", "drafter_config.layer_types"],
    "0.22.0": ["drafter_config.layer_types"],
    "0.24.0": ["drafter_config.layer_types"],
    "0.26.0": [],
    "0.28.0": [],
    "0.30.0": [],
    "0.33.0": [],
}
SERVE = {
    "model": "Qwen/Qwen3.6-27B",
    "host": "127.0.0.1",
    "port": 8000,
    "tensor-parallel-size": 2,
    "served-model-name": "qwen36",
    "no-enable-prefix-caching": True,
    "speculative-config": {"method": "dflash", "model": "z-lab/Qwen3.6-27B-DFlash"},
}


def probed(version: str) -> Dict[str, bool]:
    return {name: bool(re.search(p["pattern"], snippet(version, p["path"]))) for name, p in PROBE_BY_NAME.items()}


@pytest.mark.parametrize("version", sorted(SEED_VERDICT))
def test_the_seed_drafter_on_every_release(version: str) -> None:
    vllm_facts = {"version": version, "probes": probed(version), "capabilities": capabilities(version)}
    result = preflight(DFLASH, drafter_config=QWEN36, vllm_facts=vllm_facts, tensor_parallel_size=2, serve_config=SERVE)
    assert sorted(f["field"] for f in result["findings"] if f["level"] == E) == SEED_VERDICT[version], result
    assert result["capabilities_used"] == "vllm"
    assert result["speculative_config"]["num_speculative_tokens"] == 15


SOURCES = Path("/work/vllm-src")  # unpacked PyPI wheels (make compat), where present


@pytest.mark.skipif(not SOURCES.is_dir(), reason="no unpacked vLLM wheels in /work/vllm-src")
@pytest.mark.parametrize("version", [v for v in VERSIONS if (SOURCES / v / "vllm").is_dir()])
def test_probes_on_the_whole_files_of_each_wheel(version: str) -> None:
    for name, probe in PROBE_BY_NAME.items():
        path = SOURCES / version / "vllm" / probe["path"]
        text = path.read_text() if path.is_file() else ""
        assert len(re.findall(probe["pattern"], text)) == (1 if version in EXPECTED_MATCHES[name] else 0), name


# ------------------------------------------------------------------------------- issue 28: trust-remote-code


@pytest.mark.parametrize("spelling", ["trust-remote-code", "trust_remote_code"])
def test_trust_remote_code_is_a_warning_that_says_what_runs(spelling: str) -> None:
    # At 4893f05 it passed without a word.
    drafter = dict(QWEN36, auto_map={"AutoConfig": "configuration_dflash.DFlashConfig", "AutoModel": "m.X"})
    result = preflight(dict(DFLASH), drafter_config=drafter, vllm_facts=facts(), serve_config={spelling: True})
    assert levels_and_fields(result) == [(W, "serve_config.trust-remote-code")], result["findings"]
    text = result["findings"][0]["message"]
    assert "run the Python files shipped in the model repos, the target's and the drafter's" in text
    assert "auto_map: configuration_dflash.DFlashConfig, m.X" in text and "pin both revisions" in text


def test_no_trust_remote_code_no_warning() -> None:
    for serve in ({}, {"trust-remote-code": False}, {"no-trust-remote-code": True}):
        result = preflight(dict(DFLASH), drafter_config=dict(QWEN36), vllm_facts=facts(), serve_config=serve)
        assert not [f for f in result["findings"] if "trust-remote-code" in f["field"] and f["level"] == W], serve
