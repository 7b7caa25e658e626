#!/usr/bin/python
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_gate
short_description: Judge a speculative-decoding vLLM server by its measured mean acceptance length
description:
  - Sends smoke traffic (C(POST /v1/completions), temperature 0) to a running vLLM server and reads its
    spec-decode counters from C(/metrics) before and after.
  - Computes vLLM's own figures over that window, the mean acceptance length C(1 + accepted/drafts), the
    draft acceptance rate C(accepted/draft_tokens), the per-position acceptance C(accepted_per_pos[i]/drafts),
    and a 95% interval for the mean acceptance length.
  - Fails when a request failed, when there are fewer than O(min_drafts) drafts to judge, or when the mean
    acceptance length (or the draft acceptance rate) is under its threshold. A failure returns every figure
    as well as O(report_path) files, so a rescue block can roll back and record why.
  - Sends a pinned O(workload) (completions, and chats through the model's chat template with
    C(chat_template_kwargs)); its sha256 goes with every result, with the greedy outputs' fingerprints
    (sha256 per prompt), TTFT / TPOT percentiles (vLLM's histograms) and the O(identity) of what served.
  - With O(release) and O(results_dir), keeps every result in C(<results_dir>/<release>.json) and judges
    the run against the newest passed result of O(baseline_release) (the last good release) by relative
    rules, see O(max_acceptance_drop), O(max_position0_drop), O(max_throughput_drop) and
    O(min_identical_outputs). When they cannot apply (no last good release, another workload, another target
    model) the result and message say why; they never drop out silently.
  - Measure on a server without other traffic; the counters of the whole server are read.
  - The report format is described in C(docs/gate-report.md).
version_added: 0.1.0
author: vllm_ops maintainers (@vllm-ops)
extends_documentation_fragment:
  - vllm_ops.dflash.attributes
attributes:
  check_mode:
    support: full
    details:
      - In check mode no traffic is sent and nothing is written. The checks that need no traffic still run
        and fail as a real run would (the options, the url, the O(workload), the last good release's result in
        O(results_dir)); then the task is reported as skipped with RV(passed=null), no figures (a verdict needs
        real traffic), and RV(check) and C(msg) say what it would send, to where, which thresholds and
        relative rules it would judge by, and which files it would write.
  diff_mode:
    support: none
  idempotent:
    support: partial
    details:
      - The server is only read, but each run measures anew; with O(report_path), C(changed) is true when
        the report files' content changed, which a new run's timestamps usually do; keeping a result in
        O(results_dir) is a change.
options:
  url:
    description:
      - Base URL of the vLLM OpenAI-compatible server. A trailing C(/v1) is ignored.
    type: str
    default: http://127.0.0.1:8000
  model:
    description:
      - The served model name to send completions to (vLLM's C(--served-model-name)).
      - Metrics are read for this C(model_name) label; when the server reports exactly one other name (an
        alias was used), that one is read.
    type: str
    required: true
  api_key:
    description:
      - Bearer token for C(/v1/*), the server's C(--api-key) / E(VLLM_API_KEY). Never logged or reported.
    type: str
  prompts:
    description:
      - Prompts to cycle through. Default is a shipped set of 12 varied prompts (code, math word problems, prose).
      - With O(workload), replaces its prompts (as completions named C(p1), C(p2), ...).
    type: list
    elements: str
  workload:
    description:
      - The pinned workload, a mapping with C(name), C(prompts) (each C(id) and either C(prompt) or C(messages),
        optionally C(chat_template_kwargs) and C(max_tokens)), C(temperature), C(max_tokens), C(concurrency),
        C(seed) and C(requests); the format is in the dflash_gate role's README.
      - O(prompts), O(requests), O(max_tokens) and O(concurrency), when given, replace the workload's values
        (and so change its hash).
      - The role reads it from a YAML file; an invalid one fails before any traffic.
    type: dict
  validate_only:
    description: Validate O(workload) and exit without traffic (the deploy runs this before any change).
    type: bool
    default: false
  workload_source:
    description: Where O(workload) came from (a file name), named in messages and the report.
    type: str
    default: workload
  identity:
    description:
      - What serves, kept with the result and compared with the last good release's, keys
        C(target_model), C(target_revision), C(drafter_model), C(drafter_revision), C(vllm_version),
        C(vllm_commit), C(release). Relative rules need the same target model and revision; acceptance and
        throughput rules also the same drafter; greedy outputs are compared in full when C(vllm_version) is
        the same, else on their first 64 characters.
    type: dict
  release:
    description: Name of the release under test; with O(results_dir), its result is kept there.
    type: str
  baseline_release:
    description: The last good release (vllm_release's C(last_good)); its newest passed result is the baseline.
    type: str
  results_dir:
    description:
      - Directory of the kept results, one C(<release>.json) per release (newest 10 results each). The role
        uses C(<vllm_root>/gate-results).
    type: path
  max_acceptance_drop:
    description: Relative rule C(acceptance_length), the largest fall of the mean acceptance length (a fraction).
    type: float
    default: 0.10
  max_position0_drop:
    description: Relative rule C(position0), the largest fall of the position-0 acceptance rate (a fraction).
    type: float
    default: 0.10
  max_throughput_drop:
    description: Relative rule C(throughput), the largest fall of generation tokens/s (a fraction).
    type: float
    default: 0.25
  min_identical_outputs:
    description:
      - Relative rule C(greedy_outputs), the smallest share of prompts (0..1) whose greedy output equals the
        last good release's. Speculative decoding is lossless, so a drafter change must not change them.
    type: float
    default: 1.0
  disabled_rules:
    description: Relative rules to turn off.
    type: list
    elements: str
    choices: [acceptance_length, position0, throughput, greedy_outputs]
    default: []
  requests:
    description: Number of completions to send in total. Default 24, or the O(workload)'s.
    type: int
  max_tokens:
    description:
      - C(max_tokens) of each completion. More tokens give more drafts, hence more evidence.
      - Default 128, or the O(workload)'s.
    type: int
  concurrency:
    description: Completions in flight at once. Default 4, or the O(workload)'s.
    type: int
  min_mean_acceptance_length:
    description:
      - Lowest mean acceptance length (tokens per target forward pass, bonus token included) that passes.
        C(1.0) means no draft token is ever accepted.
    type: float
    default: 2.0
  min_draft_acceptance_rate:
    description: Lowest draft acceptance rate (accepted/draft tokens, 0..1) that passes. Not checked when unset.
    type: float
  min_drafts:
    description:
      - Fewest drafts in the window for any verdict; fewer fails as "not enough evidence".
    type: int
    default: 50
  num_speculative_tokens:
    description:
      - The server's C(speculative_config.num_speculative_tokens) (K, as the preflight normalised it). The
        C(/metrics) page must then report exactly K per-position counters; another count means another
        server or config than the one deployed, and the gate refuses to judge.
      - Not compared when unset; the other counter invariants (per-position counts summing to the accepted
        tokens, never growing with the position, at most the drafts; mean acceptance length at most 1 + K)
        are always checked.
    type: int
  timeout:
    description: Seconds to wait for each HTTP request (each completion and each C(/metrics) scrape).
    type: float
    default: 60
  deadline:
    description:
      - Seconds the whole gate may take, every scrape, completion and the settling together; a server that
        sends its answers a byte at a time cannot keep the gate running past it.
      - Default is what a slow but healthy server needs, C(timeout * (ceil(requests / concurrency) + 3) + 5).
      - Response bodies are capped too (16 MiB for C(/metrics), 4 MiB for a completion).
    type: float
  report_path:
    description:
      - Write the report as JSON to this path and as Markdown next to it (C(gate.json) -> C(gate.md), any
        other name gets C(.md) appended). Parent directories are created; files are written atomically
        with mode 0644. Reports are written for failed verdicts too.
    type: path
  validate_certs:
    description: Verify the server's TLS certificate for an C(https) URL.
    type: bool
    default: true
notes:
  - Runs on the target with its system Python and the standard library; it uses C(prometheus_client)'s
    parser when importable and an equivalent built-in parser otherwise.
  - The 95% interval treats drafts as independent; it reflects counting noise, not variation across prompt sets.
seealso:
  - name: vLLM spec-decode metrics
    description: The counters and formulas (SpecDecodingLogging) this gate reuses.
    link: https://github.com/vllm-project/vllm/blob/main/vllm/v1/spec_decode/metrics.py
"""

EXAMPLES = r"""
- name: Gate the new release on its acceptance length
  vllm_ops.dflash.acceptance_gate:
    url: http://127.0.0.1:8000
    model: qwen36
    api_key: "{{ vllm_api_key }}"
    min_mean_acceptance_length: 3.0
    min_drafts: 200
    report_path: /var/lib/vllm/gate/{{ release_name }}.json
  register: gate

- name: Gate with own prompts and a draft acceptance rate floor
  vllm_ops.dflash.acceptance_gate:
    model: qwen36
    prompts:
      - "Question: what is 17 * 23? Think step by step.\nAnswer:"
      - "def fibonacci(n):"
    requests: 48
    max_tokens: 256
    min_draft_acceptance_rate: 0.3

- name: Roll back when the gate fails
  block:
    - name: Gate
      vllm_ops.dflash.acceptance_gate:
        model: qwen36
  rescue:
    - name: Roll back to the previous release
      vllm_ops.dflash.vllm_release:
        action: rollback
        reason: "{{ ansible_failed_result.msg }}"
"""

RETURN = r"""
passed:
  description: The verdict. V(null) in check mode.
  returned: always
  type: bool
  sample: true
mean_acceptance_length:
  description: C(1 + accepted_tokens / drafts) over the window; V(null) without drafts.
  returned: when traffic was sent
  type: float
  sample: 2.9953
mean_acceptance_length_ci95:
  description: 95% interval C([low, high]) for the mean acceptance length (method in C(report.ci_method)).
  returned: when traffic was sent
  type: list
  elements: float
  sample: [2.8628, 3.1279]
draft_acceptance_rate:
  description: C(accepted_tokens / draft_tokens) over the window.
  returned: when traffic was sent
  type: float
  sample: 0.4988
per_position_acceptance:
  description: C(accepted_per_pos[i] / drafts) for each draft position i.
  returned: when traffic was sent
  type: list
  elements: float
  sample: [0.7972, 0.6107, 0.4009, 0.1865]
drafts:
  description: Drafts proposed in the window.
  returned: when traffic was sent
  type: int
  sample: 429
draft_tokens:
  description: Draft tokens proposed in the window.
  returned: when traffic was sent
  type: int
  sample: 1716
accepted_tokens:
  description: Draft tokens accepted in the window.
  returned: when traffic was sent
  type: int
  sample: 856
requests_ok:
  description: Completions that returned non-empty text.
  returned: when traffic was sent
  type: int
  sample: 24
requests_failed:
  description: Completions that failed (HTTP error, timeout, empty text).
  returned: when traffic was sent
  type: int
  sample: 0
tokens_per_second:
  description: Generation tokens counted by the server in the window divided by the traffic's wall time.
  returned: when traffic was sent
  type: float
  sample: 412.5
relative:
  description:
    - The relative rules, C(baseline_release), C(skipped) (why none applied, or null) and C(checks), each
      with C(rule), C(status) (pass, fail, skipped, off), C(message) and both figures.
  returned: when traffic was sent
  type: dict
summary:
  description: One line, release, commit, AL (CI95) vs the last good, tokens/s, verdict and the report's path.
  returned: when traffic was sent
  type: str
  sample: "release r2 commit 4f1c2a9e: AL 3.20 (95% CI 3.11-3.29) vs 3.21 of last good r1, 412.5 tokens/s, ..."
results_path:
  description: The file the result was kept in (O(results_dir)); null without it.
  returned: when traffic was sent
  type: str
workload_sha256:
  description: sha256 of the normalised O(workload) (the same as in the report's C(workload.sha256)).
  returned: with O(validate_only) and in check mode
  type: str
  sample: df8156e86b12b4cac09686bb20e162a248a4557caf2d6492aea63f51e3ef8a48
check:
  description:
    - In check mode, what a run would do; C(msg) says it in one line.
  returned: in check mode
  type: dict
  contains:
    url:
      description: The server it would send to (without credentials).
      type: str
    workload:
      description: C(name), C(sha256), C(requests), C(concurrency), C(max_tokens) and C(source) of the traffic.
      type: dict
    deadline:
      description: Seconds the run may take (O(deadline) or the derived default).
      type: float
    thresholds:
      description:
        - The absolute thresholds, O(min_mean_acceptance_length), O(min_draft_acceptance_rate), O(min_drafts)
          and O(num_speculative_tokens).
      type: dict
    relative:
      description:
        - C(baseline_release), C(baseline_found), the C(rules) that would apply, C(skipped) (why none would,
          or null) and the rules' limits.
      type: dict
    would_write:
      description: The files a run would write (the kept result, the JSON and Markdown reports).
      type: list
      elements: str
  sample:
    url: http://127.0.0.1:8000
    workload: {name: default, requests: 24, concurrency: 4, max_tokens: 128}
    would_write: [/opt/vllm/gate-results/r2.json]
report:
  description:
    - The full report (schema 2), as written to O(report_path); see C(docs/gate-report.md).
    - Holds the thresholds, verdict, reasons, figures, request errors, time and server URL (never the api key).
  returned: when traffic was sent
  type: dict
ansible_facts:
  description: Facts set by a passed gate.
  returned: on success
  type: dict
  contains:
    dflash_gate:
      description: The report, as in RV(report).
      type: dict
      returned: on success
"""

from typing import Any, Dict
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate import GateError, GateSettings, plan_gate, run_gate
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate_history import (
    RULES,
    HistoryError,
    RelativeRules,
    baseline_result,
    save_result,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._gate_report import summary_line, write_reports
from ansible_collections.vllm_ops.dflash.plugins.module_utils._workload import WorkloadError, load_workload

FIGURES = (
    "mean_acceptance_length",
    "mean_acceptance_length_ci95",
    "draft_acceptance_rate",
    "per_position_acceptance",
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "requests_ok",
    "requests_failed",
    "tokens_per_second",
)

# The defaults are GateSettings' and RelativeRules' (the cores'), written once there. requests, max_tokens and
# concurrency have none here: unset, the workload's (or GateSettings') apply.
ARGUMENT_SPEC = dict(
    url=dict(type="str", default=GateSettings.url),
    model=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    prompts=dict(type="list", elements="str"),
    requests=dict(type="int"),
    max_tokens=dict(type="int", no_log=False),  # a token count, not a secret
    concurrency=dict(type="int"),
    min_mean_acceptance_length=dict(type="float", default=GateSettings.min_mean_acceptance_length),
    min_draft_acceptance_rate=dict(type="float"),
    min_drafts=dict(type="int", default=GateSettings.min_drafts),
    num_speculative_tokens=dict(type="int", no_log=False),  # a count, not a secret
    timeout=dict(type="float", default=GateSettings.timeout),
    deadline=dict(type="float"),
    report_path=dict(type="path"),
    validate_certs=dict(type="bool", default=GateSettings.validate_certs),
    workload=dict(type="dict"),
    workload_source=dict(type="str", default="workload"),
    validate_only=dict(type="bool", default=False),
    identity=dict(type="dict"),
    release=dict(type="str"),
    baseline_release=dict(type="str"),
    results_dir=dict(type="path"),
    max_acceptance_drop=dict(type="float", default=RelativeRules.max_acceptance_drop),
    max_position0_drop=dict(type="float", default=RelativeRules.max_position0_drop),
    max_throughput_drop=dict(type="float", default=RelativeRules.max_throughput_drop),
    min_identical_outputs=dict(type="float", default=RelativeRules.min_identical_outputs),
    disabled_rules=dict(type="list", elements="str", choices=list(RULES), default=[]),
)


def _with_overrides(params: Dict[str, Any]) -> Dict[str, Any]:
    """The workload with the plain options that replace its values (they change its hash too)."""
    data = dict(params["workload"])
    if params["prompts"]:
        data["prompts"] = [{"id": f"p{i + 1}", "prompt": text} for i, text in enumerate(params["prompts"])]
    for name in ("requests", "max_tokens", "concurrency"):
        if params[name] is not None:
            data[name] = params[name]
    return data


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    # A password in url (refused by the core) must not come back in the invocation or any message.
    try:
        password = urlsplit(params["url"]).password
    except ValueError:  # the core names what is wrong with the url
        password = None
    if password:
        module.no_log_values.add(password)
    workload = None
    if params["workload"] is not None:
        try:
            workload = load_workload(_with_overrides(params), params["workload_source"])
        except WorkloadError as exc:
            module.fail_json(msg=str(exc), passed=False)
    if params["validate_only"]:
        module.exit_json(
            changed=False,
            passed=None,
            workload_sha256=workload.sha256 if workload else None,
            msg=f"workload {workload.name!r} ({workload.sha256}) is valid" if workload else "no workload given",
        )
    identity = {k: v for k, v in (params["identity"] or {}).items() if v not in (None, "")}
    if params["release"]:
        identity["release"] = params["release"]
    results_dir = params["results_dir"] or ""
    baseline = None
    if results_dir and params["baseline_release"]:
        try:  # before any traffic: an unreadable baseline is refused, not silently skipped
            baseline = baseline_result(results_dir, params["baseline_release"])
        except HistoryError as exc:
            module.fail_json(msg=str(exc), passed=False)
    # requests / max_tokens / concurrency unset: GateSettings' defaults (or the workload's) apply.
    sizes = {name: params[name] for name in ("requests", "max_tokens", "concurrency") if params[name] is not None}
    settings = GateSettings(
        url=params["url"],
        model=params["model"],
        api_key=params["api_key"],
        prompts=params["prompts"] or (),
        min_mean_acceptance_length=params["min_mean_acceptance_length"],
        min_draft_acceptance_rate=params["min_draft_acceptance_rate"],
        min_drafts=params["min_drafts"],
        num_speculative_tokens=params["num_speculative_tokens"],
        timeout=params["timeout"],
        deadline=params["deadline"],
        validate_certs=params["validate_certs"],
        workload=workload,
        identity=identity,
        rules=RelativeRules(
            max_acceptance_drop=params["max_acceptance_drop"],
            max_position0_drop=params["max_position0_drop"],
            max_throughput_drop=params["max_throughput_drop"],
            min_identical_outputs=params["min_identical_outputs"],
            disabled=frozenset(params["disabled_rules"]),
        ),
        baseline=baseline,
        baseline_release=params["baseline_release"],
        results_dir=results_dir,
        **sizes,
    )
    if module.check_mode:
        # Every read-only check a real run does first (options, url, workload, last good result), then
        # what it would send and how it would judge; nothing is sent and nothing written.
        try:
            plan = plan_gate(settings, params["report_path"])
        except (GateError, HistoryError) as exc:
            module.fail_json(msg=str(exc), passed=False)
        module.exit_json(
            changed=False,
            skipped=True,
            passed=None,
            workload_sha256=plan["workload"]["sha256"],
            msg=plan.pop("message"),
            check=plan,
        )
    try:
        outcome = run_gate(settings)
    except GateError as exc:
        module.fail_json(msg=str(exc), passed=False)
    result = {name: outcome.report[name] for name in FIGURES}
    result.update(
        changed=False,
        passed=outcome.passed,
        report=outcome.report,
        msg=outcome.message,
        relative=outcome.report["relative"],
        summary=summary_line(outcome.report, params["report_path"]),
        results_path=None,
    )
    if results_dir and params["release"]:
        try:  # every result is kept, failed ones too: the history says what was measured and why it failed
            result["results_path"] = save_result(results_dir, params["release"], outcome.report)
            result["changed"] = True
        except HistoryError as exc:
            module.fail_json(**dict(result, msg=f"{exc} (verdict: {outcome.message})", passed=False))
    if params["report_path"]:
        try:
            result["changed"] = write_reports(outcome.report, params["report_path"]) or result["changed"]
        except GateError as exc:
            module.fail_json(**dict(result, msg=f"{exc} (verdict: {outcome.message})", passed=False))
    if not outcome.passed:
        module.fail_json(**result)
    module.exit_json(ansible_facts={"dflash_gate": outcome.report}, **result)


if __name__ == "__main__":
    main()
