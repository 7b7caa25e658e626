# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_release run as Ansible runs it: a subprocess reading its arguments from a JSON file."""

from __future__ import annotations

import json
import os

import pytest
from ansible_collections.vllm_ops.dflash.tests.helpers import module_runner

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


def run_module(tmp_path, check_mode=False, diff=False, **args):
    return module_runner.run_module("vllm_release", tmp_path, args, check_mode=check_mode, diff=diff, timeout=60)[0]


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "vllm"
    for commit, built_at in ((COMMIT_A, "2026-11-01T00:00:00Z"), (COMMIT_B, "2026-11-02T00:00:00Z")):
        release = root / "releases" / f"{commit[:12]}-00000000"
        (release / "venv").mkdir(parents=True)
        (release / "manifest.json").write_text(json.dumps({"schema": 1, "commit": commit, "built_at": built_at}))
    return root


def test_activate_then_again_is_idempotent(tmp_path, root):
    first = run_module(tmp_path, root=str(root), action="activate", release="aaaaaaa")
    assert first["changed"] is True
    assert first["current"] == "aaaaaaaaaaaa-00000000"
    assert os.readlink(root / "current") == "releases/aaaaaaaaaaaa-00000000"
    second = run_module(tmp_path, root=str(root), action="activate", release="aaaaaaa")
    assert second["changed"] is False
    assert [item["status"] for item in second["releases"]] == ["built", "active"]


def test_check_and_diff_mode(tmp_path, root):
    run_module(tmp_path, root=str(root), action="activate", release="aaaaaaaaaaaa-00000000")
    state_before = (root / "state.json").read_text()
    result = run_module(
        tmp_path,
        check_mode=True,
        diff=True,
        root=str(root),
        action="activate",
        release=str(root / "releases" / "bbbbbbbbbbbb-00000000"),
    )
    assert result["changed"] is True
    assert result["current"] == "bbbbbbbbbbbb-00000000"
    assert "current: aaaaaaaaaaaa-00000000" in result["diff"]["before"]
    assert "current: bbbbbbbbbbbb-00000000" in result["diff"]["after"]
    assert os.readlink(root / "current") == "releases/aaaaaaaaaaaa-00000000"
    assert (root / "state.json").read_text() == state_before


def test_mark_failed_then_rollback_with_nothing_left_fails_clearly(tmp_path, root):
    run_module(tmp_path, root=str(root), action="activate", release="aaaaaaaaaaaa-00000000")
    run_module(tmp_path, root=str(root), action="activate", release="bbbbbbbbbbbb-00000000")
    marked = run_module(tmp_path, root=str(root), action="mark_failed", reason="AL 1.17", details={"passed": False})
    assert marked["changed"] is True
    assert marked["current"] == "bbbbbbbbbbbb-00000000"
    back = run_module(tmp_path, root=str(root), action="rollback", reason="gate failed")
    assert (back["current"], back["previous"]) == ("aaaaaaaaaaaa-00000000", "bbbbbbbbbbbb-00000000")
    failed = run_module(tmp_path, root=str(root), action="rollback")
    assert failed["failed"] is True
    assert "nothing to roll back to" in failed["msg"]


def test_activate_requires_release(tmp_path, root):
    result = run_module(tmp_path, root=str(root), action="activate")
    assert result["failed"] is True
    assert "release" in result["msg"]


def test_corrupt_state_fails_with_the_fix(tmp_path, root):
    (root / "state.json").write_text("{")
    result = run_module(tmp_path, root=str(root), action="status")
    assert result["failed"] is True
    assert "state.json is not valid JSON" in result["msg"]
    assert "move it aside" in result["msg"]


def test_link_state_mismatch_is_a_warning(tmp_path, root):
    run_module(tmp_path, root=str(root), action="activate", release="aaaaaaaaaaaa-00000000")
    (root / "current").unlink()
    os.symlink("releases/bbbbbbbbbbbb-00000000", root / "current")
    result = run_module(tmp_path, root=str(root))
    assert result["current"] == "bbbbbbbbbbbb-00000000"
    assert "the link is what runs" in json.dumps(result["warnings"])  # ansible-core 2.19 structures warnings


