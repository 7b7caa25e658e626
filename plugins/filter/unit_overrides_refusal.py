# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The message of vllm_service's unit overrides check, in Python: a Jinja loop of regex tests cost the deploy's
look more template compiling per host than any other argument (issue 30; bench/README.md)."""

from __future__ import annotations

import re
from typing import Any, Dict

DOCUMENTATION = r"""
name: unit_overrides_refusal
short_description: Why unit overrides that are no directive or would add lines to the unit are refused
version_added: 0.1.0
description:
  - The message of M(vllm_ops.dflash.vllm_service)'s unit overrides check (C(tasks_from=unit_overrides)), an empty
    string when the overrides pass. The deploy's look hands it to M(vllm_ops.dflash.vllm_drift) as one of its
    O(vllm_ops.dflash.vllm_drift#module:refusals).
  - Each key must be a C([Service]) directive name (a capital letter, then letters and digits), each value a value,
    a list of values or V(null), none a dict or with a line break.
options:
  _input:
    description: C(vllm_service_unit_overrides).
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Refuse overrides that would add lines to the unit
  ansible.builtin.assert:
    that: message | length == 0
    fail_msg: "{{ message }}"
  vars:
    message: "{{ vllm_service_unit_overrides | vllm_ops.dflash.unit_overrides_refusal }}"
"""

RETURN = r"""
_value:
  description: The message naming every override that fails, and the fix; empty when none does.
  type: str
"""

_DIRECTIVE = re.compile(r"[A-Z][A-Za-z0-9]*")
_LINE_BREAK = re.compile(r"[\r\n]")


def _bad(key: Any, value: Any) -> bool:
    if not _DIRECTIVE.fullmatch(str(key)) or isinstance(value, dict):
        return True
    items = value if isinstance(value, (list, tuple)) else [value]
    return any(_LINE_BREAK.search(str(item)) for item in items)


def unit_overrides_refusal(overrides: Any) -> str:
    if not overrides:
        return ""
    if isinstance(overrides, dict):
        bad = [str(key) for key, value in overrides.items() if _bad(key, value)]
        if not bad:
            return ""
        fix = ", ".join(bad)
    else:
        fix = "its type (a dict)"
    return (
        "vllm_service_unit_overrides must map [Service] directive names (such as ProtectHome) to a value, a list of "
        f"values or null, none a dict or with a newline; fix {fix}"
    )


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"unit_overrides_refusal": unit_overrides_refusal}
