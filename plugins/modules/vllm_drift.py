#!/usr/bin/python
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_drift
short_description: Tell, in one read-only look, whether a deploy would change a vLLM host
description:
  - Answers the question the deploy playbook asks of every host first - would installing, configuring, serving and
    gating change anything here? - in a single round trip, writing nothing.
  - The release - resolves O(ref) and names the release exactly as M(vllm_ops.dflash.vllm_build) would (the same
    options, the same lookup, in check mode). It must be built, be the C(current) one, and have a status in
    O(good_statuses) (the gate marks a release C(good)).
  - The files - every item of O(files) (what a role would template, rendered and hashed on the controller) must
    be on disk with that sha256, or one its role recorded as written from the same input
    (O(files[].input_sha256)), and with that mode, owner and group where given.
  - The inputs - every file recorded in O(recorded_inputs) must be unchanged.
  - The service - O(unit) must be enabled (or not, as O(unit_enabled) says) and O(health_url) must answer 200;
    a main process of O(unit) must run the release C(current) names, as its own command line says
    (C(/proc/<MainPID>/cmdline) names C(<root>/releases/<name>/venv/bin/vllm)), not one started before a swap.
  - RV(unchanged) is V(true) only when all of it holds; RV(reasons) says what differs. The module never reports
    C(changed).
  - A build or release swap that holds the host lock longer than O(lock_timeout) makes the host count as changed,
    so that the deploy waits for it instead of skipping the host.
version_added: 0.1.0
author: vllm_ops maintainers (@vllm-ops)
extends_documentation_fragment:
  - vllm_ops.dflash.attributes
  - vllm_ops.dflash.attributes.info_module
  - vllm_ops.dflash.build
  - vllm_ops.dflash.common
  - vllm_ops.dflash.common.installer
options:
  files:
    description:
      - Files a deploy would write, as the controller renders them. Only hashes travel - a file with secrets is
        compared without its content leaving the controller.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path on the host.
        type: path
        required: true
      sha256:
        description:
          - sha256 of the content the deploy would write, for example C(lookup('template', ...) | hash('sha256')).
        type: str
        required: true
      mode:
        description: Octal mode the deploy would set, as a string such as V('0644').
        type: str
      owner:
        description: Owner the deploy would set.
        type: str
      group:
        description: Group the deploy would set.
        type: str
      input_sha256:
        description:
          - For a file the role writes from an input it transforms on the host first (the serve config, whose
            speculative config M(vllm_ops.dflash.dflash_preflight) normalises), the sha256 of that input as the
            controller renders it. With O(files[].input_record).
          - The file then also counts as unchanged when O(files[].input_record) maps this input to the file's
            current sha256; a file edited since, or written from another input, still differs.
        type: str
      input_record:
        description:
          - Absolute path of the JSON record the role wrote on the host next to the file, C({"input_sha256",
            "sha256"}). A missing or unreadable record proves nothing (the file differs unless O(files[].sha256)
            matches).
        type: path
  refusals:
    description:
      - Messages of checks made on the controller before the look, one per check, empty when it passed - the roles'
        own refusals (C(dflash_gate_names_refusal), C(dflash_config_env_refusal), C(vllm_service_overrides_refusal)),
        which the deploy's look passes. Read by this module's action plugin - any message fails the task, naming
        what to fix, before a template is rendered or the host is reached.
    type: list
    elements: str
    default: []
  templates:
    description:
      - Templates of this collection's roles a deploy would write, rendered on the controller by this module's
        action plugin with the same lookup as C(lookup('ansible.builtin.template', src, template_vars=vars)) and
        added to O(files) as their sha256 - the content never leaves the controller (the environment file
        holds secrets). One task instead of a render task per file and role, for a fleet's look.
    type: list
    elements: dict
    default: []
    suboptions:
      src:
        description: The template's file name, in the C(templates/) of O(templates[].role).
        type: str
        required: true
      role:
        description:
          - A role of this collection (V(dflash_config), V(vllm_service)) whose C(templates/) holds O(templates[].src),
            searched first, as in that role's own tasks. Without it the task's own search path.
        type: str
      path:
        description: Absolute path on the host the role writes the rendered template to (O(files[].path)).
        type: path
        required: true
      vars:
        description: Variables for this template only, as the lookup's C(template_vars).
        type: dict
        default: {}
      mode:
        description: Octal mode the deploy would set (O(files[].mode)).
        type: str
      owner:
        description: Owner the deploy would set (O(files[].owner)).
        type: str
      group:
        description: Group the deploy would set (O(files[].group)).
        type: str
      input_extra:
        description:
          - With O(templates[].input_record) - text appended to the render for O(files[].input_sha256), the input's
            part that is not in the render (a drafter config given as a dict).
        type: str
        default: ""
      input_record:
        description:
          - The host's record of which input gave the file (O(files[].input_record)); O(files[].input_sha256) is
            then the sha256 of the render and O(templates[].input_extra).
        type: path
  recorded_inputs:
    description:
      - JSON records a deploy wrote on the host, each an object whose C(files) maps a path to its sha256 - for
        example the drafter C(config.json) that M(vllm_ops.dflash.dflash_preflight) passed, recorded by the
        C(dflash_config) role.
        A recorded file whose sha256 differs now (a drafter changed in place) is a difference; a record that
        does not exist is not (nothing was recorded yet).
    type: list
    elements: path
    default: []
  health_url:
    description: A URL that must answer 200, for example the server's C(/health). Not checked when empty.
    type: str
  unit:
    description: A systemd unit whose C(systemctl is-enabled) state must match O(unit_enabled). Not checked when empty.
    type: str
  unit_enabled:
    description: Whether O(unit) should be enabled (V(true)) or not (V(false)).
    type: bool
    default: true
  good_statuses:
    description: Release statuses (of M(vllm_ops.dflash.vllm_release)) that count as deployed and gated.
    type: list
    elements: str
    default: [good]
  lock_timeout:
    description:
      - Seconds to wait for the host lock (held by a build or a release swap) before counting the host as changed.
    type: float
    default: 10
