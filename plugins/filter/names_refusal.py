# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The message of dflash_gate's names check, in Python: a Jinja loop of regex tests cost the deploy's look more
template compiling per host than any other argument (issue 30; bench/README.md)."""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional

DOCUMENTATION = r"""
name: names_refusal
short_description: Why names and paths that reach a shell, the unit or a path are refused
version_added: 0.1.0
description:
  - The message of M(vllm_ops.dflash.dflash_gate)'s names check (C(tasks_from=names)), an empty string when every
    name and path passes. The deploy's look hands it to M(vllm_ops.dflash.vllm_drift) as one of its
    O(vllm_ops.dflash.vllm_drift#module:refusals).
  - A name is letters, digits, C(_), C(.) and C(-), a letter or digit first, 64 characters at most (a systemd unit
    name's characters, without C(@) and C(\)); a path is absolute, of the same characters and C(/).
options:
  _input:
    description: The names, variable name to value; a value of V(null) is not set and not checked.
    type: dict
    required: true
  paths:
    description: The paths, variable name to value.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Refuse names that would reach a root shell
  ansible.builtin.assert:
    that: message | length == 0
    fail_msg: "{{ message }}"
  vars:
    message: >-
      {{ {'vllm_instance': vllm_instance} | vllm_ops.dflash.names_refusal({'vllm_root': vllm_root}) }}
"""

RETURN = r"""
_value:
  description: The message naming every variable that fails, and the fix; empty when none does.
  type: str
"""

# \Z, not $, which also matches before a final newline.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z"
PATH_PATTERN = r"^(/[A-Za-z0-9_.+-]+)+/?\Z"


def names_refusal(names: Mapping[str, Any], paths: Optional[Mapping[str, Any]] = None) -> str:
    bad = [name for name, value in names.items() if value is not None and not re.search(NAME_PATTERN, str(value))]
    bad += [name for name, value in (paths or {}).items() if not re.search(PATH_PATTERN, str(value))]
    if not bad:
        return ""
    return (
        f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not a plain name: a name must match {NAME_PATTERN} and a "
        f"path {PATH_PATTERN} (no spaces, quotes, $, `, ;, newlines), since they reach file paths, the systemd unit "
        "and a root shell. Fix: rename them in the inventory."
    )


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"names_refusal": names_refusal}
