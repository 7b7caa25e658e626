# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What vLLM releases accept, as data: the one file a vLLM upgrade touches.

The preflight judges a config against what the installed vLLM itself answers (the capabilities that
``vllm_facts`` reads in the release venv, ``_capability_script.py``). These tables are only its fallback,
for an install whose config cannot be imported (or a key it could not read): the entry of the newest
release listed here that is not newer than the installed one, and the preflight says which it used.
Each entry holds the capability keys the preflight judges, with the values the capability script returns
on that release's PyPI wheel (tests/unit/fixtures/capabilities/<release>.json; a unit test keeps them
equal). ``registered_architectures`` holds only the draft architectures a speculative method loads.

Standard library only: this runs on the target's system Python.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional, Tuple

# The capability keys the preflight reads (a subset of the capability script's schema 1).
JUDGED_KEYS = (
    "speculative_methods",
    "mtp_aliases",
    "rejection_sample_methods",
    "draft_sample_methods",
    "speculative_fields",
    "registered_architectures",
    "attention_backends",
    "default_model_runner",
)

RELEASES: Dict[str, Dict[str, Any]] = {
    "0.26.0": {
        "speculative_methods": (
            "ngram",
            "medusa",
            "mlp_speculator",
            "draft_model",
            "suffix",
            "custom_class",
            "eagle",
            "eagle3",
            "extract_hidden_states",
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
            "mtp",
            "pangu_ultra_moe_mtp",
            "step3p5_mtp",
            "hy_v3_mtp",
            "gemma4_mtp",
            "inkling_mtp",
            "dflash",
            "ngram_gpu",
            "dspark",
        ),
        "mtp_aliases": (
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
        ),
        "rejection_sample_methods": (
            "standard",
            "synthetic",
            "block",
        ),
        "draft_sample_methods": (
            "greedy",
            "probabilistic",
        ),
        "speculative_fields": (
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
            "target_model_config",
            "target_parallel_config",
            "num_speculative_tokens_per_batch_size",
            "draft_model_config",
            "draft_parallel_config",
            "suffix_decoding_max_tree_depth",
            "suffix_decoding_max_cached_requests",
            "suffix_decoding_max_spec_factor",
            "suffix_decoding_min_token_prob",
            "draft_load_config",
            "rejection_sample_method",
            "synthetic_acceptance_rates",
            "synthetic_acceptance_length",
            "draft_sample_method",
        ),
        "registered_architectures": (
            "DFlashDraftModel",
            "DFlashLagunaForCausalLM",
        ),
        "attention_backends": (
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
        ),
        "default_model_runner": None,
    },
    "0.33.0": {
        "speculative_methods": (
            "ngram",
            "draft_model",
            "suffix",
            "custom_class",
            "eagle",
            "eagle3",
            "extract_hidden_states",
            "deepseek_mtp",
            "dots3_note_mtp",
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
            "qwen4_exp_mtp",
            "qwen3_5_mtp",
            "longcat_flash_mtp",
            "bailing_hybrid_v3_mtp",
            "minimax_m3_mtp",
            "bailing_hybrid_mtp",
            "mtp",
            "kimi_k3_mtp",
            "pangu_ultra_moe_mtp",
            "step3p5_mtp",
            "step5_mtp",
            "hy_v3_mtp",
            "hy_v4_mtp",
            "gemma4_mtp",
            "inkling_mtp",
            "glm5_next_mtp",
            "dflash",
            "ngram_gpu",
            "dspark",
        ),
        "mtp_aliases": (
            "deepseek_mtp",
            "dots3_note_mtp",
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
            "qwen4_exp_mtp",
            "qwen3_5_mtp",
            "longcat_flash_mtp",
            "bailing_hybrid_v3_mtp",
            "minimax_m3_mtp",
            "bailing_hybrid_mtp",
            "kimi_k3_mtp",
            "pangu_ultra_moe_mtp",
            "step3p5_mtp",
            "step5_mtp",
            "hy_v3_mtp",
            "hy_v4_mtp",
            "gemma4_mtp",
            "inkling_mtp",
            "glm5_next_mtp",
        ),
        "rejection_sample_methods": (
            "standard",
            "synthetic",
            "block",
            "fly",
        ),
        "draft_sample_methods": (
            "greedy",
            "probabilistic",
        ),
        "speculative_fields": (
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
            "index_share_for_mtp_iteration",
            "disable_padded_drafter_batch",
            "disable_eagle_block_drop",
            "disable_lookahead_block_hashes",
            "draft_lm_head_quantization",
            "use_local_argmax_reduction",
            "use_heterogeneous_vocab",
            "prompt_lookup_max",
            "prompt_lookup_min",
            "parallel_drafting",
            "target_model_config",
            "target_parallel_config",
            "num_speculative_tokens_per_batch_size",
            "draft_model_config",
            "draft_parallel_config",
            "suffix_decoding_max_tree_depth",
            "suffix_decoding_max_cached_requests",
            "suffix_decoding_max_spec_factor",
            "suffix_decoding_min_token_prob",
            "draft_load_config",
            "rejection_sample_method",
            "synthetic_acceptance_rates",
            "synthetic_acceptance_length",
            "enable_adaptive_verification",
            "draft_sample_method",
            "dspark_draft_topk",
            "xpress_topc",
            "fly_window_size",
            "fly_entropy_threshold",
            "fly_entropy_top_k",
        ),
        "registered_architectures": (
            "DFlash2BeamDraftModel",
            "DFlash2DraftModel",
            "DFlashDraftModel",
            "DFlashLagunaForCausalLM",
            "DFlashMuseGlimmerAssistantModel",
            "DFlashQwen3XPressModel",
            "LiLiCorrDraftModel",
            "MuseGlimmerAssistantModel",
        ),
        "attention_backends": (
            "FLASH_ATTN",
            "FLASH_ATTN_DIFFKV",
            "TRITON_ATTN",
            "TRITON_ATTN_DIFFKV",
            "TRITON_FLASH_ATTN",
            "ROCM_ATTN",
            "ROCM_SEGMENTED_ATTN",
            "ROCM_AITER_MLA",
            "ROCM_AITER_TRITON_MLA",
            "ROCM_AITER_FA",
            "ROCM_AITER_MLA_SPARSE",
            "XPU_MLA_SPARSE",
            "TORCH_SDPA",
            "FLASHINFER",
            "TRITON_FLASHINFER",
            "FLASHINFER_MLA",
            "TOKENSPEED_MLA",
            "FLASHINFER_MLA_SPARSE",
            "FLASHINFER_MLA_SPARSE_SM120",
            "FLASHINFER_MLA_SPARSE_SM90",
            "TRITON_MLA",
            "CUTLASS_MLA",
            "FLASHMLA",
            "FLASHMLA_SPARSE",
            "FLASHMLA_SPARSE_DSV4",
            "FLASHINFER_MLA_SPARSE_DSV4",
            "ROCM_FLASHMLA_SPARSE_DSV4",
            "FLASHMLA_SPARSE_DSV41",
            "FLASHINFER_MLA_SPARSE_DSV41",
            "ROCM_FLASHMLA_SPARSE_DSV41",
            "FLASHMLA_MEGA_ATTN_DSV41",
            "B12X",
            "FLASH_ATTN_MLA",
            "FLASH_ATTN_MLA_SPARSE",
            "FLASH_ATTN_MLA_SPARSE_FA4",
            "MINIMAX_M3_SPARSE",
            "CUTLASS_MSA",
            "TRITON_MSA",
            "STEP5_DSA",
            "NO_ATTENTION",
            "FLEX_ATTENTION",
            "HPC_ATTN",
            "ROCM_AITER_UNIFIED_ATTN",
            "CPU_ATTN",
            "CPU_MLA",
            "AMX_MLA",
            "TURBOQUANT",
            "ROCM_OCTAVE",
            "ULTRAQUANT",
            "CUSTOM",
        ),
        "default_model_runner": "v2",
    },
}

