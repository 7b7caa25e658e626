# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The edits of the two fork branches of issue #16, on a checkout of vLLM 0.26.0 (prepare_fork.sh).

    python3 fork_edits.py dflash-fix|csrc-forced CHECKOUT

dflash-fix:   Python only. The DFlash drafter (vllm/model_executor/models/qwen3_dflash.py) logs
              "vllm_ops fork gpu/dflash-fix: DFlash drafter built from the fork" when it is built: the
              server log of the H200 shows that the fork's code serves.
csrc-forced:  on top of dflash-fix, a new op `_C_custom_ar::vllm_ops_fork_marker` in csrc/torch_bindings.cpp
              that the drafter calls when it is built. A full build has it; the precompiled path (the base
              wheel's libraries) does not, so the drafter fails when the engine builds it.
Test equipment (tests/gpu); standard library only.
"""

from __future__ import annotations

import os
import sys

DFLASH = "vllm/model_executor/models/qwen3_dflash.py"
BINDINGS = "csrc/torch_bindings.cpp"
INIT = """class DFlashQwen3ForCausalLM(Qwen3ForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        nn.Module.__init__(self)
"""
LOG = '        logger.info("vllm_ops fork %s: DFlash drafter built from the fork", VLLM_OPS_FORK)\n'
MARKER = "# The fork's marker (tests/gpu fork proof of vllm_ops.dflash): the drafter says it loaded from the fork.\n"
OP = """// The fork's kernel-side marker: only a full build has it (tests/gpu fork proof of vllm_ops.dflash).
int64_t vllm_ops_fork_marker() { return 16; }
TORCH_LIBRARY_FRAGMENT(CONCAT(TORCH_EXTENSION_NAME, _custom_ar), fork_ops) {
  fork_ops.def("vllm_ops_fork_marker", &vllm_ops_fork_marker);
}

"""
CALL = (
    "        # The fork changed csrc/ too: its drafter needs the kernel-side marker of the same commit.\n"
    "        torch.ops._C_custom_ar.vllm_ops_fork_marker()\n"
)


def _edit(path: str, old: str, new: str) -> None:
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if old not in text:
        raise SystemExit(f"{path}: the text to change is not there; is this vLLM 0.26.0?")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text.replace(old, new, 1))


def main(branch: str, checkout: str) -> None:
    dflash = os.path.join(checkout, DFLASH)
    if branch == "dflash-fix":
        logger = "logger = init_logger(__name__)\n"
        _edit(dflash, logger, f'{logger}\n{MARKER}VLLM_OPS_FORK = "gpu/dflash-fix"\n')
        _edit(dflash, INIT, INIT + LOG)
    elif branch == "csrc-forced":
        register = "REGISTER_EXTENSION(TORCH_EXTENSION_NAME)"
        _edit(os.path.join(checkout, BINDINGS), register, OP + register)
        _edit(dflash, LOG, LOG + CALL)
        _edit(dflash, 'VLLM_OPS_FORK = "gpu/dflash-fix"', 'VLLM_OPS_FORK = "gpu/csrc-forced"')
    else:
        raise SystemExit(f"unknown branch {branch} (dflash-fix, csrc-forced)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
