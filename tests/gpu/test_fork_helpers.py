# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fork proof's helper (issue #16): fork_edits.py makes the two fork branches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fork_edits  # noqa: E402


def _checkout(tmp_path: Path) -> Path:
    """The two files the fork edits, with the text of vLLM 0.26.0 that the edits anchor on."""
    dflash = tmp_path / fork_edits.DFLASH
    dflash.parent.mkdir(parents=True)
    dflash.write_text("import torch\nlogger = init_logger(__name__)\n\n\n" + fork_edits.INIT + "        pass\n")
    bindings = tmp_path / fork_edits.BINDINGS
    bindings.parent.mkdir(parents=True)
    bindings.write_text("REGISTER_EXTENSION(TORCH_EXTENSION_NAME)\n")
    return tmp_path


def test_the_fork_branches_edit_the_drafter_and_then_csrc(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    fork_edits.main("dflash-fix", str(checkout))
    drafter = (checkout / fork_edits.DFLASH).read_text()
    assert 'VLLM_OPS_FORK = "gpu/dflash-fix"' in drafter and fork_edits.LOG in drafter
    assert "vllm_ops_fork_marker" not in drafter
    compile(drafter, "qwen3_dflash.py", "exec")
    fork_edits.main("csrc-forced", str(checkout))
    drafter = (checkout / fork_edits.DFLASH).read_text()
    assert 'VLLM_OPS_FORK = "gpu/csrc-forced"' in drafter
    assert drafter.index(fork_edits.LOG) < drafter.index("torch.ops._C_custom_ar.vllm_ops_fork_marker()")
    assert 'fork_ops.def("vllm_ops_fork_marker"' in (checkout / fork_edits.BINDINGS).read_text()


def test_an_edit_on_another_vllm_is_refused(tmp_path: Path) -> None:
    (tmp_path / fork_edits.DFLASH).parent.mkdir(parents=True)
    (tmp_path / fork_edits.DFLASH).write_text("# not vLLM 0.26.0\n")
    with pytest.raises(SystemExit, match=r"is this vLLM 0\.26\.0"):
        fork_edits.main("dflash-fix", str(tmp_path))
