# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_facts run as Ansible runs it: a subprocess reading its arguments from a JSON file."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.tests.helpers import module_runner

TESTS = Path(__file__).resolve().parents[1]
# The fake vllm venv builders live with the core's tests.
_spec = importlib.util.spec_from_file_location("facts_helpers", TESTS / "module_utils" / "test_facts.py")
assert _spec is not None and _spec.loader is not None
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)


def run_module(tmp_path, check_mode=False, **args):
    return module_runner.run_module("vllm_facts", tmp_path, args, check_mode=check_mode)[0]


@pytest.fixture(scope="module")
def builder(tmp_path_factory):
    return helpers.ExtensionBuilder(tmp_path_factory.mktemp("extensions"))


@pytest.fixture
def root(tmp_path, builder):
    root = tmp_path / "opt-vllm"
    venv = helpers.make_release(root, manifest={"schema": 1, "commit": helpers.COMMIT})
    helpers.install_fake_vllm(venv, builder, direct_url=helpers.vcs_direct_url())
    return root


@pytest.mark.parametrize("check_mode", [False, True])
def test_facts_of_the_current_release(tmp_path, root, check_mode):
    result = run_module(
        tmp_path,
        check_mode=check_mode,
        root=str(root),
        probes=[
            {"name": "sliding", "path": "model_executor/models/qwen3_dflash.py", "pattern": "_resolve_layer_attention"}
        ],
    )
    assert result["changed"] is False
    facts = result["ansible_facts"]["vllm"]
    assert facts["commit"] == helpers.COMMIT
    assert facts["version_info"]["commit_prefix"] == "3cfc8f8b7"
    assert facts["extensions"]["vllm._C"]["ok"] is True
    assert facts["missing_extensions"] == []
    assert facts["broken_extensions"] == ["vllm.cumem_allocator"]  # reported, not a failure
    assert facts["probes"] == {"sliding": True}
    assert facts["release"] == os.path.realpath(root / "current")


def test_probe_without_pattern_is_rejected_by_the_argument_spec(tmp_path, root):
    result = run_module(tmp_path, root=str(root), probes=[{"name": "x", "path": "a.py"}])
    assert result["failed"] is True
    assert "pattern" in result["msg"]


def test_invalid_pattern_fails_clearly(tmp_path, root):
    result = run_module(tmp_path, root=str(root), probes=[{"name": "x", "path": "a.py", "pattern": "[unclosed"}])
    assert result["failed"] is True
    assert "probe 'x': pattern '[unclosed' is not a valid regular expression" in result["msg"]


def test_no_release_fails_with_the_fix(tmp_path):
    result = run_module(tmp_path, root=str(tmp_path / "nothing"))
    assert result["failed"] is True
    assert result["msg"].startswith(f"{tmp_path / 'nothing' / 'current' / 'venv'} does not exist")
    assert "vllm_build" in result["msg"]


@pytest.mark.slow
@pytest.mark.parametrize("check_mode", [True, False])
def test_capabilities_are_returned_and_cached_outside_check_mode(tmp_path, check_mode):
    root = tmp_path / "opt-vllm"
    helpers.engine_release(root)
    result = run_module(tmp_path, check_mode=check_mode, root=str(root), capabilities_timeout=120)
    facts = result["ansible_facts"]["vllm"]
    # the cache write is the module's one change: outside check mode only
    assert (result["changed"], facts["capabilities_source"]) == (not check_mode, "vllm")
    assert "DFlashDraftModel" in facts["capabilities"]["registered_architectures"]
    cache = root / "current" / "capabilities.json"
    assert cache.exists() is not check_mode
    again = run_module(tmp_path, root=str(root), capabilities=False)["ansible_facts"]["vllm"]
    assert (again["capabilities"], again["capabilities_source"]) == (None, "unavailable")