notes:
  - Runs on the target with its system Python and the standard library only, plus C(git) and C(systemctl).
seealso:
  - module: vllm_ops.dflash.vllm_build
  - module: vllm_ops.dflash.vllm_release
"""

EXAMPLES = r"""
- name: Would a deploy change this host
  vllm_ops.dflash.vllm_drift:
    repo: https://github.com/vllm-project/vllm.git
    ref: refs/pull/40898/head
    files:
      - path: /etc/vllm/default.yaml
        sha256: "{{ lookup('ansible.builtin.template', 'serve.yaml.j2') | hash('sha256') }}"
        mode: "0644"
        owner: root
        group: root
    unit: vllm-default.service
    health_url: http://127.0.0.1:8000/health
  register: drift

- name: Deploy only where something would change
  ansible.builtin.group_by:
    key: "{{ 'vllm_pending' if not drift.unchanged else 'vllm_unchanged' }}"
"""

RETURN = r"""
unchanged:
  description: V(true) when a deploy with these options would change nothing on the host.
  returned: always
  type: bool
reasons:
  description: What a deploy would change, one sentence each; empty when RV(unchanged).
  returned: always
  type: list
  elements: str
  sample:
    - 3cfc8f8b7a1b-1a2b3c4d is built but b0b2f27da0c4-9f8e7d6c serves
    - /etc/vllm/default.yaml has other content
commit:
  description: The full commit O(ref) resolves to (V(null) for a short SHA the mirror does not hold).
  returned: always
  type: str
release_name:
  description:
    - The release O(ref) (or O(version)) and the build options name, as M(vllm_ops.dflash.vllm_build) would.
    - V(null) when it is not built here and its name waits on what the look does not decide
      (the decision of O(precompiled=auto), a short SHA the mirror does not hold); M(vllm_ops.dflash.vllm_build) in
      check mode predicts it.
  returned: always
  type: str
  sample: 3cfc8f8b7a1b-1a2b3c4d
release_exists:
  description: Whether that release is built on this host.
  returned: always
  type: bool
current:
  description: The release that serves (C(current)); V(null) when none.
  returned: always
  type: str
current_status:
  description: The status of the current release (C(built), C(active), C(good) or C(failed)).
  returned: always
  type: str
files:
  description: Each of O(files) with C(changed) and the C(reason) it differs.
  returned: always
  type: list
  elements: dict
  sample: [{path: /etc/vllm/default.yaml, changed: false, reason: null}]
unit_as_expected:
  description: Whether O(unit) is enabled as O(unit_enabled) says (V(false) when O(unit) is not given).
  returned: always
  type: bool
healthy:
  description: Whether O(health_url) answered 200 (V(false) when O(health_url) is not given).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._args import LOOK_ARGS
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import (
    BUILD_ARGUMENT_SPEC,
    BuildError,
    build_options,
    option_secrets,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import redact_url
from ansible_collections.vllm_ops.dflash.plugins.module_utils._drift import (
    LOCK_TIMEOUT,
    DriftError,
    FileExpectation,
    detect_drift,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            **BUILD_ARGUMENT_SPEC,
            "files": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "path": {"type": "path", "required": True},
                    "sha256": {"type": "str", "required": True},
                    "mode": {"type": "str"},
                    "owner": {"type": "str"},
                    "group": {"type": "str"},
                    "input_sha256": {"type": "str"},
                    "input_record": {"type": "path"},
                },
            },
            **LOOK_ARGS,
            "health_url": {"type": "str"},
            "recorded_inputs": {"type": "list", "elements": "path", "default": []},
            "unit": {"type": "str"},
            "unit_enabled": {"type": "bool", "default": True},
            "good_statuses": {"type": "list", "elements": "str", "default": ["good"]},
            "lock_timeout": {"type": "float", "default": LOCK_TIMEOUT},
        },
        supports_check_mode=True,
    )
    params = module.params
    module.no_log_values.update(option_secrets(params))
    if params["templates"] or any(params["refusals"]):
        module.fail_json(
            msg="templates and refusals are read on the controller by vllm_drift's action plugin, which this call did "
            "not go through (the module alone takes files: their sha256); call vllm_ops.dflash.vllm_drift as a task"
        )
    try:
        files = [FileExpectation.from_dict(item) for item in params["files"]]
        result = detect_drift(
            build_options(params),
            files,
            health_url=params["health_url"] or None,
            unit=params["unit"] or None,
            unit_enabled=params["unit_enabled"],
            recorded_inputs=params["recorded_inputs"],
            good_statuses=params["good_statuses"],
            lock_timeout=params["lock_timeout"],
        )
    except (BuildError, DriftError) as exc:
        module.fail_json(
            msg=str(exc), repo=redact_url(params["repo"] or ""), requested_ref=params["ref"], version=params["version"]
        )
    except OSError as exc:
        module.fail_json(msg=f"vllm_drift could not read {params['root']}: {exc}; check that this user may read it")
    for warning in result.pop("warnings"):
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
