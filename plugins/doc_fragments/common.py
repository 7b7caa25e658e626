# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    # The option families of module_utils/_args.py, one fragment each: that file holds their argument spec
    # and defaults. ansible-test reads DOCUMENTATION as a literal, so each `default:` is repeated here;
    # tests/unit/plugins/module_utils/test_args.py keeps it equal to the spec's. A module that says more of
    # an option (what it uses the root for) writes only its own `description:`; ansible merges the rest.

    # Option root (ROOT_ARGS).
    DOCUMENTATION = r"""
options:
  root:
    description:
      - The vLLM root on the host, holding C(releases/), C(current), C(state.json), C(wheels/) and the host lock.
      - Module defaults group C(group/vllm_ops.dflash.vllm_root) sets it for all the modules that take it.
    type: path
    default: /opt/vllm
"""

    # Option instance (INSTANCE_ARGS).
    INSTANCE = r"""
options:
  instance:
    description: The vLLM instance (its unit, config and lock); one host may serve several.
    type: str
    default: default
"""

    # Options python and installer (INSTALLER_ARGS).
    INSTALLER = r"""
options:
  python:
    description:
      - The interpreter to create the release venv with, as a command on PATH or a path. Its absolute path and
        version are build inputs.
      - It needs the C(venv) module with C(ensurepip) (Debian and Ubuntu - the C(python3-venv) package) unless
        the installer is uv.
    type: str
    default: python3
  installer:
    description:
      - What creates the venv, builds the wheel and installs it. V(pip) - C(python -m venv), C(pip wheel),
        C(pip install). V(uv) - C(uv venv), C(uv build --wheel), C(uv pip install). V(auto) - uv if there is one
        (O(root)C(/tools/bin/uv) first - the pinned uv the C(vllm_install) role provisions on a host without
        uv - then C(uv) on PATH), else pip. The resolved installer is a build input.
      - uv installs by hardlink from its cache O(root)C(/cache/uv) (C(UV_LINK_MODE=hardlink), on the file system
        of the releases), so releases that share packages share their disk blocks.
    type: str
    default: auto
    choices: [auto, uv, pip]
"""

    # Option keep_releases (KEEP_RELEASES_ARGS).
    KEEP_RELEASES = r"""
options:
  keep_releases:
    description: How many of the newest releases to keep, besides the current and previous ones.
    type: int
    default: 3
"""

    # Option disk_budget_gb (DISK_BUDGET_ARGS).
    DISK_BUDGET = r"""
options:
  disk_budget_gb:
    description:
      - The most the root may hold, in GiB (allocated blocks, a hard-linked file once). Unset, the root is unbounded.
      - Over it, the oldest parts go first (by their newest file time) - the caches O(root)C(/cache/uv), C(pip),
        C(ccache), C(sccache) and C(overlay/<x>), the mirrors O(root)C(/src/<repo>.git), wheels and releases (with
        their wheels, beyond O(keep_releases) if need be) - never the current, previous, last good or rollback
        release, nothing outside the root (no symlink is followed) and nothing else under it (logs, state, tools).
      - A run that cannot fit even with every part that may go freed fails first, frees nothing and names the
        biggest parts. RV(disk) says what was freed (or would be, in check mode).
    type: float
"""
