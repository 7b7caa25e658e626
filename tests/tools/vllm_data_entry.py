# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Print the fallback entry of plugins/module_utils/_vllm_data.py for a captured capability JSON.

    tests/tools/vllm_data_entry.py tests/unit/data/capabilities/0.33.0.json

A vLLM upgrade: capture the release (make compat), paste this entry into RELEASES, run `ruff format`;
tests/unit/plugins/module_utils/test_vllm_data.py keeps every entry equal to its capture.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / ".cache" / "ac"))

from ansible_collections.vllm_ops.dflash.plugins.module_utils._vllm_data import (
    JUDGED_KEYS,
    draft_architectures,
)


def entry(capabilities: dict) -> str:
    lines = [f"    {json.dumps(capabilities['vllm_version'])}: {{"]
    for key in JUDGED_KEYS:
        value = capabilities[key]
        if key == "registered_architectures":
            value = draft_architectures(value)
        if isinstance(value, list):
            items = "".join(f"            {json.dumps(item)},\n" for item in value)
            lines.append(f'        "{key}": (\n{items}        ),')
        else:
            lines.append(f'        "{key}": {json.dumps(value).replace("null", "None")},')
    lines.append("    },")
    return "\n".join(lines)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(entry(json.loads(Path(path).read_text())))
