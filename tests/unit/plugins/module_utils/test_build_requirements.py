"""build_isolation=false: the ref's build requirements go into the release venv first; torch is the venv's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _build_requirements
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build import BuildOptions, build
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_requirements import build_requirements
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import make_tiny_repo

VLLM_PYPROJECT = """\
[build-system]
# Should be mirrored in requirements/build/cuda.txt
requires = [
    "cmake>=3.26.1",
    "setuptools>=77.0.3,<81.0.0",
    "torch == 2.11.0",  # the build pin
]
build-backend = "setuptools.build_meta"

[project]
name = "vllm"
"""


def _tree(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_vllm_layout_takes_the_target_devices_file_with_its_includes(tmp_path):
    src = _tree(
        tmp_path / "src",
        {
            "requirements/build/cuda.txt": "cmake>=3.26.1\ntorch==2.11.0\nwheel\n",
            "requirements/build/rocm.txt": "-r ../common.txt\ntorch==2.11.0\n",
            "requirements/common.txt": "regex\n",
            "pyproject.toml": VLLM_PYPROJECT,
        },
    )
    dest = tmp_path / "build" / "req.txt"
    found = build_requirements(str(src), str(dest), None, keep_torch=True)
    assert found is not None and found.source == "requirements/build/cuda.txt"
    assert dest.read_text().splitlines() == ["cmake>=3.26.1", "torch==2.11.0", "wheel"]
    found = build_requirements(str(src), str(dest), "rocm", keep_torch=False)
    assert found is not None and found.source == "requirements/build/rocm.txt"
    # the copy lives elsewhere: an include is made absolute; the venv's own torch is kept (use_existing_torch)
    assert dest.read_text().splitlines() == [f"-r {src / 'requirements' / 'common.txt'}"]
    assert found.skipped == ["torch==2.11.0"]


def test_older_vllm_and_pyproject_only(tmp_path, monkeypatch):
    src = _tree(tmp_path / "old", {"requirements/build.txt": "ninja\n", "pyproject.toml": VLLM_PYPROJECT})
    dest = tmp_path / "req.txt"
    assert build_requirements(str(src), str(dest), "cuda", True).source == "requirements/build.txt"
    src = _tree(tmp_path / "pyproject-only", {"pyproject.toml": VLLM_PYPROJECT})
    for tomllib in (True, False):  # Python 3.11+ reads TOML; before, the array literal
        if not tomllib:
            monkeypatch.setitem(sys.modules, "tomllib", None)
        found = build_requirements(str(src), str(dest), "cuda", keep_torch=False)
        assert found is not None and found.source == "pyproject.toml [build-system] requires"
        assert dest.read_text().splitlines() == ["cmake>=3.26.1", "setuptools>=77.0.3,<81.0.0"]
    assert build_requirements(str(tmp_path / "none"), str(dest), None, True) is None
    assert _build_requirements.DEFAULT_DEVICE == "cuda"


@pytest.mark.slow_build
@pytest.mark.engine
def test_fixture_engine_builds_without_isolation_from_its_build_requirements(pip_args, tmp_path):
    """Before: `No module named setuptools_scm` (nothing installed the build requirements into the venv)."""
    engine_repo = pytest.importorskip("ansible_collections.vllm_ops.dflash.tests.helpers.engine_repo")
    repo = tmp_path / "engine"
    refs = engine_repo.create_engine_repo(repo)
    opts = BuildOptions(
        str(repo), "main", root=str(tmp_path / "root"), python=sys.executable, pip_args=pip_args, build_isolation=False
    )
    result = build(opts)
    assert (result["built"], result["commit"]) == (True, refs["refs/heads/main"])
    log = Path(result["log_path"]).read_text()
    assert "build_isolation=false: installing the build requirements of requirements/build.txt" in log
    assert re.search(r"\$ \S+ -m pip install .* -r \S+/build-requirements\.txt\n", log)
    assert "the wheel builds against the venv's torch: none" in log
    venv_python = os.path.join(result["release"], "venv", "bin", "python")
    out = subprocess.run(
        [venv_python, "-c", "import vllm, vllm._C; print(vllm.__version__, vllm._C.add(2, 3))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [engine_repo.scm_version(repo, result["commit"]), "5"]
    manifest = json.loads(Path(result["release"], "manifest.json").read_text())
    assert manifest["inputs"]["build_isolation"] is False and manifest["build_torch"] is None


def test_torch_input_is_what_the_venv_sees(tmp_path, monkeypatch):
    """The base interpreter's torch is an input only when the venv sees it (system site packages)."""
    repo = tmp_path / "repo"
    make_tiny_repo(repo)
    site = tmp_path / "site"
    (site / "torch-2.9.0.dist-info").mkdir(parents=True)
    (site / "torch-2.9.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.9.0\n")

    def name(with_torch: bool, **kwargs) -> str:
        if with_torch:
            monkeypatch.setenv("PYTHONPATH", str(site))
        else:
            monkeypatch.delenv("PYTHONPATH", raising=False)
        opts = BuildOptions(str(repo), "main", root=str(tmp_path / "root"), python=sys.executable, **kwargs)
        return build(opts, check_mode=True)["release_name"]

    isolated = {"build_isolation": False}
    assert name(True, **isolated) == name(False, **isolated)  # before: 2.9.0 from the base interpreter
    shared = {"build_isolation": False, "system_site_packages": True}
    assert name(True, **shared) != name(False, **shared)
