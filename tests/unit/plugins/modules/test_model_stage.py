"""model_stage as Ansible runs it: a subprocess reading its arguments from a JSON file."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.tests.helpers import module_runner
from ansible_collections.vllm_ops.dflash.tests.helpers.fake_hub import FakeHub, serve

CONFIG = b'{"architectures": ["DFlashDraftModel"]}'
WEIGHTS = b"\x07" * 5000


def run_module(tmp_path: Path, check_mode: bool = False, diff: bool = False, **args) -> dict:
    return module_runner.run_module("model_stage", tmp_path, args, check_mode=check_mode, diff=diff)[0]


def test_a_host_directory_is_staged_recorded_and_idempotent(tmp_path):
    source = tmp_path / "copy"
    source.mkdir()
    (source / "config.json").write_bytes(CONFIG)
    model = {"name": "drafter", "repo_id": "org/drafter", "revision": "c" * 40, "source": "path", "path": str(source)}
    args = {"models": [model], "cache_dir": str(tmp_path / "hub"), "record": str(tmp_path / "models.json")}
    planned = run_module(tmp_path, check_mode=True, diff=True, **args)
    assert planned["changed"] and planned["diff"]["before"] is None and not (tmp_path / "models.json").exists()
    done = run_module(tmp_path, diff=True, **args)
    snapshot = tmp_path / "hub" / "models--org--drafter" / "snapshots" / ("c" * 40)
    assert done["changed"] and done["models"]["drafter"]["snapshot"] == str(snapshot)
    assert json.loads((tmp_path / "models.json").read_text())["files"] == {
        str(snapshot / "config.json"): hashlib.sha256(CONFIG).hexdigest()
    }
    again = run_module(tmp_path, **args)
    assert (again["changed"], "diff" in again) == (False, False)


def test_a_branch_is_refused_naming_the_repo_and_the_fix(tmp_path):
    model = {"repo_id": "org/drafter", "revision": "main"}
    result = run_module(tmp_path, models=[model], cache_dir=str(tmp_path / "hub"), python=sys.executable)
    assert result["failed"] and "revision 'main' of org/drafter is not a 40-hex commit" in result["msg"]
    assert "Fix:" in result["msg"] and not (tmp_path / "hub").exists()


@pytest.mark.slow
def test_the_hub_source_verifies_and_never_returns_the_token(tmp_path):
    python = os.environ.get("VLLM_OPS_HF_PYTHON") or sys.executable
    if subprocess.run([python, "-c", "import huggingface_hub"], capture_output=True, check=False).returncode != 0:
        pytest.skip("no python with huggingface_hub: pip install -r requirements-test.txt or set VLLM_OPS_HF_PYTHON")
    hub = FakeHub()
    commit = hub.add_commit(
        "org/drafter", {"config.json": CONFIG, "model.safetensors": WEIGHTS}, lfs=("model.safetensors",)
    )
    with serve(hub) as url:
        args = {
            "models": [{"name": "drafter", "repo_id": "org/drafter", "revision": commit}],
            "cache_dir": str(tmp_path / "hub"),
            "record": str(tmp_path / "models.json"),
            "python": python,
            "hf_endpoint": url,
            "hf_token": "s3cr3t-hub-token",
        }
        result = run_module(tmp_path, **args)
        assert result["changed"] and result["models"]["drafter"]["commit"] == commit
        assert result["models"]["drafter"]["files"]["model.safetensors"]["verified_by"] == "sha256 (LFS oid)"
        assert "s3cr3t-hub-token" not in json.dumps(result)
        missing = run_module(tmp_path, **{**args, "models": [{"repo_id": "org/drafter", "revision": "e" * 40}]})
    assert missing["failed"] and f"org/drafter at revision {'e' * 40}" in missing["msg"]
    assert "s3cr3t-hub-token" not in json.dumps(missing)
