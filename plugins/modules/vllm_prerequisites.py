#!/usr/bin/python
# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_prerequisites
short_description: Check what a GPU host needs before vLLM is built or installed on it
description:
  - Reads the host - the python O(python) names, its version (vLLM needs 3.10 to 3.13) and whether C(python -m venv)
    makes a venv with pip (Debian/Ubuntu ship venv without C(ensurepip) unless C(python3.X-venv) is installed),
    C(git), for a full build C(gcc)/C(g++) (vLLM needs gcc >= 11.3) and C(nvcc) against the CUDA torch was built
    for, the NVIDIA driver (C(/proc/driver/nvidia/version), else C(nvidia-smi)) against that CUDA, and the free
    space under O(root).
  - Returns every missing piece in RV(problems), each with one message naming what is wrong and its fix (the
    package for the host's package manager, apt on Debian/Ubuntu and dnf on the RHEL family, or the variable that
    changes the need), and the packages that would fix the ones a package can fix in RV(packages).
  - Changes nothing; O(fail) V(true) fails with all the messages in one C(msg). The role
    C(vllm_ops.dflash.vllm_prerequisites) installs RV(packages) where the user allows it and checks again.
version_added: 0.2.0
author: vllm_ops maintainers (@vllm-ops)
extends_documentation_fragment:
  - vllm_ops.dflash.attributes
  - vllm_ops.dflash.attributes.info_module
  - vllm_ops.dflash.common
  - vllm_ops.dflash.common.installer
options:
  python:
    description: The python vLLM's venvs are made with (the role's C(vllm_python)), a name on the PATH or a path.
  root:
    description: The root of the releases; the free space is read on it, or on its nearest directory that exists.
  git:
    description: Whether git is needed (a C(vllm_ref) install clones vLLM on the build host).
    type: bool
    default: true
  installer:
    description:
      - The installer of the builds (the role's C(vllm_installer)). Without a uv (the collection's in O(root)/tools,
        or one on the PATH) or with V(pip), C(python -m venv) must make a venv with pip - the uv provisioning and
        the pip installer run it.
  full_build:
    description: Whether this host compiles vLLM's kernels (gcc, g++ and nvcc are needed).
    type: bool
    default: false
  cuda:
    description:
      - The CUDA version torch was built for (V(12.9) or V(cu129); vLLM's default wheels are 12.9). The driver must
        be at least the lowest that runs that CUDA major (minor version compatibility - 525.60.13 for 12.x,
        580.65.06 for 13.x), and a full build's nvcc must be of the same major.
      - An empty string skips the driver check (a host without a GPU).
    type: str
    default: "12.9"
  cuda_home:
    description: CUDA_HOME of the build environment; its C(bin/nvcc) is looked for first.
    type: path
  min_free_gb:
    description: GiB that must be free under O(root).
    type: float
    default: 30
  fail:
    description: Fail with every problem's message in one C(msg) when any is found.
    type: bool
    default: true
notes:
  - Runs on the target with its system Python and the standard library only.
seealso:
  - module: ansible.builtin.package
  - module: vllm_ops.dflash.vllm_build
"""

EXAMPLES = r"""
- name: Check the host before any build
  vllm_ops.dflash.vllm_prerequisites:
    python: python3.12
    root: /opt/vllm
    full_build: true
    cuda: "12.9"
    cuda_home: /usr/local/cuda-12.9
"""

RETURN = r"""
problems:
  description: Every missing piece, in the order a deploy would meet them.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: >-
        What is missing - python, python_version, venv, git, compiler, compiler_version, cuda_toolkit,
        cuda_toolkit_version, driver, driver_version, disk.
      type: str
    msg:
      description: What is wrong and its fix.
      type: str
    packages:
      description: The packages that fix it (empty when no package of the host's manager does).
      type: list
      elements: str
  sample:
    - name: venv
      msg: >-
        python3.11's venv is missing (...): apt-get install -y python3.11-venv, or set
        vllm_prerequisites_install: true
      packages: [python3.11-venv]
packages:
  description: The packages that fix the problems a package fixes, each once.
  returned: always
  type: list
  elements: str
  sample: [python3.11-venv, git]
package_manager:
  description: apt (Debian/Ubuntu), dnf (the RHEL family) or an empty string (another family, from /etc/os-release).
  returned: always
  type: str
observed:
  description: >-
    What was read on the host (the python, its version, the commands found, their versions, the driver, the free
    space).
  returned: always
  type: dict
"""

from dataclasses import asdict

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.dflash.plugins.module_utils._args import INSTALLER_ARGS, ROOT_ARGS
from ansible_collections.vllm_ops.dflash.plugins.module_utils._prerequisites import (
    Need,
    PrerequisiteError,
    installable,
    observe,
    parse_cuda,
    problems,
    summary,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            **INSTALLER_ARGS,
            **ROOT_ARGS,
            # The defaults are Need's (the core's), written once there.
            git=dict(type="bool", default=Need.git),
            full_build=dict(type="bool", default=Need.full_build),
            cuda=dict(type="str", default=Need.cuda),
            cuda_home=dict(type="path"),
            min_free_gb=dict(type="float", default=Need.min_free_gb),
            fail=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    need = Need(
        python=params["python"],
        root=params["root"],
        git=params["git"],
        installer=params["installer"],
        full_build=params["full_build"],
        cuda=params["cuda"],
        min_free_gb=params["min_free_gb"],
        cuda_home=params["cuda_home"] or "",
    )
    try:
        parse_cuda(need.cuda)
    except PrerequisiteError as exc:
        module.fail_json(msg=str(exc))
    seen = observe(need)
    found = problems(need, seen)
    result = dict(
        changed=False,
        problems=[problem.as_dict() for problem in found],
        packages=installable(found),
        package_manager=seen.package_manager,
        observed=asdict(seen),
    )
    if found and params["fail"]:
        module.fail_json(msg=summary(found), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
