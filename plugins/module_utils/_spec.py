# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight of a vLLM speculative config and its DFlash drafter against the installed vLLM.

Every rule mirrors what vLLM 0.26.0 does with the same input (``vllm/config/speculative.py``,
``vllm/config/vllm.py``, ``vllm/model_executor/models/qwen3_dflash.py``), so that a config that
would crash the service, or worse run with a drafter that silently accepts nothing, is refused
before the restart. What depends on the installed checkout (the seed's bugs) is not guessed from
the version string: it is read from the boolean probes that ``vllm_facts`` ran on its sources.

Standard library only: this runs on the target's system Python.
"""

from __future__ import annotations

import difflib
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import sha256_file

ERROR = "error"
WARNING = "warning"

# Deprecated method names that vLLM rewrites to "mtp" (MTPModelTypes, vllm/config/speculative.py).
MTP_METHOD_ALIASES = (
    "deepseek_mtp",
    "mimo_mtp",
    "mimo_v2_mtp",
    "glm4_moe_mtp",
    "glm4_moe_lite_mtp",
    "glm_ocr_mtp",
    "ernie_mtp",
    "nemotron_h_mtp",
    "exaone_moe_mtp",
    "exaone4_5_mtp",
    "qwen3_next_mtp",
    "qwen3_5_mtp",
    "longcat_flash_mtp",
    "minimax_m3_mtp",
    "bailing_hybrid_mtp",
    "pangu_ultra_moe_mtp",
    "step3p5_mtp",
    "hy_v3_mtp",
    "gemma4_mtp",
    "inkling_mtp",
)
# SpeculativeMethod of vLLM 0.26.0, after its aliases are folded.
SPECULATIVE_METHODS = (
    "ngram",
    "medusa",
    "mlp_speculator",
    "draft_model",
    "suffix",
    "custom_class",
    "eagle",
    "eagle3",
    "extract_hidden_states",
    "mtp",
    "dflash",
    "ngram_gpu",
    "dspark",
)
# Methods that load a draft checkpoint named by `model`.
METHODS_NEEDING_MODEL = ("draft_model", "eagle", "eagle3", "dflash", "medusa", "mlp_speculator")
# Methods for which vLLM finds num_speculative_tokens itself (suffix: tree depth; mtp/dspark: n_predict).
METHODS_WITH_OWN_K = ("suffix", "mtp", "dspark")

# Fields a user may set in SpeculativeConfig (vLLM 0.26.0; the class forbids extra fields).
SPECULATIVE_FIELDS = (
    "enforce_eager",
    "num_speculative_tokens",
    "model",
    "method",
    "draft_tensor_parallel_size",
    "tensor_parallel_size",
    "quantization",
    "moe_backend",
    "attention_backend",
    "kv_cache_dtype",
    "max_model_len",
    "revision",
    "code_revision",
    "disable_padded_drafter_batch",
    "use_local_argmax_reduction",
    "use_heterogeneous_vocab",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "parallel_drafting",
    "num_speculative_tokens_per_batch_size",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
    "draft_load_config",
    "rejection_sample_method",
    "synthetic_acceptance_rates",
    "synthetic_acceptance_length",
    "draft_sample_method",
)
REJECTION_SAMPLE_METHODS = ("standard", "synthetic", "block")
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")

# AttentionBackendEnum of vLLM 0.26.0 (vllm/v1/attention/backends/registry.py).
ATTENTION_BACKENDS = (
    "FLASH_ATTN",
    "FLASH_ATTN_DIFFKV",
    "TRITON_ATTN",
    "TRITON_ATTN_DIFFKV",
    "ROCM_ATTN",
    "ROCM_AITER_MLA",
    "ROCM_AITER_TRITON_MLA",
    "ROCM_AITER_FA",
    "ROCM_AITER_MLA_SPARSE",
    "XPU_MLA_SPARSE",
    "TORCH_SDPA",
    "FLASHINFER",
    "FLASHINFER_MLA",
    "TOKENSPEED_MLA",
    "FLASHINFER_MLA_SPARSE",
    "FLASHINFER_MLA_SPARSE_SM120",
    "TRITON_MLA",
    "CUTLASS_MLA",
    "FLASHMLA",
    "FLASHMLA_SPARSE",
    "FLASHMLA_SPARSE_DSV4",
    "FLASHINFER_MLA_SPARSE_DSV4",
    "ROCM_FLASHMLA_SPARSE_DSV4",
    "FLASH_ATTN_MLA",
    "FLASH_ATTN_MLA_SPARSE",
    "MINIMAX_M3_SPARSE",
    "NO_ATTENTION",
    "FLEX_ATTENTION",
    "HPC_ATTN",
    "ROCM_AITER_UNIFIED_ATTN",
    "CPU_ATTN",
    "TURBOQUANT",
    "CUSTOM",
)
# Backends whose supports_non_causal() is True in vLLM 0.26.0 (the *_DIFFKV ones inherit it).
NON_CAUSAL_BACKENDS = (
    "FLASH_ATTN",
    "FLASH_ATTN_DIFFKV",
    "TRITON_ATTN",
    "TRITON_ATTN_DIFFKV",
    "FLEX_ATTENTION",
    "FLASHINFER",
    "ROCM_ATTN",
    "ROCM_AITER_FA",
    "CPU_ATTN",
)
# Draft architectures vLLM 0.26.0 registers for DFlash (vllm/model_executor/models/registry.py).
DFLASH_ARCHITECTURES = ("DFlashDraftModel", "DFlashLagunaForCausalLM")
SLIDING_ATTENTION = "sliding_attention"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"

# question -> probe name in vllm_facts.probes; the probes themselves are data (docs/probes.md).
DEFAULT_CAPABILITY_PROBES = {
    "aux_layer_offset": "dflash_aux_layer_offset",
    "aux_layer_offset_v2": "dflash_aux_layer_offset_v2",
    "v2_runner_dflash": "dflash_v2_runner",
    "sliding_window": "dflash_sliding_window",
    "mixed_attention_v2": "dflash_mixed_attention_v2",
    "mixed_attention_auto_v2": "dflash_mixed_attention_auto_v2",
}


# Releases in which each probe first matches (docs/probes.md), for the fixes the findings propose.
AUX_OFFSET_FIX = (
    "deploy a vLLM with the +1 conversion of target_layer_ids (V1 runner: 0.22.0+, V2: 0.24.0+; e.g. 0.26.0)"
)
SLIDING_FIX = (
    "deploy a vLLM whose DFlash drafter honours layer_types/sliding_window (0.25.0+, or 0.26.0+ for mixed layers)"
)


def message(field: str, problem: str, fix: str) -> str:
    return f"{field}: {problem}. Fix: {fix}"


class PreflightError(Exception):
    """The input cannot be checked at all; the message names the input and the fix."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        super().__init__(message(field, problem, fix))
        self.field = field


# --------------------------------------------------------------------------- drafter config


def _read_json_object(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise PreflightError(
            "drafter_config",
            f"cannot read {path} ({exc.strerror or exc})",
            "point drafter_config at the drafter's config.json, its model directory or the Hugging Face cache",
        ) from exc
    except ValueError as exc:
        raise PreflightError(
            "drafter_config",
            f"{path} is not valid JSON ({exc})",
            "download the drafter again (the file is truncated or was edited by hand)",
        ) from exc
    if not isinstance(data, dict):
        raise PreflightError(
            "drafter_config",
            f"{path} holds a JSON {type(data).__name__}, not an object",
            "point drafter_config at the drafter's config.json",
        )
    return data


def _snapshot_dir(repo_dir: str, revision: Optional[str]) -> str:
    """The snapshot of a Hugging Face cache repo dir (`models--org--name`) that vLLM would load."""
    snapshots = os.path.join(repo_dir, "snapshots")
    ref_file = os.path.join(repo_dir, "refs", revision or "main")
    if os.path.isfile(ref_file):
        with open(ref_file, encoding="utf-8") as handle:
            return os.path.join(snapshots, handle.read().strip())
    if revision and os.path.isdir(os.path.join(snapshots, revision)):
        return os.path.join(snapshots, revision)
    found = sorted(os.listdir(snapshots)) if os.path.isdir(snapshots) else []
    if len(found) == 1 and not revision:
        return os.path.join(snapshots, found[0])
    raise PreflightError(
        "drafter_config",
        f"cannot tell which snapshot of {repo_dir} to use (revision {revision or 'main'}, "
        f"snapshots: {', '.join(found) or 'none'})",
        "set speculative_config.revision to one of them, or point drafter_config at the snapshot directory",
    )


def locate_drafter_config(path: str, model_id: Optional[str] = None, revision: Optional[str] = None) -> str:
    """The drafter's config.json from a file, a model or snapshot dir, a cache repo dir or a cache root.

    A cache root (`~/.cache/huggingface` or its `hub/`) needs the model id, e.g. `z-lab/Qwen3.6-27B-DFlash`.
    """
    path = os.path.expanduser(path)
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise PreflightError(
            "drafter_config",
            f"{path} does not exist on this host",
            "download the drafter first (e.g. `hf download <model>`) or correct the path",
        )
    if os.path.isfile(os.path.join(path, "config.json")):
        return os.path.join(path, "config.json")
    if os.path.basename(os.path.normpath(path)).startswith("models--"):
        return os.path.join(_snapshot_dir(path, revision), "config.json")
    if model_id and "/" in model_id and not os.path.isabs(model_id):
        repo_name = "models--" + model_id.replace("/", "--")
        for root in (path, os.path.join(path, "hub")):
            if os.path.isdir(os.path.join(root, repo_name)):
                return os.path.join(_snapshot_dir(os.path.join(root, repo_name), revision), "config.json")
    cached = f" and no cached {model_id} under it" if model_id else ""
    raise PreflightError(
        "drafter_config",
        f"no config.json in {path}{cached}",
        "point drafter_config at the drafter's config.json, its model directory or the Hugging Face cache holding it",
    )


def _from_speculators_format(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The HF config vLLM builds from a vllm-project/speculators DFlash checkpoint (speculators/algos.py)."""
    view = dict(config.get("transformer_layer_config") or {})
    aux_ids = config.get("aux_hidden_state_layer_ids")
    # Speculators name the aux hidden state (layer L's output is L + 1), DFlash names the layer L (vllm#40727).
    shifted = [i - 1 for i in aux_ids] if isinstance(aux_ids, list) and all(map(_is_int, aux_ids)) else aux_ids
    view["architectures"] = ["DFlashDraftModel"]
    view["eagle_aux_hidden_state_layer_ids"] = aux_ids
    view["dflash_config"] = {
        "mask_token_id": config.get("mask_token_id"),
        "target_layer_ids": shifted,
        "causal": not config.get("sliding_window_non_causal", True),
    }
    for key in ("block_size", "num_target_layers"):
        view.setdefault(key, config.get(key))
    return view


def load_drafter_config(
    source: Any, model_id: Optional[str] = None, revision: Optional[str] = None
) -> Tuple[Dict[str, Any], Optional[str]]:
    """(the drafter's HF config as vLLM sees it, the file it was read from, or None for a dict)."""
    path: Optional[str] = None
    if isinstance(source, Mapping):
        config = dict(source)
    elif isinstance(source, str) and source:
        path = locate_drafter_config(source, model_id, revision)
        config = _read_json_object(path)
    else:
        raise PreflightError(
            "drafter_config",
            f"expected a path or a dict, got {type(source).__name__}",
            "pass the path of the drafter's config.json (or its directory), or the parsed dict",
        )
    if config.get("speculators_model_type") == "dflash":
        config = _from_speculators_format(config)
    return config, path


# --------------------------------------------------------------------------- helpers


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_int(value: Any) -> Optional[int]:
    """An int, or a string of digits as Jinja templating leaves it; None for anything else."""
    if _is_int(value):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def parse_env_flag(value: Any) -> Optional[bool]:
    """A vLLM boolean env var as vLLM reads it, bool(int(value)); None when unset; ValueError when vLLM would fail."""
    if value is None:
        return None
    if isinstance(value, bool):
        # YAML `true` reaches the env file as "True", and int("True") fails inside vLLM.
        raise ValueError(f"a YAML boolean is written to the env file as {str(value)!r}")
    return bool(int(str(value)))


def dflash_needs_non_causal(drafter: Mapping[str, Any]) -> bool:
    """Whether any drafter layer is non-causal (dflash_has_any_non_causal in vLLM 0.26.0 qwen3_dflash.py).

    `dflash_config.causal` overrides every layer; otherwise only sliding-window layers are causal.
    """
    override = _mapping(drafter.get("dflash_config")).get("causal")
    if override is not None:
        return not override
    layer_types = drafter.get("layer_types")
    layer_types = layer_types if isinstance(layer_types, list) else []
    num_layers = _as_int(drafter.get("num_hidden_layers"))
    if num_layers is None:
        num_layers = max(len(layer_types), 1)
    return not all(i < len(layer_types) and layer_types[i] == SLIDING_ATTENTION for i in range(num_layers))


def _unwrap_facts(vllm_facts: Optional[Mapping[str, Any]]) -> Mapping[str, Any]:
    """ansible_facts.vllm itself, or the same taken out of a registered vllm_facts result."""
    facts: Mapping[str, Any] = vllm_facts or {}
    facts = _mapping(facts.get("ansible_facts")) or facts
    if "probes" not in facts and isinstance(facts.get("vllm"), Mapping):
        facts = facts["vllm"]
    return facts


# --------------------------------------------------------------------------- checks


class _Preflight:
    def __init__(
        self,
        vllm_facts: Optional[Mapping[str, Any]],
        capability_probes: Optional[Mapping[str, str]],
        env: Optional[Mapping[str, Any]],
    ) -> None:
        facts = _unwrap_facts(vllm_facts)
        self.version = str(facts.get("version") or "(version unknown)")
        self.probes = _mapping(facts.get("probes"))
        self.probe_errors = _mapping(facts.get("probe_errors"))
        self.capability_probes = dict(DEFAULT_CAPABILITY_PROBES)
        self.capability_probes.update(capability_probes or {})
        self.env = env or {}
        self.findings: List[Dict[str, str]] = []

    def error(self, field: str, problem: str, fix: str) -> None:
        self.findings.append({"level": ERROR, "field": field, "message": message(field, problem, fix)})

    def warn(self, field: str, problem: str, fix: str) -> None:
        self.findings.append({"level": WARNING, "field": field, "message": message(field, problem, fix)})

    def probe(self, question: str) -> Optional[bool]:
        """The probe's answer; None, with an error finding, when it was not run or failed."""
        name = self.capability_probes.get(question)
        if not name:
            self.error(
                f"capability_probes.{question}",
                "no probe is mapped to this question",
                f"map it to a probe name (default: {DEFAULT_CAPABILITY_PROBES.get(question)})",
            )
            return None
        answer = self.probes.get(name)
        if isinstance(answer, bool):
            return answer
        reason = self.probe_errors.get(name)
        if reason:
            problem = f"probe {name} failed on vLLM {self.version}: {reason}"
            fix = "correct its path or pattern in vllm_probes and re-run vllm_facts"
        else:
            problem = f"probe {name} not run"
            fix = "add it to vllm_probes (see docs/probes.md) and re-run vllm_facts before this preflight"
        self.error(f"vllm_facts.probes.{name}", problem, fix)
        return None

    # ----------------------------------------------------------------------- speculative config

    def normalise_keys(self, spec: Mapping[str, Any]) -> Dict[str, Any]:
        """Keys in vLLM's spelling (snake_case: the serve YAML's kebab-case stops at speculative-config)."""
        out: Dict[str, Any] = {}
        for key, value in spec.items():
            name = str(key).replace("-", "_")
            if name in out and out[name] != value:
                self.error(
                    f"speculative_config.{name}",
                    f"given twice, as {out[name]!r} and {value!r}",
                    f"keep one spelling: {name}",
                )
            out[name] = value
        for name in out:
            if name in SPECULATIVE_FIELDS:
                continue
            field = f"speculative_config.{name}"
            close = difflib.get_close_matches(name, SPECULATIVE_FIELDS, n=1, cutoff=0.8)
            if close:
                self.error(
                    field, "not a SpeculativeConfig field (vLLM refuses unknown fields)", f"rename it {close[0]}"
                )
            else:
                self.warn(
                    field,
                    "not a SpeculativeConfig field of vLLM 0.26.0, and vLLM refuses unknown fields",
                    "remove it, unless the pinned vLLM added this field",
                )
        return out

    def resolve_method(self, spec: Mapping[str, Any]) -> Optional[str]:
        """The method vLLM will run (SpeculativeConfig.__post_init__), or None when vLLM would refuse it."""
        model = spec.get("model")
        given = spec.get("method")
        field = "speculative_config.method"
        if given is None:
            method = "ngram" if model in ("ngram", "[ngram]") else "draft_model"
        elif isinstance(given, str):
            method = "ngram" if given == "[ngram]" else given
        else:
            self.error(field, f"must be a string, got {given!r}", f"set one of {', '.join(SPECULATIVE_METHODS)}")
            return None
        if method in MTP_METHOD_ALIASES:
            self.warn(field, f"{method} is deprecated and vLLM replaces it with mtp", "set method: mtp")
            method = "mtp"
        if method not in SPECULATIVE_METHODS:
            close = difflib.get_close_matches(method, SPECULATIVE_METHODS, n=1)
            self.error(
                field,
                f"unknown speculative method {method!r} (vLLM: Unsupported speculative method)",
                f"use {close[0]}" if close else f"use one of {', '.join(SPECULATIVE_METHODS)}",
            )
            return None
        # vLLM re-detects draft-checkpoint methods from the model name, whether or not a method was given.
        if isinstance(model, str) and method in ("draft_model", "medusa", "mlp_speculator", "mtp"):
            lowered = model.lower()
            for marker, detected in (
                ("eagle-", "eagle"),
                ("eagle3", "eagle3"),
                ("dflash", "dflash"),
                ("dspark", "dspark"),
            ):
                if marker in lowered:
                    if given is not None:
                        self.warn(
                            field,
                            f"vLLM runs {method} as {detected} because the model name contains {marker!r}",
                            f"set method: {detected}",
                        )
                    return detected
        return method

    def check_model(self, spec: Mapping[str, Any], method: Optional[str]) -> None:
        if method in METHODS_NEEDING_MODEL and not spec.get("model"):
            self.error(
                "speculative_config.model",
                f"missing, and method {method} loads a draft checkpoint",
                "set model to the drafter (e.g. z-lab/Qwen3.6-27B-DFlash or its local directory)",
            )

    def check_num_speculative_tokens(
        self, spec: Dict[str, Any], method: Optional[str], drafter: Optional[Mapping[str, Any]]
    ) -> Optional[int]:
        """K after defaulting (written back into spec), or None when missing or invalid."""
        field = "speculative_config.num_speculative_tokens"
        block_size = _as_int(drafter.get("block_size")) if drafter else None
        raw = spec.get("num_speculative_tokens")
        if raw is None:
            if method == "dflash" and block_size is not None and block_size > 1:
                # vLLM itself has no default for DFlash: without K it refuses to start.
                spec["num_speculative_tokens"] = block_size - 1
                return block_size - 1
            if method is not None and method not in METHODS_WITH_OWN_K:
                why = " and the drafter has no block_size to default from" if method == "dflash" else ""
                self.error(field, f"missing{why}", "set it; DFlash drafters use their block_size - 1, e.g. 15 for 16")
            return None
        k = _as_int(raw)
        if k is None:
            self.error(field, f"must be an integer, got {raw!r}", "set a positive integer such as 15")
            return None
        if k <= 0:
            self.error(field, f"must be greater than zero, got {k}", "set a positive integer (DFlash: block_size - 1)")
            return None
        spec["num_speculative_tokens"] = k
        if method == "dflash" and block_size is not None and k > block_size - 1:
            self.warn(
                field,
                f"{k} is more than the drafter's block_size - 1 = {block_size - 1}, the most it was trained to draft",
                f"set num_speculative_tokens: {block_size - 1}",
            )
        return k

    def check_parallelism(self, spec: Mapping[str, Any], tensor_parallel_size: Any) -> None:
        if "tensor_parallel_size" in spec:
            self.error(
                "speculative_config.tensor_parallel_size",
                "not valid inside the speculative config (vLLM raises ValueError)",
                "rename it draft_tensor_parallel_size (1 or the target's tensor_parallel_size)",
            )
        target_tp = _as_int(tensor_parallel_size)
        if target_tp is None or target_tp < 1:
            self.error(
                "tensor_parallel_size",
                f"must be a positive integer, got {tensor_parallel_size!r}",
                "pass the target's --tensor-parallel-size",
            )
            return
        raw = spec.get("draft_tensor_parallel_size")
        if raw is None:
            return
        field = "speculative_config.draft_tensor_parallel_size"
        draft_tp = _as_int(raw)
        if draft_tp is None or draft_tp < 1:
            self.error(field, f"must be a positive integer, got {raw!r}", f"set 1 or {target_tp}")
        elif draft_tp not in (1, target_tp):
            self.error(
                field,
                f"{draft_tp} is neither 1 nor the target's tensor_parallel_size {target_tp} (vLLM raises ValueError)",
                f"set 1 or {target_tp}",
            )

    def check_sampling(self, spec: Mapping[str, Any], k: Optional[int]) -> None:
        method = spec.get("rejection_sample_method", "standard")
        if method not in REJECTION_SAMPLE_METHODS:
            self.error(
                "speculative_config.rejection_sample_method",
                f"unknown value {method!r}",
                f"use one of {', '.join(REJECTION_SAMPLE_METHODS)}",
            )
        elif method == "synthetic":
            self._check_synthetic(spec.get("synthetic_acceptance_rates"), spec.get("synthetic_acceptance_length"), k)
        else:
            for name in ("synthetic_acceptance_rates", "synthetic_acceptance_length"):
                if spec.get(name) is not None:
                    self.error(
                        f"speculative_config.{name}",
                        "only valid with rejection_sample_method: synthetic (vLLM raises ValueError)",
                        "remove it (or set rejection_sample_method: synthetic in a test deployment)",
                    )
        draft_sample = spec.get("draft_sample_method", "greedy")
        if draft_sample not in DRAFT_SAMPLE_METHODS:
            self.error(
                "speculative_config.draft_sample_method",
                f"unknown value {draft_sample!r}",
                f"use one of {', '.join(DRAFT_SAMPLE_METHODS)}",
            )

    def _check_synthetic(self, rates: Any, length: Any, k: Optional[int]) -> None:
        if (rates is None) == (length is None):
            self.error(
                "speculative_config.synthetic_acceptance_length",
                "rejection_sample_method: synthetic needs exactly one of synthetic_acceptance_length and "
                "synthetic_acceptance_rates (vLLM raises ValueError)",
                "set synthetic_acceptance_length (e.g. 3.0) alone",
            )
            return
        self.warn(
            "speculative_config.rejection_sample_method",
            "synthetic is a test-only setting: vLLM accepts draft tokens at a forced rate, so the output is not "
            "the target model's and the acceptance metrics measure nothing",
            "use it only to test the acceptance gate; remove it (standard) in production",
        )
        if length is not None:
            field = "speculative_config.synthetic_acceptance_length"
            if not _is_number(length):
                self.error(field, f"must be a number, got {length!r}", "set a float such as 3.0")
            elif k is not None and not 1.0 <= length <= k + 1:
                self.error(field, f"{length} is outside [1, num_speculative_tokens + 1 = {k + 1}]", "set one inside")
            return
        field = "speculative_config.synthetic_acceptance_rates"
        if not isinstance(rates, list) or not all(_is_number(r) for r in rates):
            self.error(field, f"must be a list of numbers, got {rates!r}", "set e.g. [0.8, 0.6, 0.4]")
        elif k is not None and len(rates) != k:
            self.error(field, f"has {len(rates)} entries for {k} speculative tokens", "give one rate per token")
        elif not all(0.0 <= r <= 1.0 for r in rates):
            self.error(field, f"entries must be in [0, 1], got {rates!r}", "use probabilities")
        elif any(later > earlier for earlier, later in zip(rates, rates[1:])):
            self.error(
                field,
                f"must be non-increasing, got {rates!r} (they are unconditional per-position rates)",
                "sort them in decreasing order",
            )

    def check_attention_backend(
        self, spec: Mapping[str, Any], method: Optional[str], drafter: Optional[Mapping[str, Any]]
    ) -> None:
        backend = spec.get("attention_backend")
        if backend is None or str(backend).lower() == "auto":
            return
        field = "speculative_config.attention_backend"
        name = str(backend).upper()
        if name not in ATTENTION_BACKENDS:
            close = difflib.get_close_matches(name, ATTENTION_BACKENDS, n=1)
            self.error(
                field,
                f"unknown attention backend {backend!r} (vLLM raises ValueError)",
                f"use {close[0] if close else 'FLASH_ATTN, or auto'}",
            )
        elif (
            method == "dflash"
            and name not in NON_CAUSAL_BACKENDS
            and (drafter is None or dflash_needs_non_causal(drafter))
        ):
            # vllm/platforms/cuda.py raises "Selected backend ... is not valid" for an explicit backend.
            self.error(
                field,
                f"{name} has no non-causal attention, which this DFlash drafter needs: vLLM refuses the selected "
                "backend at startup ('non-causal attention not supported')",
                "set attention_backend: FLASH_ATTN, or leave it unset so that vLLM picks one",
            )

    def check_env(self) -> None:
        value = self.env.get(V2_RUNNER_ENV)
        try:
            parse_env_flag(value)
        except ValueError:
            self.error(
                f"env.{V2_RUNNER_ENV}",
                f"{value!r} is not an integer, and vLLM reads it with int() and fails to start",
                "set it to '1' or '0' (quoted in YAML)",
            )

    # ----------------------------------------------------------------------- drafter

    def check_drafter(self, drafter: Mapping[str, Any]) -> None:
        self._check_architecture(drafter)
        self._check_layer_config(drafter)
        self._check_target_layers(drafter)
        self._check_sliding_window(drafter)

    def _check_architecture(self, drafter: Mapping[str, Any]) -> None:
        field = "drafter_config.architectures"
        archs = drafter.get("architectures")
        if not isinstance(archs, list) or not archs:
            self.error(field, "missing", "use the drafter's original config.json (architectures: [DFlashDraftModel])")
            return
        # EAGLEConfig prefixes "DFlash" to a name that lacks it (vllm/transformers_utils/configs/eagle.py).
        loaded = [a if a.startswith("DFlash") or a.endswith("DFlash") else "DFlash" + a for a in map(str, archs)]
        if not set(loaded) & set(DFLASH_ARCHITECTURES):
            self.error(
                field,
                f"{', '.join(map(str, archs))} is not a DFlash drafter: vLLM would load {', '.join(loaded)}, "
                "which it does not register",
                f"set speculative_config.model to a DFlash drafter ({' or '.join(DFLASH_ARCHITECTURES)}), "
                "or the method that matches this checkpoint",
            )

    def _check_layer_config(self, drafter: Mapping[str, Any]) -> None:
        layer_types = drafter.get("layer_types")
        num_layers = _as_int(drafter.get("num_hidden_layers"))
        if isinstance(layer_types, list) and num_layers is not None and len(layer_types) != num_layers:
            self.error(
                "drafter_config.layer_types",
                f"has {len(layer_types)} entries for num_hidden_layers {num_layers}",
                "use the drafter's original config.json (one layer type per drafter layer)",
            )
        if not any(
            (
                "mask_token_id" in _mapping(drafter.get("dflash_config")),
                "pard_token" in drafter,
                "ptd_token_id" in drafter,
            )
        ):
            self.error(
                "drafter_config.dflash_config.mask_token_id",
                "missing: vLLM needs the mask token for parallel drafting and raises ValueError",
                "use the drafter's original config.json",
            )

    def _check_target_layers(self, drafter: Mapping[str, Any]) -> None:
        field = "drafter_config.dflash_config.target_layer_ids"
        ids = _mapping(drafter.get("dflash_config")).get("target_layer_ids")
        explicit_aux = drafter.get("eagle_aux_hidden_state_layer_ids")
        if ids is None:
            if not explicit_aux:
                self.warn(
                    field,
                    "missing: vLLM falls back to the target model's default auxiliary layers, not the ones the "
                    "drafter was trained on",
                    "use the drafter's original config.json",
                )
            return
        if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
            self.error(field, f"must be a list of integers, got {ids!r}", "use the drafter's original config.json")
            return
        num_target = _as_int(drafter.get("num_target_layers"))
        if num_target is not None and any(not 0 <= i < num_target for i in ids):
            self.error(
                field,
                f"{[i for i in ids if not 0 <= i < num_target]} out of range for num_target_layers {num_target} "
                f"(valid: 0..{num_target - 1})",
                "use the drafter trained for this target model",
            )
        if not explicit_aux:  # explicit aux layer ids are taken verbatim: the +1 conversion does not apply
            self._check_aux_layer_offset()

    def _check_aux_layer_offset(self) -> None:
        field = "drafter_config.dflash_config.target_layer_ids"
        problem = (
            "this vLLM {version} takes DFlash target_layer_ids literally on its {runner} model runner (probe {probe} "
            "is false), so it reads every hidden state one layer too early (vllm PR #40727 missing) and the drafter "
            "accepts almost nothing"
        )
        for runner, question in (("V1", "aux_layer_offset"), ("V2", "aux_layer_offset_v2")):
            # The V2 runner matters only where it implements DFlash (0.24.0+).
            if runner == "V2" and not self.probe("v2_runner_dflash"):
                continue
            if self.probe(question) is False:
                probe = self.capability_probes[question]
                self.error(field, problem.format(version=self.version, runner=runner, probe=probe), AUX_OFFSET_FIX)

    def _check_sliding_window(self, drafter: Mapping[str, Any]) -> None:
        dflash = _mapping(drafter.get("dflash_config"))
        layer_types = drafter.get("layer_types")
        layer_types = layer_types if isinstance(layer_types, list) else []
        num_sliding = sum(1 for t in layer_types if t == SLIDING_ATTENTION)
        if not num_sliding and not dflash.get("use_swa"):
            return
        if dflash.get("swa_window_size") is None and drafter.get("sliding_window") is None:
            self.error(
                "drafter_config.sliding_window",
                "the drafter has sliding-window layers but no window size (vLLM raises ValueError)",
                "use the drafter's original config.json",
            )
        field = "drafter_config.layer_types"
        if self.probe("sliding_window") is False:
            self.error(
                field,
                f"the drafter has sliding-window layers, and this vLLM {self.version} runs sliding-window drafter "
                "layers as full attention: the drafter attends to context it was not trained on and acceptance "
                f"collapses (probe {self.capability_probes['sliding_window']} is false)",
                SLIDING_FIX,
            )
            return
        if not 0 < num_sliding < len(layer_types):
            return
        mix = f"{num_sliding} sliding-window and {len(layer_types) - num_sliding} full-attention layers"
        if self.probe("mixed_attention_v2") is False:
            self.error(
                field,
                f"the drafter mixes {mix}, which this vLLM {self.version} cannot run (probe "
                f"{self.capability_probes['mixed_attention_v2']} is false; 0.25.x raises NotImplementedError)",
                "deploy vLLM 0.26.0 or later, which runs such drafters on the V2 model runner",
            )
            return
        self._check_v2_runner(mix)

    def _check_v2_runner(self, mix: str) -> None:
        field = f"env.{V2_RUNNER_ENV}"
        try:
            use_v2 = parse_env_flag(self.env.get(V2_RUNNER_ENV))
        except ValueError:
            return  # check_env reports it
        if use_v2 is False:
            self.error(
                field,
                f"is 0, but this vLLM runs a drafter with {mix} only on the V2 model runner "
                "(NotImplementedError at startup)",
                f"set {V2_RUNNER_ENV}=1, or remove it",
            )
        elif use_v2 is None and self.probe("mixed_attention_auto_v2") is False:
            self.error(
                field,
                f"unset, and this vLLM {self.version} does not pick the V2 model runner by itself for a drafter with "
                f"{mix} (probe {self.capability_probes['mixed_attention_auto_v2']} is false), so V1 raises "
                "NotImplementedError at startup",
                f"set {V2_RUNNER_ENV}=1 in env",
            )


def preflight(
    speculative_config: Mapping[str, Any],
    drafter_config: Any = None,
    vllm_facts: Optional[Mapping[str, Any]] = None,
    tensor_parallel_size: Any = 1,
    capability_probes: Optional[Mapping[str, str]] = None,
    env: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """Check a speculative config (and, for DFlash, its drafter) against the installed vLLM.

    Returns `speculative_config` (normalised: vLLM key spelling, method resolved, DFlash K defaulted),
    `findings` (list of {level, field, message}), `error_count`, `warning_count`, `drafter_config_path` and
    `drafter_config_sha256`.
    """
    if not isinstance(speculative_config, Mapping):
        raise PreflightError(
            "speculative_config",
            f"expected a dict, got {type(speculative_config).__name__}",
            "pass the mapping that goes under speculative-config in the serve config",
        )
    check = _Preflight(vllm_facts, capability_probes, env)
    spec = check.normalise_keys(speculative_config)
    method = check.resolve_method(spec)
    if method is not None:
        spec["method"] = method
    check.check_model(spec, method)
    model = spec.get("model")

    drafter: Optional[Dict[str, Any]] = None
    drafter_path: Optional[str] = None
    if method == "dflash":
        source = drafter_config
        if source is None and isinstance(model, str) and os.path.isdir(os.path.expanduser(model)):
            source = model
        if source is None:
            check.error(
                "drafter_config",
                f"not given, and speculative_config.model {model!r} is not a directory on this host",
                "pass drafter_config: the drafter's config.json, its model directory or the Hugging Face cache",
            )
        else:
            try:
                drafter, drafter_path = load_drafter_config(
                    source, model if isinstance(model, str) else None, spec.get("revision")
                )
            except PreflightError as exc:
                check.findings.append({"level": ERROR, "field": exc.field, "message": str(exc)})

    k = check.check_num_speculative_tokens(spec, method, drafter)
    check.check_parallelism(spec, tensor_parallel_size)
    check.check_sampling(spec, k)
    check.check_attention_backend(spec, method, drafter)
    check.check_env()
    if drafter is not None:
        check.check_drafter(drafter)

    errors = sum(1 for finding in check.findings if finding["level"] == ERROR)
    return {
        "speculative_config": spec,
        "findings": check.findings,
        "error_count": errors,
        "warning_count": len(check.findings) - errors,
        "drafter_config_path": drafter_path,
        # What the verdict was given on: the deploy records it, and its look sees an in-place change.
        "drafter_config_sha256": sha256_file(drafter_path) if drafter_path else None,
    }
