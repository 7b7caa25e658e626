"""vllm_drift as Ansible runs it: a subprocess reading its arguments from a JSON file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.tests.helpers import module_runner
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import make_tiny_repo


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("drift-module-repo") / "repo"
    return path, make_tiny_repo(path)


def run_module(tmp_path: Path, check_mode: bool = False, **args) -> dict:
    return module_runner.run_module("vllm_drift", tmp_path, args, check_mode=check_mode)[0]


def test_a_fresh_host_would_change_and_nothing_is_written(tiny, tmp_path):
    repo, shas = tiny
    root = tmp_path / "root"
    config = tmp_path / "default.yaml"
    args = {"repo": str(repo), "ref": "main", "root": str(root), "python": sys.executable}
    args["files"] = [{"path": str(config), "sha256": "0" * 64, "mode": "0644"}]
    for check_mode in (False, True):
        result = run_module(tmp_path, check_mode=check_mode, **args)
        assert (result["changed"], result["unchanged"], result["commit"]) == (False, False, shas["c3"])
        assert (result["current"], result["release_exists"]) == (None, False)
        assert result["files"] == [{"path": str(config), "changed": True, "reason": f"{config} does not exist"}]
        # auto: the name waits on the precompiled decision, which the look leaves to vllm_build
        assert result["release_name"] is None
        assert result["reasons"][0].startswith(f"the release of main is not built here: would build {shas['c3'][:12]}")
    assert not root.exists()


@pytest.mark.parametrize("precompiled", ["never", "always"])
def test_a_release_not_built_is_named_as_vllm_build_names_it_where_no_decision_is_needed(tiny, tmp_path, precompiled):
    repo = tiny[0]
    args = {"repo": str(repo), "ref": "main", "root": str(tmp_path / "root"), "python": sys.executable}
    args["precompiled"] = precompiled
    look = run_module(tmp_path, **args)
    predicted = module_runner.run_module("vllm_build", tmp_path, args, check_mode=True)[0]
    assert predicted["changed"] is True and predicted["release_name"]
    assert (look["release_exists"], look["release_name"]) == (False, predicted["release_name"])
    name = predicted["release_name"]
    assert look["reasons"][0] == f"{name} is not built here: would build {name}"


def test_an_unknown_ref_fails_like_the_deploy_would(tiny, tmp_path):
    repo = tiny[0]
    result = run_module(tmp_path, repo=str(repo), ref="no-such-branch", root=str(tmp_path / "root"))
    assert result["failed"] is True
    assert "no-such-branch" in result["msg"]


def test_a_token_in_the_repo_url_is_never_returned(tmp_path):
    url = "https://builder:s3cr3t-token@127.0.0.1:9/vllm.git"
    result = run_module(tmp_path, repo=url, ref="main", root=str(tmp_path / "root"), build_timeout=5)
    assert result["failed"] is True
    assert "s3cr3t-token" not in json.dumps(result)


def test_bad_file_expectations_are_refused_with_the_fix(tiny, tmp_path):
    repo = tiny[0]
    files = [{"path": "relative/default.yaml", "sha256": "0" * 64}]
    result = run_module(tmp_path, repo=str(repo), ref="main", root=str(tmp_path / "root"), files=files)
    assert result["failed"] is True
    assert "is not absolute" in result["msg"]


def test_a_render_record_needs_its_input_and_path(tiny, tmp_path):
    repo = tiny[0]
    files = [{"path": "/etc/vllm/default.yaml", "sha256": "0" * 64, "input_sha256": "1" * 64}]
    result = run_module(tmp_path, repo=str(repo), ref="main", root=str(tmp_path / "root"), files=files)
    assert result["failed"] is True
    assert "needs both input_sha256 and input_record" in result["msg"]


def test_templates_need_the_action_plugin(tiny, tmp_path):
    """Without the controller's render there is no sha256 to compare: refused, not taken as "no files"."""
    repo = tiny[0]
    templates = [{"role": "dflash_config", "src": "serve.env.j2", "path": "/etc/vllm/default.env"}]
    result = run_module(tmp_path, repo=str(repo), ref="main", root=str(tmp_path / "root"), templates=templates)
    assert result["failed"] is True
    assert "action plugin" in result["msg"]