# --------------------------------------------------------------------------- what no capability tells

# Methods that load a draft checkpoint named by `model` (vllm/config/speculative.py, __post_init__).
METHODS_NEEDING_MODEL = ("draft_model", "eagle", "eagle3", "dflash", "medusa", "mlp_speculator")
# Methods for which vLLM finds num_speculative_tokens itself (suffix: tree depth; mtp/dspark: n_predict).
METHODS_WITH_OWN_K = ("suffix", "mtp", "dspark")
# Methods vLLM re-detects from the model name when `draft_model` (or the other generic ones) is given:
# (marker in the lower-cased name, the method it becomes).
METHOD_MARKERS = (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"), ("dspark", "dspark"))
METHODS_REDETECTED = ("draft_model", "medusa", "mlp_speculator", "mtp")

# Backends whose supports_non_causal() is True (vllm/v1/attention/backends/*.py, 0.26.0 to 0.33.0; the
# *_DIFFKV and TRITON_FLASH_ATTN ones inherit it). A name a release lacks is refused as unknown anyway.
NON_CAUSAL_BACKENDS = (
    "FLASH_ATTN",
    "FLASH_ATTN_DIFFKV",
    "TRITON_ATTN",
    "TRITON_ATTN_DIFFKV",
    "TRITON_FLASH_ATTN",
    "FLEX_ATTENTION",
    "FLASHINFER",
    "ROCM_ATTN",
    "ROCM_SEGMENTED_ATTN",
    "ROCM_AITER_FA",
    "CPU_ATTN",
)
# Draft architectures EAGLEConfig loads under their own name; every other one gets "DFlash" prefixed
# unless it starts or ends with "DFlash" (vllm/transformers_utils/configs/eagle.py, 0.33.0).
DFLASH_UNPREFIXED_ARCHITECTURES = ("LiLiCorrDraftModel",)

# The releases in which each probe first matches (docs/probes.md), for the fixes the findings propose.
AUX_OFFSET_FIX = (
    "deploy a vLLM with the +1 conversion of target_layer_ids (V1 runner: 0.22.0+, V2: 0.24.0+; e.g. 0.33.0)"
)
SLIDING_FIX = (
    "deploy a vLLM whose DFlash drafter honours layer_types/sliding_window (0.25.0+, or 0.26.0+ for mixed layers)"
)
MIXED_FIX = "deploy vLLM 0.26.0 or later, which runs such drafters on the V2 model runner"


def release_tuple(version: Optional[str]) -> Optional[Tuple[int, int, int]]:
    """(major, minor, micro) of a vLLM version string; None when it does not start with one."""
    found = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(version or ""))
    if not found:
        return None
    return int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)


def fallback_release(version: Optional[str]) -> str:
    """The release whose tables stand in for `version`: the newest listed one not newer than it.

    An older or unreadable version (a fork's `0.1.devN`) gets the oldest table, 0.26.0, the release the
    rules were first written against.
    """
    listed = sorted(RELEASES, key=lambda name: release_tuple(name) or (0, 0, 0))
    wanted = release_tuple(version)
    chosen = listed[0]
    for name in listed:
        if wanted is not None and (release_tuple(name) or (0, 0, 0)) <= wanted:
            chosen = name
    return chosen
