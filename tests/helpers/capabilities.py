# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The capabilities vLLM releases answered, as captured from their PyPI wheels (tests/unit/fixtures/capabilities)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

from ansible_collections.vllm_ops.dflash.plugins.module_utils import _vllm_data

CAPABILITIES = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "capabilities"
RELEASES = ("0.20.1", "0.22.0", "0.24.0", "0.26.0", "0.28.0", "0.30.0", "0.33.0")


def captured(version: str) -> Dict[str, Any]:
    """What the capability script returned on the PyPI wheel of `version` (tests/unit/fixtures/capabilities)."""
    path = CAPABILITIES / f"{version}.json"
    if path.exists():
        return json.loads(path.read_text())
    # Until the captures land: fabricated from the tables, with a few serve flags.
    table = _vllm_data.RELEASES[_vllm_data.fallback_release(version)]
    return dict(
        table,
        schema=1,
        vllm_version=version,
        speculative_methods=list(table["speculative_methods"]),
        mtp_aliases=list(table["mtp_aliases"]),
        serve_flags={
            "--model": {"dest": "model", "takes_value": True, "choices": None, "negatable": False},
            "--host": {"dest": "host", "takes_value": True, "choices": None, "negatable": False},
            "--port": {"dest": "port", "takes_value": True, "choices": None, "negatable": False},
            "--served-model-name": {
                "dest": "served_model_name",
                "takes_value": True,
                "choices": None,
                "negatable": False,
            },
            "--tensor-parallel-size": {
                "dest": "tensor_parallel_size",
                "takes_value": True,
                "choices": None,
                "negatable": False,
            },
            "--speculative-config": {
                "dest": "speculative_config",
                "takes_value": True,
                "choices": None,
                "negatable": False,
            },
            "--attention-backend": {
                "dest": "attention_backend",
                "takes_value": True,
                "choices": None,
                "negatable": False,
            },
            "--enable-prefix-caching": {
                "dest": "enable_prefix_caching",
                "takes_value": False,
                "choices": None,
                "negatable": True,
            },
            "--no-enable-prefix-caching": {
                "dest": "enable_prefix_caching",
                "takes_value": False,
                "choices": None,
                "negatable": True,
            },
            "--enforce-eager": {"dest": "enforce_eager", "takes_value": False, "choices": None, "negatable": True},
            "--no-enforce-eager": {"dest": "enforce_eager", "takes_value": False, "choices": None, "negatable": True},
            "--trust-remote-code": {
                "dest": "trust_remote_code",
                "takes_value": False,
                "choices": None,
                "negatable": False,
            },
            "--kv-cache-dtype": {
                "dest": "kv_cache_dtype",
                "takes_value": True,
                "choices": ["auto", "fp8"],
                "negatable": False,
            },
        },
        default_model_runner=table["default_model_runner"],
        errors={},
    )
