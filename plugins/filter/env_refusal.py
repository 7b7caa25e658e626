# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The message of dflash_config's environment check, in Python: a Jinja loop of regex tests cost the deploy's look
more template compiling per host than any other argument (issue 30; bench/README.md)."""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional

DOCUMENTATION = r"""
name: env_refusal
short_description: Why environment values and names that would add lines to the service's env file are refused
version_added: 0.1.0
description:
  - The message of M(vllm_ops.dflash.dflash_config)'s environment check (C(tasks_from=env_values)), an empty string
    when every value and name passes. The deploy's look hands it to M(vllm_ops.dflash.vllm_drift) as one of its
    O(vllm_ops.dflash.vllm_drift#module:refusals).
  - It names the variable, never its value (a token or an API key).
options:
  _input:
    description: The role's own values, variable name to value (C(vllm_hf_token), C(vllm_api_key), ...).
    type: dict
    required: true
  extra_env:
    description: C(vllm_extra_env), environment variable name to value; each name must be an identifier.
    type: dict
    default: {}
  env_file:
    description: The env file the values are written to, named in the message.
    type: str
    default: the env file
"""

EXAMPLES = r"""
- name: Refuse values that would write other lines into the env file
  ansible.builtin.assert:
    that: message | length == 0
    fail_msg: "{{ message }}"
  vars:
    message: >-
      {{ {'vllm_api_key': vllm_api_key} | vllm_ops.dflash.env_refusal(vllm_extra_env, '/etc/vllm/default.env') }}
"""

RETURN = r"""
_value:
  description: The message naming every variable that fails (never a value), and the fix; empty when none does.
  type: str
"""

_LINE_BREAK = re.compile(r"[\r\n\x00]")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHOWN_NAME = 40  # characters of a bad name shown (with its other characters as ?)


def _shown(name: str) -> str:
    shown = re.sub(r"[^A-Za-z0-9_]", "?", name)
    return shown if len(shown) <= _SHOWN_NAME else shown[: _SHOWN_NAME - 3] + "..."


def env_refusal(
    values: Mapping[str, Any], extra_env: Optional[Mapping[str, Any]] = None, env_file: str = "the env file"
) -> str:
    bad = [name for name, value in values.items() if _LINE_BREAK.search(str(value))]
    for name, value in (extra_env or {}).items():
        if not _IDENTIFIER.fullmatch(str(name)):
            bad.append(f"a vllm_extra_env name ({_shown(str(name))})")
        elif _LINE_BREAK.search(str(value)):
            bad.append(f"vllm_extra_env.{name}")
    if not bad:
        return ""
    return (
        f"{', '.join(bad)}: a value with a line break (newline, CR or NUL) or a name that is not an identifier "
        f"([A-Za-z_][A-Za-z0-9_]*) would write other lines into {env_file}, which systemd reads as the service's "
        "environment. Fix: give it on one line (a multi-line value belongs in a file the service reads), with a plain "
        "name."
    )


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"env_refusal": env_refusal}