def test_keep_files_through_the_argument_spec(tmp_path, root):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "t.env").write_text("VLLM_API_KEY=k\n")
    item = {"path": str(etc / "t.env"), "last_good": str(etc / "t.env.last-good"), "mode": "0600"}
    run_module(tmp_path, root=str(root), action="activate", release="aaaaaaa")
    result = run_module(tmp_path, diff=True, root=str(root), action="mark_good", keep_files=[item])
    assert result["changed"] is True
    assert result["kept"] == [{**{k: item[k] for k in ("path", "last_good")}, "changed": True}]
    assert (etc / "t.env.last-good").read_text() == "VLLM_API_KEY=k\n"
    assert os.stat(etc / "t.env.last-good").st_mode & 0o777 == 0o600
    assert [entry["status"] for entry in result["releases"]] == ["built", "good"]
    no_mode = run_module(tmp_path, root=str(root), action="keep", keep_files=[{**item, "mode": None}])
    assert no_mode["failed"] is True and "mode" in no_mode["msg"]
    bare = run_module(tmp_path, root=str(root), action="keep")
    assert bare["failed"] is True and "keep_files" in bare["msg"]


def run_info(tmp_path, **args):
    return module_runner.run_module("vllm_release_info", tmp_path, args, timeout=60)[0]


def test_release_info_reports_what_status_did_and_changes_nothing(tmp_path, root):
    run_module(tmp_path, root=str(root), action="activate", release="aaaaaaa")
    run_module(tmp_path, root=str(root), action="mark_good")
    state = (root / "state.json").read_text()
    info = run_info(tmp_path, root=str(root), release="bbbbbbb")
    assert info["changed"] is False
    assert (info["current"], info["last_good"], info["release"]) == (
        "aaaaaaaaaaaa-00000000",
        "aaaaaaaaaaaa-00000000",
        "bbbbbbbbbbbb-00000000",
    )
    assert [entry["status"] for entry in info["releases"]] == ["built", "good"]
    assert [entry["action"] for entry in info["history"]] == ["activate", "mark_good"]
    assert "pruned" not in info and "diff" not in info
    assert (root / "state.json").read_text() == state


def test_release_info_on_a_root_never_deployed_creates_nothing(tmp_path):
    root = tmp_path / "fresh"
    root.mkdir()
    info = run_info(tmp_path, root=str(root))
    assert (info["current"], info["releases"]) == (None, [])
    assert list(root.iterdir()) == []


def test_status_through_vllm_release_is_deprecated(tmp_path, root):
    result = run_module(tmp_path, root=str(root), action="status")
    assert "vllm_release_info" in json.dumps(result.get("deprecations", []))
    quiet = run_module(tmp_path, root=str(root), action="activate", release="aaaaaaa")
    assert not quiet.get("deprecations")


def test_prune_within_a_disk_budget_frees_the_oldest_cache_and_check_mode_only_predicts(tmp_path, root):
    run_module(tmp_path, root=str(root), action="activate", release="aaaaaaa")
    run_module(tmp_path, root=str(root), action="activate", release="bbbbbbb")
    cache = root / "cache" / "uv"
    cache.mkdir(parents=True)
    (cache / "old.whl").write_bytes(b"x" * 3 * 1024**2)
    args = {"root": str(root), "action": "prune", "disk_budget_gb": 1 / 1024}
    predicted = run_module(tmp_path, check_mode=True, **args)
    assert predicted["changed"] is True and (cache / "old.whl").is_file()
    done = run_module(tmp_path, **args)
    assert [item["path"] for item in done["disk"]["freed"]] == [str(cache)] == predicted_paths(predicted)
    assert done["disk"]["used_bytes_after"] <= done["disk"]["budget_bytes"] < done["disk"]["used_bytes_before"]
    assert not cache.exists() and (root / "releases" / "aaaaaaaaaaaa-00000000").is_dir()  # previous stays
    assert run_module(tmp_path, **args)["changed"] is False


def predicted_paths(result):
    return [item["path"] for item in result["disk"]["freed"]]


def test_a_disk_budget_goes_with_prune_only(tmp_path, root):
    result = run_module(tmp_path, root=str(root), action="activate", release="aaaaaaa", disk_budget_gb=10)
    assert result["failed"] is True and "goes with action=prune" in result["msg"]
    assert not (root / "current").exists()
