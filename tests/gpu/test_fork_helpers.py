# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fork proof's helpers (issue #16): wheel_delta.py carries a second wheel byte for byte, fork_edits.py
makes the two fork branches."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fork_edits  # noqa: E402
import wheel_delta  # noqa: E402

LIB = hashlib.sha256(b"lib").digest() * 2000  # a large member both wheels share


def _wheel(path: Path, version: str, dflash: bytes) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("vllm/_C.abi3.so", LIB)
        archive.writestr("vllm/model_executor/models/qwen3_dflash.py", dflash)
        archive.writestr(f"vllm-{version}.dist-info/METADATA", f"Name: vllm\nVersion: {version}\n")
        archive.writestr(f"vllm-{version}.dist-info/RECORD", "...\n")
    return path


def test_a_wheel_is_carried_as_its_delta_and_rebuilt_byte_for_byte(tmp_path: Path) -> None:
    base = _wheel(tmp_path / "vllm-1+gaaa-cp38-abi3-any.whl", "1+gaaa", b"# fix\n")
    target = _wheel(tmp_path / "vllm-2+gbbb-cp38-abi3-any.whl", "2+gbbb", b"# forced\n")
    made = wheel_delta.make(str(base), str(target), str(tmp_path / "delta.zip"))
    assert made["changed"] == 3  # the drafter and the renamed .dist-info; the library is not carried
    assert made["delta_bytes"] < len(LIB) // 10
    out = tmp_path / "out"
    out.mkdir()
    applied = wheel_delta.apply(str(base), str(tmp_path / "delta.zip"), str(out))
    assert (out / target.name).read_bytes() == target.read_bytes()
    assert applied["sha256"] == hashlib.sha256(target.read_bytes()).hexdigest()


def test_a_delta_refuses_another_base_wheel(tmp_path: Path) -> None:
    base = _wheel(tmp_path / "a.whl", "1", b"# fix\n")
    target = _wheel(tmp_path / "b.whl", "2", b"# forced\n")
    wheel_delta.make(str(base), str(target), str(tmp_path / "delta.zip"))
    other = _wheel(tmp_path / "c.whl", "1", b"# other\n")
    with pytest.raises(SystemExit, match="not the wheel the delta was made against"):
        wheel_delta.apply(str(other), str(tmp_path / "delta.zip"), str(tmp_path))


def test_the_command_line_says_how_to_use_it() -> None:
    result = subprocess.run([sys.executable, str(HERE / "wheel_delta.py")], capture_output=True, text=True)
    assert result.returncode == 2 and "wheel_delta.py make BASE.whl" in result.stderr


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
