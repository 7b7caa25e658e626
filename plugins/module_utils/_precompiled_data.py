# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM's precompiled path as data, and the `precompiled` option's terms: its modes and its base spec.

Apart from _precompiled's decision so that the options, which every build module and vllm_drift's look import,
carry none of it (issue 30: AnsiballZ ships each core a module's imports reach to every host).
"""

from __future__ import annotations

from typing import Optional, Tuple

from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import redact_url

__all__ = ["COMPILED_PATHS", "MODES", "NOT_COMPILED_PATHS", "PRECOMPILED_ENV", "PrecompiledError", "parse_base"]

MODES = ("auto", "always", "never")
# vLLM's own data, in one place (a vLLM upgrade edits these). Paths whose change makes a base wheel's
# compiled parts wrong for the ref: what vLLM compiles from or compiles with (setup.py of 0.33.0 blocks
# csrc, cmake, CMakeLists.txt, pyproject.toml - the torch build pin - and vllm/_custom_ops.py; the build
# requirements pin torch too), and what its precompiled path copies out of the base wheel over the
# checkout, which would hide the ref's change: the Rust frontend (rust/, its toolchain and build script;
# 0.33.0 only warns) and the Python files of the kernel packages (setup.py's extract regexes).
# "dir/" matches below dir/, "dir/*.py" the .py files below it; "CMakeLists.txt" in any directory;
# anything else that exact path.
COMPILED_PATHS = (
    "csrc/",
    "cmake/",
    "CMakeLists.txt",
    "setup.py",
    "requirements/",
    "pyproject.toml",
    "vllm/_custom_ops.py",
    "rust/",
    "rust-toolchain.toml",
    "tools/build_rust.py",
    "vllm/vllm_flash_attn/*.py",
    "vllm/third_party/flashmla/*.py",
    "vllm/third_party/triton_kernels/*.py",
    "vllm/third_party/deep_gemm/",
    "vllm/third_party/fmha_sm100/",
    "vllm/third_party/tml_fa4/",
)
# Source-controlled files under those that the precompiled path keeps (setup.py's files_to_skip).
NOT_COMPILED_PATHS = ("vllm/vllm_flash_attn/__init__.py", "vllm/vllm_flash_attn/flash_attn_interface.py")
# Every variable vLLM's setup.py reads to take (or look up) precompiled parts: the `precompiled` option sets
# them, nothing else may (VLLM_PRECOMPILED_WHEEL_LOCATION alone already switches it on, and
# VLLM_USE_PRECOMPILED_RUST or VLLM_DOCKER_BUILD_CONTEXT start the network lookup that falls back to the nightly).
PRECOMPILED_ENV = (
    "VLLM_USE_PRECOMPILED",
    "VLLM_PRECOMPILED_WHEEL_LOCATION",
    "VLLM_PRECOMPILED_WHEEL_COMMIT",
    "VLLM_USE_PRECOMPILED_RUST",
    "VLLM_DOCKER_BUILD_CONTEXT",
)


class PrecompiledError(Exception):
    """The precompiled options cannot be honoured; the message names the fix."""


def parse_base(spec: str) -> Tuple[Optional[str], str]:
    """`main` -> (None, "main"): a ref of the repository being built; `<url>#<ref>` -> (url, ref)."""
    spec = (spec or "").strip()
    url, sep, ref = spec.rpartition("#")
    if not sep:
        url, ref = "", spec
    if not ref or (sep and not url):
        raise PrecompiledError(
            f"precompiled_base {redact_url(spec)!r} is not a ref or `<url>#<ref>`; give e.g. `main` or "
            "`https://github.com/vllm-project/vllm.git#main`"
        )
    return (url or None), ref
