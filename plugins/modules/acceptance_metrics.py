#!/usr/bin/python
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_metrics
short_description: Write an acceptance gate result as node_exporter textfile metrics
description:
  - Writes the result of M(vllm_ops.dflash.acceptance_gate) as Prometheus metrics in node_exporter's
    textfile collector format, so that alerting rules can compare vLLM's live acceptance length with
    the gated one (role C(vllm_ops.dflash.dflash_monitoring) ships those rules).
  - Series (all gauges, labels C(vllm_instance), C(model_name) and O(labels)) C(dflash_gate_passed),
    C(dflash_gate_mean_acceptance_length), C(dflash_gate_mean_acceptance_length_ci95_low) / C(_high),
    C(dflash_gate_min_mean_acceptance_length), C(dflash_gate_alert_margin),
    C(dflash_gate_draft_acceptance_rate), C(dflash_gate_per_position_acceptance) (label C(position)),
    C(dflash_gate_drafts), C(dflash_gate_tokens_per_second), C(dflash_gate_timestamp_seconds), and the
    info series C(dflash_gate_info) with the labels C(release), C(verdict) and C(workload_sha256).
    A figure the gate did not report is left out, not written as 0.
  - The file is written to a temporary C(.tmp) name in the same directory (the collector reads only
    C(*.prom)), fsynced and renamed, so a scrape never sees half a file.
version_added: 0.1.0
author: vllm_ops maintainers (@vllm-ops)
extends_documentation_fragment:
  - vllm_ops.dflash.attributes
attributes:
  check_mode:
    support: full
    details:
      - Renders the metrics and reports whether the file would change; writes nothing.
  diff_mode:
    support: full
    details:
      - The old and new file content.
  idempotent:
    support: full
    details:
      - The same gate result gives the same file, so a second run reports no change.
options:
  path:
    description:
      - The metrics file, in node_exporter's C(--collector.textfile.directory); it must end in C(.prom).
      - Parent directories are created.
    type: path
    required: true
  gate:
    description:
      - The registered result of M(vllm_ops.dflash.acceptance_gate), or its C(report) (also
        C(ansible_facts.dflash_gate) after a pass). It must hold a verdict and an acceptance length.
    type: dict
    required: true
  vllm_instance:
    description: The instance name, label C(vllm_instance) of every series.
    type: str
    default: default
  release:
    description:
      - The release that was gated (label C(release) of C(dflash_gate_info)).
      - Empty uses the gate's own C(release), if it reports one.
    type: str
    default: ""
  alert_margin:
    description:
      - How far the live acceptance length may fall below the gated one before the rules alert; written as
        C(dflash_gate_alert_margin), so each host can have its own.
    type: float
    default: 0.5
  labels:
    description: Extra constant labels for every series (for example C(cluster)); names must be valid label names.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Publish the gate result to node_exporter
  vllm_ops.dflash.acceptance_metrics:
    path: /var/lib/prometheus/node-exporter/vllm-default.prom
    gate: "{{ dflash_gate_result }}"
    release: "{{ serving.current }}"
    labels:
      cluster: eu-1
"""

RETURN = r"""
path:
  description: The metrics file.
  returned: always
  type: str
  sample: /var/lib/prometheus/node-exporter/vllm-default.prom
metrics:
  description: The file's content (exposition format).
  returned: always
  type: str
  sample: "dflash_gate_passed{vllm_instance=\"default\",model_name=\"qwen36\"} 1.0\n"
"""


from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._args import INSTANCE
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import write_text_atomic
from ansible_collections.vllm_ops.dflash.plugins.module_utils._textfile import ALERT_MARGIN, TextfileError, render_gate

ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    gate=dict(type="dict", required=True),
    # The instance option under the name of its label (the instance family of _args).
    vllm_instance=dict(type="str", default=INSTANCE),
    release=dict(type="str", default=""),
    alert_margin=dict(type="float", default=ALERT_MARGIN),
    labels=dict(type="dict", default={}),
)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):  # absent or unreadable: the write below says why, if it fails
        return ""


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    path = params["path"]
    if not path.endswith(".prom"):
        module.fail_json(
            msg=f"path {path} does not end in .prom, so node_exporter would not read it. "
            "Fix: name the file <something>.prom in the textfile collector directory"
        )
    try:
        text = render_gate(
            params["gate"], params["vllm_instance"], params["release"], params["alert_margin"], params["labels"]
        )
    except TextfileError as exc:
        module.fail_json(msg=str(exc), path=path)
    old = _read(path)
    result = dict(changed=old != text, path=path, metrics=text)
    if module._diff:
        result["diff"] = dict(before=old, after=text, before_header=path, after_header=path)
    if result["changed"] and not module.check_mode:
        try:
            write_text_atomic(path, text)
        except OSError as exc:
            result.update(
                changed=False,
                msg=f"cannot write {path} ({exc.strerror or exc}). Fix: point path at a writable "
                f"directory (node_exporter's --collector.textfile.directory) or run with become",
            )
            module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
