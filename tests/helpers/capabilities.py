# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The capabilities vLLM releases answered, as captured from their PyPI wheels (tests/unit/data/capabilities)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

CAPABILITIES = Path(__file__).resolve().parents[1] / "unit" / "data" / "capabilities"
RELEASES = ("0.20.1", "0.22.0", "0.24.0", "0.26.0", "0.28.0", "0.30.0", "0.33.0")


def captured(version: str) -> Dict[str, Any]:
    """What the capability script returned on the PyPI wheel of `version` (make compat captures them)."""
    result: Dict[str, Any] = json.loads((CAPABILITIES / f"{version}.json").read_text())
    return result
