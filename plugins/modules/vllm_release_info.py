#!/usr/bin/python
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_release_info
short_description: Which vLLM release runs on a host, which passed their gate, and the history
description:
  - Reads the releases under O(root)C(/releases/), the C(current) link and O(root)C(/state.json) that
    M(vllm_ops.dflash.vllm_build) and M(vllm_ops.dflash.vllm_release) write, and changes nothing.
  - The read-only counterpart of M(vllm_ops.dflash.vllm_release), whose
    O(vllm_ops.dflash.vllm_release#module:action=status) is deprecated in favour of this module.
  - Waits for the host lock O(root)C(/.lock) only when the lock file exists (a swap or build in progress), and
    creates nothing. When C(state.json) and the C(current) link disagree, the link wins, with a warning.
version_added: 0.2.0
author: vllm_ops maintainers (@vllm-ops)
extends_documentation_fragment:
  - vllm_ops.dflash.attributes
  - vllm_ops.dflash.attributes.info_module
  - vllm_ops.dflash.common
options:
  root:
    description: The vLLM root holding C(releases/), C(current) and C(state.json).
  release:
    description: A release to resolve (name, unique prefix, commit prefix or path); returned as RV(release).
    type: str
  lock_timeout:
    description: Seconds to wait for a host lock that is held.
    type: float
    default: 600
seealso:
  - module: vllm_ops.dflash.vllm_release
"""

EXAMPLES = r"""
- name: Which release runs, and which passed their gate
  vllm_ops.dflash.vllm_release_info:
  register: releases

- name: The last good release
  ansible.builtin.debug:
    msg: "{{ releases.last_good }}"
"""

RETURN = r"""
current:
  description: Name of the current release; V(null) when none.
  returned: always
  type: str
  sample: 3cfc8f8b7a1b-1a2b3c4d
previous:
  description: Name of the release that was current before the last switch; V(null) when none.
  returned: always
  type: str
last_good:
  description: The release that served last with a passed gate and is still complete; V(null) when none.
  returned: always
  type: str
release:
  description: What O(release) resolved to; V(null) without O(release).
  returned: always
  type: str
releases:
  description: Every known release, newest first, as M(vllm_ops.dflash.vllm_release) returns them.
  returned: always
  type: list
  elements: dict
history:
  description: The history of C(state.json), oldest first.
  returned: always
  type: list
  elements: dict
incomplete:
  description: Directories under C(releases/) without C(manifest.json) (unfinished builds).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._args import ROOT_ARGS
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import LOCK_TIMEOUT, ReleaseError, run_action

# what a read-only look returns; the rest of vllm_release's result is about changes
INFO_KEYS = ("current", "previous", "last_good", "release", "releases", "history", "incomplete")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            **ROOT_ARGS,
            "release": {"type": "str"},
            "lock_timeout": {"type": "float", "default": LOCK_TIMEOUT},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = run_action(
            params["root"], "status", release=params["release"], check_mode=True, lock_timeout=params["lock_timeout"]
        )
    except ReleaseError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"cannot read the releases under {params['root']}: {exc}")
    for warning in result["warnings"]:
        module.warn(warning)
    module.exit_json(changed=False, **{key: result.get(key) for key in INFO_KEYS})


if __name__ == "__main__":
    main()
