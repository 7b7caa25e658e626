#!/usr/bin/python
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_deploy_lock
short_description: Hold a host's deploy lock for one instance across the tasks of a rollout
description:
  - O(state=present) takes the lock file C(<root>/deploy-<instance>.lock) for O(holder) (the deploy's id) for
    O(lease) seconds, or renews it for the same holder; it fails, naming the other holder and until when it holds
    the lock, while another deploy's lease runs. A lock whose lease has ended (its controller was killed) is
    broken and RV(broken) names whose it was.
  - O(state=absent) removes the lock if O(holder) holds it; another deploy's lock is left alone.
  - The deploy playbook takes it before a host's rollout and releases it after the gate's record or the rescue,
    so that two deploys never swap, restart and gate one instance in turn.
version_added: 0.2.0
author: vllm_ops maintainers (@vllm-ops)
extends_documentation_fragment:
  - vllm_ops.dflash.attributes
  - vllm_ops.dflash.common
  - vllm_ops.dflash.common.instance
attributes:
  check_mode:
    support: full
    details:
      - Checks the lock (and fails while another holds it) but writes nothing.
  diff_mode:
    support: none
  idempotent:
    support: none
    details:
      - O(state=present) renews the lease at every call.
options:
  root:
    description: Root of releases and state.json on the host (the lock file goes there).
  instance:
    description: The instance the deploy works on; each has its own lock.
  holder:
    description: The deploy's id; the same for the take and the release.
    type: str
    required: true
  state:
    description: Take (or renew) the lock, or release it.
    type: str
    choices: [present, absent]
    default: present
  lease:
    description: Seconds the lock holds without a renewal; a killed controller's lock is broken after it.
    type: int
    default: 3600
notes:
  - The lease runs on the host's wall clock.
seealso:
  - module: vllm_ops.dflash.vllm_release
"""

EXAMPLES = r"""
- name: Take the deploy lock
  vllm_ops.dflash.vllm_deploy_lock:
    holder: "{{ deploy_id }}"

- name: Release it
  vllm_ops.dflash.vllm_deploy_lock:
    holder: "{{ deploy_id }}"
    state: absent
"""

RETURN = r"""
path:
  description: The lock file.
  returned: always
  type: str
  sample: /opt/vllm/deploy-default.lock
expires_at:
  description: When the lease ends (UTC), O(state=present).
  returned: success
  type: str
  sample: "2026-12-02T16:20:00Z"
broken:
  description: The record of a lock whose lease had ended and that this call broke (O(state=present)); V(null) if none.
  returned: success
  type: dict
released:
  description: Whether the lock was removed (O(state=absent)).
  returned: success
  type: bool
held_by:
  description: Who holds the lock after O(state=absent) left it alone; V(null) when nobody.
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._args import INSTANCE_ARGS, ROOT_ARGS
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deploy_lock import (
    DEFAULT_LEASE,
    DeployLockHeld,
    acquire,
    release,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **ROOT_ARGS,
            **INSTANCE_ARGS,
            holder=dict(type="str", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            lease=dict(type="int", default=DEFAULT_LEASE),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["state"] == "absent":
            result = release(params["root"], params["instance"], params["holder"], module.check_mode)
        else:
            result = acquire(params["root"], params["instance"], params["holder"], params["lease"], module.check_mode)
    except (DeployLockHeld, ValueError) as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"cannot use the deploy lock under {params['root']}: {exc}; check that it is writable")
    if result.get("broken"):
        module.warn(f"broke the deploy lock of {result['broken'].get('holder')}: its lease had ended")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
