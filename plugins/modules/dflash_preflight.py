#!/usr/bin/python
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
module: dflash_preflight
short_description: Check a serve config, its DFlash speculative config and drafter against the installed vLLM
version_added: 0.1.0
description:
  - Checks a C(vllm serve --config) mapping and its C(speculative-config) before any file or the service changes,
    and for C(method=dflash) also the drafter's C(config.json), against what the installed vLLM can actually run.
  - What vLLM accepts is what the installed vLLM answered itself, the C(capabilities) of
    M(vllm_ops.dflash.vllm_facts) - speculative methods and their deprecated MTP aliases, rejection and draft
    sample methods, C(SpeculativeConfig) fields (an unknown one is refused, naming close matches), registered
    draft architectures (a drafter whose C(architectures) vLLM does not register is refused), attention
    backends, and the flags of the C(vllm serve) parser (O(serve_config)).
  - Without capabilities (the release's config could not be imported) or for a key the installed vLLM could not
    read, the tables of the nearest older release in the collection's C(_vllm_data.py) are used instead; a
    warning finding and RV(capabilities_used), RV(fallback_release) and RV(fallback_keys) say so. O(serve_config)
    is then not checked (a warning).
  - Further rules mirror vLLM's own - C(num_speculative_tokens) missing or not positive (for DFlash it is
    defaulted to the drafter's C(block_size - 1)), C(tensor_parallel_size) inside the speculative config,
    C(draft_tensor_parallel_size) neither 1 nor the target's, synthetic rejection sampling without its
    parameters, an attention backend without non-causal attention for a DFlash drafter that needs it (the
    speculative C(attention_backend), else the serve-level C(attention-backend) the drafter inherits).
  - What depends on the installed checkout is read from the boolean probes of M(vllm_ops.dflash.vllm_facts),
    never guessed from the version string - whether vLLM adds 1 to DFlash C(target_layer_ids) (vllm PR 40727;
    without it every hidden state is read one layer too early), whether it honours the drafter's
    C(layer_types)/C(sliding_window) (without it sliding-window layers run as full attention), and whether
    a drafter that mixes sliding and full layers needs the V2 model runner. The probe patterns are data, listed
    in C(docs/probes.md) of this collection; a probe this module needs but that was not run is an error.
  - Fails, with every error finding in C(msg), when any finding is an error (or any warning with
    O(fail_on_warnings)). Reads files only; never changes anything.
author: vllm_ops maintainers (@vllm-ops)
extends_documentation_fragment:
  - vllm_ops.dflash.attributes
attributes:
  check_mode:
    support: full
    details:
      - The module only reads; check mode runs every check.
  diff_mode:
    support: N/A
    details:
      - The module changes nothing.
  idempotent:
    support: full
options:
  speculative_config:
    description:
      - The speculative config, as it goes under C(speculative-config) in the serve config, with keys as vLLM
        spells them (C(num-speculative-tokens) is accepted and normalised to C(num_speculative_tokens)).
      - For example C(method), C(model), C(num_speculative_tokens), C(draft_tensor_parallel_size),
        C(attention_backend), C(rejection_sample_method), C(synthetic_acceptance_length),
        C(synthetic_acceptance_rates), C(revision).
      - When C(method) is omitted it is inferred as vLLM does (a model name containing C(dflash) means C(dflash)).
      - Empty (the default) checks only O(serve_config).
    type: dict
    default: {}
  serve_config:
    description:
      - The mapping of the C(vllm serve --config) YAML as it will be written (long option names as keys), checked
        against the C(serve_flags) of the installed vLLM's own parser - an unknown flag is refused naming it and
        close matches, a value outside a flag's choices is refused, and so is a boolean vLLM would not honour.
      - vLLM's C(--config) loader drops a YAML C(false) and passes C(true) as the bare flag. The role
        C(dflash_config) therefore writes C(false) as C(no-<flag>) set to C(true); a flag without a C(--no-) form cannot
        be given C(false) (refused, with the fix), and C(true) for a flag that takes a value is refused.
      - Its C(attention-backend) is the drafter's when the speculative config sets none.
      - Omitted, no serve config is checked.
    type: dict
  drafter_config:
    description:
      - The DFlash drafter's Hugging Face config, given as the path of its C(config.json), a model or snapshot
        directory holding it, a Hugging Face cache repo directory (C(models--org--name)), a Hugging Face cache
        root (C(~/.cache/huggingface) or its C(hub/)) in which the C(model) of O(speculative_config) is looked
        up, or the parsed dict itself.
      - In a cache, the snapshot is the one C(refs/<revision>) names (C(revision) of O(speculative_config),
        default C(main)), else the only one present.
      - When omitted and the C(model) of O(speculative_config) is a directory on the host, its C(config.json)
        is used. Only needed for C(method=dflash).
    type: raw
  vllm_facts:
    description:
      - The facts M(vllm_ops.dflash.vllm_facts) returned (C(ansible_facts.vllm), or the registered result
        holding it). Its C(capabilities), C(capabilities_error), C(probes) (name to boolean) and C(version) are
        used.
    type: dict
  tensor_parallel_size:
    description:
      - The target model's tensor parallel size (C(--tensor-parallel-size) of the serve config).
    type: int
    default: 1
  capability_probes:
    description:
      - Which probe of O(vllm_facts) answers each question; merged over the defaults
        C(aux_layer_offset=dflash_aux_layer_offset), C(aux_layer_offset_v2=dflash_aux_layer_offset_v2),
        C(v2_runner_dflash=dflash_v2_runner), C(sliding_window=dflash_sliding_window),
        C(mixed_attention_v2=dflash_mixed_attention_v2) and
        C(mixed_attention_auto_v2=dflash_mixed_attention_auto_v2).
    type: dict
  env:
    description:
      - The environment the service will run with (the env file's variables), to see for example
        C(VLLM_USE_V2_MODEL_RUNNER).
      - Values of keys that say they hold a credential are masked in the module's output. The rule is the
        collection's one for every module - any case, anywhere in the name - C(TOKEN) (not C(TOKENIZER)),
        C(KEY), C(SECRET), C(PASS), C(CREDENTIAL), C(AUTH), C(COOKIE), C(SESSION), C(PRIVATE), and C(PAT) or
        C(PWD) as a word of their own, so C(HFTOKEN), C(OPENAI_APIKEY), C(DB_PASS) and C(GITHUB_PAT) are masked
        and C(TOKENIZERS_PARALLELISM) is not.
    type: dict
    default: {}
  fail_on_warnings:
    description:
      - Fail when there are warnings, too.
    type: bool
    default: false
seealso:
  - module: vllm_ops.dflash.vllm_facts
notes:
  - The probes answer for the checkout's sources; they say nothing about its compiled extensions
    (M(vllm_ops.dflash.vllm_facts) checks those).
"""

EXAMPLES = r"""
- name: Read what the installed vLLM can do
  vllm_ops.dflash.vllm_facts:
    probes: "{{ vllm_probes }}"

- name: Check the DFlash config before the restart
  vllm_ops.dflash.dflash_preflight:
    speculative_config:
      method: dflash
      model: z-lab/Qwen3.6-27B-DFlash
      attention_backend: flash_attn
    drafter_config: /var/lib/vllm/.cache/huggingface
    vllm_facts: "{{ ansible_facts.vllm }}"
    tensor_parallel_size: 2
    env:
      VLLM_USE_V2_MODEL_RUNNER: "1"
  register: preflight

- name: Check the serve config as it will be written against the release's own vllm serve parser
  vllm_ops.dflash.dflash_preflight:
    serve_config:
      model: Qwen/Qwen3.6-27B
      port: 8000
      no-enable-prefix-caching: true
      attention-backend: FLASH_ATTN
    vllm_facts: "{{ ansible_facts.vllm }}"

- name: Template the serve config with the normalised speculative config
  ansible.builtin.template:
    src: serve.yaml.j2
    dest: /etc/vllm/qwen36.yaml
  vars:
    speculative_config: "{{ preflight.speculative_config }}"
"""

RETURN = r"""
speculative_config:
  description:
    - The speculative config normalised - keys in vLLM's spelling, C(method) filled in as vLLM resolves it,
      C(num_speculative_tokens) an integer, defaulted to the drafter's C(block_size - 1) for DFlash.
  returned: always
  type: dict
  sample: {"method": "dflash", "model": "z-lab/Qwen3.6-27B-DFlash", "num_speculative_tokens": 15}
findings:
  description:
    - Every problem found. C(level) is C(error) (vLLM would refuse the config, or run the drafter wrongly) or
      C(warning); C(field) is the option path it concerns; C(message) says the problem and the fix.
  returned: always
  type: list
  elements: dict
  sample:
    - level: error
      field: drafter_config.layer_types
      message: "drafter_config.layer_types: the drafter has sliding-window layers, and this vLLM 0.20.1 runs
        sliding-window drafter layers as full attention ... Fix: deploy a vLLM whose DFlash drafter honours
        layer_types/sliding_window (0.25.0+, or 0.26.0+ for mixed layers)"
error_count:
  description: Number of error findings.
  returned: always
  type: int
  sample: 0
warning_count:
  description:
    - Number of warning findings. Each warning is also shown as an Ansible warning (the key C(warnings) is
      Ansible's own, hence the name).
  returned: always
  type: int
  sample: 1
drafter_config_path:
  description: The drafter C(config.json) that was read; null when O(drafter_config) was a dict or not needed.
  returned: always
  type: str
  sample: /var/lib/vllm/.cache/huggingface/hub/models--z-lab--Qwen3.6-27B-DFlash/snapshots/0123abcd/config.json
drafter_config_sha256:
  description:
    - sha256 of that C(config.json); null when none was read. The C(dflash_config) role records it, so that the
      deploy's look (M(vllm_ops.dflash.vllm_drift) O(vllm_ops.dflash.vllm_drift#module:recorded_inputs)) sees
      a drafter changed in place.
  returned: always
  type: str
capabilities_used:
  description:
    - C(vllm) when every judged value came from the installed vLLM's own answer, C(fallback) when at least one
      came from the fallback tables of C(_vllm_data.py).
  returned: always
  type: str
  sample: vllm
fallback_release:
  description: The release whose fallback tables were used; null when none was.
  returned: always
  type: str
  sample: 0.26.0
fallback_keys:
  description: The capability keys judged against the fallback tables.
  returned: always
  type: list
  elements: str
  sample: [speculative_methods, speculative_fields]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import secret_name
from ansible_collections.vllm_ops.dflash.plugins.module_utils._preflight import (
    ERROR,
    WARNING,
    PreflightError,
    preflight,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "speculative_config": {"type": "dict", "default": {}},
            "serve_config": {"type": "dict"},
            "drafter_config": {"type": "raw"},
            "vllm_facts": {"type": "dict"},
            "tensor_parallel_size": {"type": "int", "default": 1},
            "capability_probes": {"type": "dict"},
            "env": {"type": "dict", "default": {}},
            "fail_on_warnings": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    # Only secret-looking values are masked: masking the whole env would also mask every "1" in the output.
    # The collection's one rule (_common.secret_name): HFTOKEN and DB_PASS are secrets, TOKENIZERS_PARALLELISM is not.
    module.no_log_values.update(
        str(value) for key, value in params["env"].items() if value not in (None, "") and secret_name(str(key))
    )
    try:
        result = preflight(
            params["speculative_config"],
            serve_config=params["serve_config"],
            drafter_config=params["drafter_config"],
            vllm_facts=params["vllm_facts"],
            tensor_parallel_size=params["tensor_parallel_size"],
            capability_probes=params["capability_probes"],
            env=params["env"],
        )
    except PreflightError as exc:
        module.fail_json(msg=str(exc), changed=False)
    warnings = [f["message"] for f in result["findings"] if f["level"] == WARNING]
    for warning in warnings:
        module.warn(warning)
    failing = [f["message"] for f in result["findings"] if f["level"] == ERROR]
    if params["fail_on_warnings"]:
        failing += warnings
    if failing:
        module.fail_json(msg=f"{len(failing)} preflight finding(s): " + " | ".join(failing), changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
