# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _releases
from ansible_collections.vllm_ops.dflash.plugins.module_utils._lock import host_lock
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import (
    ReleaseError,
    load_state,
    run_action,
    run_action_unlocked,
)


def make_release(root, name, commit, built_at, complete=True, wheel=True):
    path = root / "releases" / name
    (path / "venv" / "bin").mkdir(parents=True)
    (path / "venv" / "bin" / "python").write_text("#!/bin/sh\n")
    if complete:
        manifest = {"schema": 1, "name": name, "commit": commit, "built_at": built_at, "source": "build"}
        (path / "manifest.json").write_text(json.dumps(manifest))
    if wheel:
        (root / "wheels" / name).mkdir(parents=True)
        (root / "wheels" / name / "vllm-0.1.dev1-cp311-linux_x86_64.whl").write_bytes(b"PK" + name.encode())
    return path


def commit_of(index):
    return f"{index:x}" * 40 if index < 16 else hashlib.sha1(str(index).encode()).hexdigest()


def name_of(index):
    return f"{commit_of(index)[:12]}-{index:08x}"


@pytest.fixture
def host(tmp_path):
    """A root with releases R1..R4 built one after another (R4 newest), none activated yet."""
    root = tmp_path / "vllm"
    for index in range(1, 5):
        make_release(root, name_of(index), commit_of(index), f"2026-11-0{index}T00:00:00Z")
    return root


def snapshot(root):
    """Everything under root except the lock file's content (it holds the last holder's pid)."""
    tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in sorted(dirnames + filenames):
            path = os.path.join(dirpath, entry)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                tree[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                tree[rel] = ("dir",)
            elif entry == ".lock":
                tree[rel] = ("lock",)
            else:
                with open(path, "rb") as handle:
                    tree[rel] = ("file", hashlib.sha256(handle.read()).hexdigest())
    return tree


def statuses(result):
    return [(item["name"], item["status"]) for item in result["releases"]]


def state_of(root):
    return json.loads((root / "state.json").read_text())


def act(root, action, **kwargs):
    return run_action(str(root), action, lock_timeout=5, **kwargs)


def test_status_of_missing_root_is_empty_and_creates_nothing(tmp_path):
    root = tmp_path / "absent"
    result = act(root, "status")
    assert (result["current"], result["previous"], result["releases"], result["history"]) == (None, None, [], [])
    assert result["changed"] is False
    assert not root.exists()


def test_status_adopts_built_releases_without_writing(host):
    before = snapshot(host)
    result = act(host, "status")
    assert [item["name"] for item in result["releases"]] == [name_of(i) for i in (4, 3, 2, 1)]
    first = result["releases"][-1]
    assert first["status"] == "built"
    assert first["commit"] == commit_of(1)
    assert first["created_at"] == "2026-11-01T00:00:00Z"
    assert first["path"] == str(host / "releases" / name_of(1))
    assert result["changed"] is False
    assert snapshot(host) == before


def test_activate_swaps_a_relative_link_and_records_history(host):
    result = act(host, "activate", release=name_of(1))
    assert result["changed"] is True
    assert os.readlink(host / "current") == os.path.join("releases", name_of(1))
    assert (host / "current" / "manifest.json").is_file()
    assert [name for name in os.listdir(host) if name.startswith(".current")] == []
    state = state_of(host)
    assert state["current"] == name_of(1)
    assert state["previous"] is None
    assert state["releases"][name_of(1)]["status"] == "active"
    assert state["releases"][name_of(1)]["activated_at"]
    assert state["releases"][name_of(2)]["status"] == "built"  # adopted releases are persisted with the change
    assert [(item["action"], item["release"]) for item in state["history"]] == [("activate", name_of(1))]
    assert "from" not in state["history"][0]
    assert result["diff"]["before"].startswith("current: -\nprevious: -\n")
    assert result["diff"]["after"].startswith(f"current: {name_of(1)}\nprevious: -\n")

    second = act(host, "activate", release=name_of(2))
    assert (second["current"], second["previous"]) == (name_of(2), name_of(1))
    assert os.readlink(host / "current") == os.path.join("releases", name_of(2))
    assert state_of(host)["history"][-1] == {
        "at": state_of(host)["history"][-1]["at"],
        "action": "activate",
        "release": name_of(2),
        "from": name_of(1),
    }


def test_activate_current_again_changes_nothing(host):
    act(host, "activate", release=name_of(1))
    before = snapshot(host)
    result = act(host, "activate", release=name_of(1))
    assert result["changed"] is False
    assert result["diff"]["before"] == result["diff"]["after"]
    assert snapshot(host) == before


@pytest.mark.parametrize(
    "spec",
    [
        lambda root: str(root / "releases" / name_of(3)),
        lambda root: str(root / "releases" / name_of(3)) + "/",
        lambda root: name_of(3),
        lambda root: commit_of(3)[:7],
        lambda root: commit_of(3).upper(),
    ],
    ids=["path", "path-slash", "name", "commit-prefix", "full-commit-upper"],
)
def test_activate_resolves_path_name_and_commit(host, spec):
    assert act(host, "activate", release=spec(host))["current"] == name_of(3)


def test_activate_through_the_current_link_path(host):
    act(host, "activate", release=name_of(2))
    act(host, "activate", release=name_of(3))
    assert act(host, "activate", release=str(host / "current"))["changed"] is False


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope", "no release named 'nope'"),
        ("deadbeef", "no release matches commit prefix 'deadbeef'"),
        ("/etc", "is not a release directory directly under"),
        ("  ", "release is empty"),
    ],
)
def test_activate_rejects_unknown_releases(host, spec, message):
    with pytest.raises(ReleaseError, match=message):
        act(host, "activate", release=spec)
    assert not (host / "current").exists()


def test_activate_rejects_ambiguous_prefix(tmp_path):
    root = tmp_path / "vllm"
    make_release(root, "abcdef000000-00000001", "abcdef0000000000000000000000000000000001", "2026-11-01T00:00:00Z")
    make_release(root, "abcdef111111-00000002", "abcdef1111111111111111111111111111111112", "2026-11-02T00:00:00Z")
    with pytest.raises(ReleaseError, match=r"ambiguous .*abcdef000000-00000001, abcdef111111-00000002"):
        act(root, "activate", release="abcdef")
    assert act(root, "activate", release="abcdef1")["current"] == "abcdef111111-00000002"


def test_activate_rejects_incomplete_release(host):
    make_release(host, "0123456789ab-0000dead", "0" * 40, None, complete=False)
    with pytest.raises(ReleaseError, match=r"has no manifest.json: its build did not finish"):
        act(host, "activate", release="0123456789ab-0000dead")


def test_activate_rejects_corrupt_manifest(host):
    (host / "releases" / name_of(2) / "manifest.json").write_text("{broken")
    with pytest.raises(ReleaseError, match=r"not valid JSON.*rebuild the release"):
        act(host, "activate", release=name_of(2))


def test_activate_needs_a_release(host):
    with pytest.raises(ReleaseError, match="action=activate needs release"):
        act(host, "activate")


@pytest.mark.parametrize(
    ("action", "kwargs"),
    [
        ("activate", {"release": name_of(3)}),
        ("rollback", {}),
        ("prune", {"keep_releases": 0}),
        ("mark_good", {"details": {"mean_acceptance_length": 6.1}}),
        ("mark_failed", {"reason": "gate failed"}),
    ],
)
def test_check_mode_predicts_and_changes_nothing(host, action, kwargs):
    act(host, "activate", release=name_of(1))
    act(host, "activate", release=name_of(2))
    before = snapshot(host)
    predicted = act(host, action, check_mode=True, **kwargs)
    assert snapshot(host) == before
    assert predicted["changed"] is True
    assert predicted["diff"]["before"] != predicted["diff"]["after"]
    real = act(host, action, **kwargs)
    assert snapshot(host) != before
    for key in ("changed", "current", "previous", "pruned", "diff"):
        assert predicted[key] == real[key], key
    assert statuses(predicted) == statuses(real)


def test_check_mode_does_not_create_the_lock_file(host):
    act(host, "activate", release=name_of(1), check_mode=True)
    assert not (host / ".lock").exists()
    assert not (host / "state.json").exists()


def test_rollback_goes_to_previous_and_keeps_good_status(host):
    act(host, "activate", release=name_of(1))
    act(host, "mark_good", details={"mean_acceptance_length": 6.0})
    act(host, "activate", release=name_of(2))
    result = act(host, "rollback", reason="gate failed: mean acceptance length 1.17")
    assert (result["current"], result["previous"]) == (name_of(1), name_of(2))
    assert os.readlink(host / "current") == os.path.join("releases", name_of(1))
    state = state_of(host)
    assert state["releases"][name_of(1)]["status"] == "good"
    assert state["releases"][name_of(2)]["status"] == "active"  # rollback marks nothing failed by itself
    assert state["history"][-1]["action"] == "rollback"
    assert state["history"][-1]["from"] == name_of(2)
    assert state["history"][-1]["reason"] == "gate failed: mean acceptance length 1.17"


def test_rollback_skips_failed_and_missing_releases(host):
    for index in (1, 2, 3):
        act(host, "activate", release=name_of(index))
    act(host, "mark_failed", release=name_of(2), reason="gate: AL 1.17")
    act(host, "activate", release=name_of(4))
    shutil.rmtree(host / "releases" / name_of(3))
    # history newest first: R4 (current), R3 (gone), R2 (failed), R1
    assert act(host, "rollback")["current"] == name_of(1)


def test_rollback_twice_does_not_bounce_back_to_a_failed_release(host):
    act(host, "activate", release=name_of(1))
    act(host, "activate", release=name_of(2))
    act(host, "mark_failed", reason="gate failed")
    assert act(host, "rollback")["current"] == name_of(1)
    with pytest.raises(ReleaseError, match="nothing to roll back to"):
        act(host, "rollback")


def test_rollback_with_nothing_to_roll_back_to(host):
    with pytest.raises(ReleaseError, match=r"nothing to roll back to.*action=activate"):
        act(host, "rollback")
    act(host, "activate", release=name_of(1))
    with pytest.raises(ReleaseError, match=f"no release activated before {name_of(1)}"):
        act(host, "rollback")
    assert os.readlink(host / "current") == os.path.join("releases", name_of(1))


def test_rollback_to_an_explicit_release(host):
    act(host, "activate", release=name_of(1))
    act(host, "activate", release=name_of(2))
    result = act(host, "rollback", release=name_of(4))
    assert (result["current"], result["previous"]) == (name_of(4), name_of(2))
    assert act(host, "rollback", release=name_of(4))["changed"] is False


def test_mark_failed_keeps_current_and_is_idempotent(host):
    act(host, "activate", release=name_of(1))
    result = act(host, "mark_failed", reason="mean acceptance length 1.17 < 2.0", details={"passed": False})
    assert result["changed"] is True
    assert result["current"] == name_of(1)
    assert os.readlink(host / "current") == os.path.join("releases", name_of(1))
    entry = state_of(host)["releases"][name_of(1)]
    assert entry["status"] == "failed"
    assert entry["reason"] == "mean acceptance length 1.17 < 2.0"
    assert entry["gate"] == {"passed": False}
    assert state_of(host)["history"][-1]["reason"] == "mean acceptance length 1.17 < 2.0"
    before = snapshot(host)
    again = act(host, "mark_failed", reason="mean acceptance length 1.17 < 2.0")
    assert again["changed"] is False
    assert snapshot(host) == before


def test_mark_good_stores_gate_and_clears_failure_reason(host):
    act(host, "activate", release=name_of(1))
    act(host, "mark_failed", reason="flaky")
    result = act(host, "mark_good", release=commit_of(1)[:8], details={"mean_acceptance_length": 6.2})
    assert result["release"] == name_of(1)
    entry = state_of(host)["releases"][name_of(1)]
    assert entry["status"] == "good"
    assert entry["gate"] == {"mean_acceptance_length": 6.2}
    assert "reason" not in entry
    listed = {item["name"]: item for item in result["releases"]}
    assert listed[name_of(1)]["gate"] == {"mean_acceptance_length": 6.2}


def test_mark_without_current_needs_a_release(host):
    with pytest.raises(ReleaseError, match="no current release to mark"):
        act(host, "mark_good")


def test_prune_keeps_newest_current_and_previous(host):
    make_release(host, name_of(5), commit_of(5), "2026-11-05T00:00:00Z")
    act(host, "activate", release=name_of(1))
    act(host, "activate", release=name_of(2))
    (host / "releases" / (".prune-" + name_of(9) + "." + "0" * 32)).mkdir()  # an interrupted earlier prune
    result = act(host, "prune", keep_releases=1)
    assert result["pruned"] == [name_of(4), name_of(3)]
    assert sorted(os.listdir(host / "releases")) == sorted([name_of(5), name_of(2), name_of(1)])
    assert sorted(os.listdir(host / "wheels")) == sorted([name_of(5), name_of(2), name_of(1)])
    state = state_of(host)
    assert set(state["releases"]) == {name_of(5), name_of(2), name_of(1)}
    assert [item["release"] for item in state["history"] if item["action"] == "prune"] == [name_of(4), name_of(3)]
    assert (result["current"], result["previous"]) == (name_of(2), name_of(1))
    assert act(host, "prune", keep_releases=1)["changed"] is False


def test_prune_goes_by_the_recorded_order_when_the_clock_jumps_back(host):
    """Issue 28, case 18: after the wall clock jumped back, the newest build carried the oldest built_at, and
    prune removed it and kept a stale one."""
    act(host, "activate", release=name_of(1))  # state.json records R1..R4 (in that order)
    make_release(host, name_of(5), commit_of(5), "2026-10-01T00:00:00Z")  # built last, the clock a month back
    result = act(host, "prune", keep_releases=1)
    assert result["pruned"] == [name_of(4), name_of(3), name_of(2)]
    assert sorted(os.listdir(host / "releases")) == sorted([name_of(5), name_of(1)])
    assert [entry["name"] for entry in result["releases"]] == [name_of(5), name_of(1)]
    # recorded: a later prune still knows R5 came last, although its built_at says otherwise
    make_release(host, name_of(6), commit_of(6), "2026-09-01T00:00:00Z")
    assert act(host, "prune", keep_releases=1)["pruned"] == [name_of(5)]
    assert sorted(os.listdir(host / "releases")) == sorted([name_of(6), name_of(1)])


def test_prune_keeps_the_rollback_target_and_spends_no_place_on_failed_releases(host):
    act(host, "activate", release=name_of(1))
    act(host, "mark_good")
    for index in (2, 3):  # two failed bumps, each rolled back to R1
        act(host, "activate", release=name_of(index))
        act(host, "mark_failed", reason="gate failed")
        act(host, "activate", release=name_of(1))
    # current R1, previous R3 (failed); R4 is the newest and never failed
    result = act(host, "prune", keep_releases=1)
    assert result["pruned"] == [name_of(2)]
    assert sorted(os.listdir(host / "releases")) == sorted([name_of(1), name_of(3), name_of(4)])
    act(host, "activate", release=name_of(4))
    act(host, "activate", release=name_of(3))  # a third failed try, rolled back to R4
    act(host, "mark_failed", reason="gate failed")
    act(host, "activate", release=name_of(4))
    # current R4, previous R3 (failed): only R1 is left to roll back to, and it must survive keep=1
    result = act(host, "prune", keep_releases=1)
    assert name_of(1) not in result["pruned"]
    assert act(host, "rollback")["current"] == name_of(1)


def test_prune_zero_keeps_only_current_and_previous(host):
    act(host, "activate", release=name_of(4))
    act(host, "activate", release=name_of(1))
    act(host, "prune", keep_releases=0)
    assert sorted(os.listdir(host / "releases")) == sorted([name_of(4), name_of(1)])


def test_prune_removes_unfinished_builds_and_forgets_vanished_ones(host):
    act(host, "activate", release=name_of(4))
    make_release(host, "0123456789ab-0000dead", "0" * 40, None, complete=False)
    shutil.rmtree(host / "releases" / name_of(1))
    assert act(host, "status")["incomplete"] == ["0123456789ab-0000dead"]
    result = act(host, "prune", keep_releases=3)
    assert result["pruned"] == ["0123456789ab-0000dead"]
    assert result["incomplete"] == []
    assert result["forgotten"] == [name_of(1)]
    assert not (host / "releases" / "0123456789ab-0000dead").exists()
    assert not (host / "wheels" / "0123456789ab-0000dead").exists()
    assert not (host / "wheels" / name_of(1)).exists()
    assert name_of(1) not in state_of(host)["releases"]
    assert sorted(os.listdir(host / "releases")) == sorted(name_of(i) for i in (2, 3, 4))


def test_prune_never_removes_protected_releases(host):
    """A build holding the lock prunes with its new release protected, even an unfinished one."""
    make_release(host, "0123456789ab-0000b111", "0" * 40, None, complete=False)
    with host_lock(str(host), 5):
        result = run_action_unlocked(str(host), "prune", keep_releases=0, protect=[name_of(1), "0123456789ab-0000b111"])
    assert result["pruned"] == [name_of(4), name_of(3), name_of(2)]
    assert sorted(os.listdir(host / "releases")) == sorted([name_of(1), "0123456789ab-0000b111"])


def test_prune_of_only_debris_is_a_change(host):
    act(host, "activate", release=name_of(1))
    act(host, "prune", keep_releases=5)
    (host / "releases" / "0123456789ab-0000dead").mkdir()
    before = snapshot(host)
    assert act(host, "prune", keep_releases=5, check_mode=True)["changed"] is True
    assert snapshot(host) == before
    assert act(host, "prune", keep_releases=5)["changed"] is True
    assert not (host / "releases" / "0123456789ab-0000dead").exists()


def test_prune_rejects_negative_keep(host):
    with pytest.raises(ReleaseError, match="keep_releases must be 0 or more"):
        act(host, "prune", keep_releases=-1)


def test_rebuilt_release_starts_over_as_built(host):
    act(host, "activate", release=name_of(1))
    act(host, "activate", release=name_of(2))
    act(host, "mark_failed", release=name_of(1), reason="bad")
    manifest = host / "releases" / name_of(1) / "manifest.json"
    data = json.loads(manifest.read_text())
    data["built_at"] = "2026-12-01T00:00:00Z"
    manifest.write_text(json.dumps(data))
    listed = {item["name"]: item for item in act(host, "status")["releases"]}
    assert listed[name_of(1)]["status"] == "built"
    assert listed[name_of(1)]["reason"] is None


def test_missing_state_with_existing_link_is_rebuilt_from_disk(host):
    os.symlink(os.path.join("releases", name_of(3)), host / "current")
    result = act(host, "status")
    assert result["current"] == name_of(3)
    assert result["warnings"] == []
    assert act(host, "rollback", release=name_of(1))["previous"] == name_of(3)


def test_link_wins_over_a_stale_state(host):
    act(host, "activate", release=name_of(1))
    state = state_of(host)
    os.replace(host / "current", host / "old")
    os.symlink(os.path.join("releases", name_of(2)), host / "current")
    result = act(host, "status")
    assert result["current"] == name_of(2)
    assert any("state.json says the current release is" in warning for warning in result["warnings"])
    assert state_of(host) == state  # status writes nothing


def test_dangling_current_link_is_reported(host):
    act(host, "activate", release=name_of(1))
    shutil.rmtree(host / "releases" / name_of(1))
    result = act(host, "status")
    assert any("not a complete release" in warning for warning in result["warnings"])
    assert {item["name"]: item["path"] for item in result["releases"]}[name_of(1)] is None
    assert act(host, "rollback", release=name_of(2))["current"] == name_of(2)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON.*move it aside"),
        ('{"schema": 2, "releases": {}}', "schema 2 is not 1"),
        ("[]", "top level is not an object"),
        ('{"schema": 1, "releases": []}', "'releases' must be an object"),
    ],
)
def test_corrupt_state_is_a_clear_error(host, content, message):
    (host / "state.json").write_text(content)
    with pytest.raises(ReleaseError, match=message):
        act(host, "status")
    with pytest.raises(ReleaseError, match=message):
        load_state(str(host))


def test_current_that_is_not_a_link_is_refused(host):
    (host / "current").mkdir()
    with pytest.raises(ReleaseError, match="is not a symlink; move it aside"):
        act(host, "activate", release=name_of(1))


def test_root_reached_through_a_symlink(host, tmp_path):
    os.symlink(str(host / "releases" / name_of(2)), host / "current")  # absolute, as older tools wrote it
    alias = tmp_path / "alias"
    os.symlink(str(host), alias)
    assert act(alias, "status")["current"] == name_of(2)
    act(alias, "activate", release=name_of(3))
    assert os.readlink(host / "current") == os.path.join("releases", name_of(3))
    assert act(alias, "status")["previous"] == name_of(2)


def test_current_pointing_elsewhere_is_refused(host, tmp_path):
    os.symlink(str(tmp_path), host / "current")
    with pytest.raises(ReleaseError, match="not a directory directly under"):
        act(host, "status")


def test_failed_swap_leaves_current_and_no_temporary_link(host, monkeypatch):
    act(host, "activate", release=name_of(1))
    real_replace = os.replace

    def failing_replace(src, dst):
        if os.path.basename(dst) == "current":
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(_releases.os, "replace", failing_replace)
    with pytest.raises(ReleaseError, match=r"No space left.*still points to .*state.json says so again.*Fix:"):
        act(host, "activate", release=name_of(2))
    monkeypatch.undo()
    assert os.readlink(host / "current") == os.path.join("releases", name_of(1))
    assert sorted(os.listdir(host)) == [".lock", "current", "releases", "state.json", "wheels"]
    assert state_of(host)["current"] == name_of(1)


def test_a_full_disk_during_activation_moves_no_link(host, monkeypatch):
    """Issue 28, case 5: the link moved to the ungated release before state.json (which could not be
    written) recorded it, so `current` named B while state.json said A and the rescue read A."""
    act(host, "activate", release=name_of(1))
    before = state_of(host)

    def full_disk(path, data, mode=0o644):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_releases, "write_json_atomic", full_disk)
    with pytest.raises((ReleaseError, OSError)) as info:
        act(host, "activate", release=name_of(2))
    monkeypatch.undo()
    assert os.readlink(host / "current") == os.path.join("releases", name_of(1))
    assert state_of(host) == before
    message = str(info.value)
    assert info.type is ReleaseError and "No space left on device" in message
    assert f"still points to {name_of(1)}" in message and "Fix: free space" in message
    assert sorted(os.listdir(host)) == [".lock", "current", "releases", "state.json", "wheels"]


def test_swap_renames_a_relative_temporary_link_over_the_old_one(host, monkeypatch):
    act(host, "activate", release=name_of(1))
    seen = []
    real_replace = os.replace

    def spying_replace(src, dst):
        if os.path.basename(dst) == "current":
            # The old link is still in place at the moment of the rename: no instant without `current`.
            seen.append((os.readlink(src), os.readlink(dst), os.path.dirname(src) == os.path.dirname(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(_releases.os, "replace", spying_replace)
    act(host, "activate", release=name_of(2))
    assert seen == [(os.path.join("releases", name_of(2)), os.path.join("releases", name_of(1)), True)]


def test_lock_held_elsewhere_times_out_with_clear_message(host):
    act(host, "activate", release=name_of(1))
    holding, release_it = threading.Event(), threading.Event()

    def hold():
        with host_lock(str(host), 5):
            holding.set()
            release_it.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(5)
        with pytest.raises(ReleaseError, match="is held by process"):
            run_action(str(host), "activate", release=name_of(2), lock_timeout=0)
        with pytest.raises(ReleaseError, match="is held by"):
            run_action(str(host), "status", lock_timeout=0)  # readers wait for a swap in progress too
    finally:
        release_it.set()
        holder.join()
    assert run_action(str(host), "activate", release=name_of(2), lock_timeout=0)["current"] == name_of(2)


def test_run_action_unlocked_runs_inside_an_existing_lock(host):
    with host_lock(str(host), 5):
        result = run_action_unlocked(str(host), "activate", release=name_of(1))
    assert result["current"] == name_of(1)


def test_unknown_action(host):
    with pytest.raises(ReleaseError, match="unknown action 'deploy'"):
        act(host, "deploy")


def test_status_resolves_a_given_release(host):
    assert act(host, "status", release=commit_of(2)[:9])["release"] == name_of(2)


# ----------------------------------------------------------------------------------- issue 14 faults


def test_prune_leaves_a_symlinked_releases_dir_alone(host, tmp_path):
    """releases/ -> elsewhere: prune deleted unrelated directories there (no manifest = 'debris')."""
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(host / "releases"), str(elsewhere))
    (elsewhere / "photos").mkdir()
    (elsewhere / "0123456789ab-0000dead").mkdir()  # looks like debris, but in someone else's directory
    os.symlink(str(elsewhere), host / "releases")
    before = sorted(os.listdir(elsewhere))
    result = act(host, "prune", keep_releases=0)
    assert sorted(os.listdir(elsewhere)) == before
    assert result["pruned"] == [] and result["changed"] is False
    assert any("nothing pruned" in w and "is a symlink" in w and "Fix:" in w for w in result["warnings"])


def test_prune_leaves_a_symlinked_wheels_dir_alone(host, tmp_path):
    elsewhere = tmp_path / "wheels-elsewhere"
    shutil.move(str(host / "wheels"), str(elsewhere))
    os.symlink(str(elsewhere), host / "wheels")
    before = sorted(os.listdir(elsewhere))
    result = act(host, "prune", keep_releases=0)
    assert sorted(os.listdir(elsewhere)) == before and result["pruned"] == []


def test_prune_deletes_only_names_the_collection_makes(host):
    """A mount point's lost+found or an operator's directory under releases/ is not a release."""
    for name in ("lost+found", "notes", "0123456789AB-0000DEAD", "0123456789ab-0000dead-old"):
        (host / "releases" / name).mkdir()
    (host / "releases" / "notes" / "manifest.json").write_text('{"commit": "' + "a" * 40 + '"}')
    (host / "releases" / "0123456789ab-0000dead").mkdir()  # ours: debris of an interrupted build
    (host / "releases" / ".half-copied").mkdir()  # hidden, not a prune's leftover
    result = act(host, "prune", keep_releases=0)
    left = set(os.listdir(host / "releases"))
    assert {"lost+found", "notes", "0123456789AB-0000DEAD", "0123456789ab-0000dead-old", ".half-copied"} <= left
    assert "0123456789ab-0000dead" not in left and "0123456789ab-0000dead" in result["pruned"]
    assert "notes" not in {item["name"] for item in result["releases"]}  # never adopted
    assert any("left alone" in w and "lost+found" in w and "notes" in w for w in result["warnings"])


def test_a_forgotten_name_from_state_json_deletes_nothing_outside(host, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    state = {"schema": 1, "current": None, "previous": None, "releases": {"../../victim": {"status": "built"}}}
    (host / "state.json").write_text(json.dumps(state))
    result = act(host, "prune", keep_releases=3)
    assert "../../victim" in result["forgotten"] and victim.is_dir()


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        ({"current": 7}, "'current' is 7, not a release name or null"),
        ({"previous": ["x"]}, "'previous' is ['x'], not a release name or null"),
        ({"releases": {"@": {"status": "great"}}}, "status 'great', not one of built, active, good, failed"),
        ({"releases": {"@": {"status": "good", "created_at": 20261101}}}, "created_at 20261101, not a string"),
        ({"releases": {"@": {"status": "good", "gate": "passed"}}}, "gate 'passed', not an object or null"),
        ({"history": [{"action": "activate", "release": 3}]}, "history[0] has release 3, not a string or null"),
    ],
    ids=["current", "previous", "status", "created_at", "gate", "history"],
)
def test_state_with_wrong_value_types_is_refused_before_any_change(host, state, problem):
    act(host, "activate", release=name_of(1))
    data = state_of(host)
    for key, value in state.items():
        if key == "releases":
            data["releases"].update({name_of(1) if k == "@" else k: v for k, v in value.items()})
        else:
            data[key] = value
    (host / "state.json").write_text(json.dumps(data))
    before = snapshot(host)
    for action, kwargs in (("activate", {"release": name_of(2)}), ("rollback", {}), ("prune", {"keep_releases": 0})):
        with pytest.raises(ReleaseError) as error:
            act(host, action, **kwargs)
        assert problem in str(error.value) and "fix it or move it aside" in str(error.value)
        assert snapshot(host) == before  # current not swapped, state.json not rewritten, nothing removed


def test_status_works_on_a_full_disk(host, monkeypatch):
    act(host, "activate", release=name_of(1))  # the lock file exists from now on

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", no_space)
    monkeypatch.setattr(os, "ftruncate", no_space)
    assert run_action(str(host), "status")["current"] == name_of(1)


def test_last_good_is_the_release_that_served_last_with_a_passed_gate(host):
    assert act(host, "status")["last_good"] is None
    act(host, "activate", release=name_of(1))
    assert act(host, "status")["last_good"] is None  # active, never gated
    act(host, "mark_good", release=name_of(1))
    act(host, "activate", release=name_of(2))  # a rollout that died before its gate
    result = act(host, "status")
    assert (result["current"], result["last_good"]) == (name_of(2), name_of(1))
    act(host, "mark_failed", release=name_of(2))
    assert act(host, "status")["last_good"] == name_of(1)
    act(host, "mark_good", release=name_of(2))
    assert act(host, "status")["last_good"] == name_of(2)
    act(host, "activate", release=name_of(3))
    shutil.rmtree(host / "releases" / name_of(2))  # gone: not a target any more
    assert act(host, "status")["last_good"] == name_of(1)


def test_the_rescue_swap_keeps_the_last_good_release_good(host):
    """dflash_gate's rollback swaps with action=rollback: activate would make the target `active`, and the
    next failed rollout would then go back past it."""
    act(host, "activate", release=name_of(1))
    act(host, "mark_good", release=name_of(1))
    act(host, "activate", release=name_of(2))
    back = act(host, "rollback", release=name_of(1))
    assert dict(statuses(back))[name_of(1)] == "good" and back["last_good"] == name_of(1)
    act(host, "activate", release=name_of(3))
    assert act(host, "status")["last_good"] == name_of(1)
    rollback = Path(__file__).resolve().parents[4] / "roles/dflash_rollback/tasks/main.yml"
    (wrapper,) = yaml.safe_load(rollback.read_text())  # the file's one block (its tags and module_defaults)
    tasks = wrapper["block"]
    block = next(t for t in tasks if t.get("name") == "Roll back to the last good release")["block"]
    swap = next(t for t in block if t["name"] == "Swap current back")["vllm_ops.dflash.vllm_release"]
    assert swap["action"] == "rollback"


# ---- keep_files: the last good copies kept in the same run as the verdict (issue 15 item 7) ----------


@pytest.fixture
def served(tmp_path):
    """What a release serves with: config, env file (secrets) and unit, and the keep_files for them."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "t.yaml").write_text("port: 8000\n")
    (etc / "t.env").write_text("VLLM_API_KEY=secret-do-not-show\n")
    (etc / "vllm-t.service").write_text("[Service]\n")
    files = [
        {"path": str(etc / "t.yaml"), "last_good": str(etc / "t.yaml.last-good"), "mode": "0644"},
        {"path": str(etc / "t.env"), "last_good": str(etc / "t.env.last-good"), "mode": "0600"},
        {
            "path": str(etc / "vllm-t.service"),
            "last_good": str(etc / "vllm-t.service.last-good"),
            "mode": "0644",
            "optional": True,
        },
    ]
    return etc, files


def mode_of(path):
    return os.stat(path).st_mode & 0o777


def test_mark_good_keeps_the_copies_with_their_modes_after_the_mark(host, served, monkeypatch):
    files = served[1]
    act(host, "activate", release=name_of(1))
    os.umask(0o000)  # the copies' modes do not depend on the umask
    order = []
    real_replace = _releases.os.replace

    def replace(src, dst):  # the mode each file has at the moment it appears under its name
        order.append((os.path.basename(dst), mode_of(src)))
        return real_replace(src, dst)

    monkeypatch.setattr(_releases.os, "replace", replace)
    try:
        result = act(host, "mark_good", details={"mean_acceptance_length": 3.2}, keep_files=files)
    finally:
        os.umask(0o022)
    assert result["changed"] is True
    assert dict(statuses(result))[name_of(1)] == "good"
    assert [(item["last_good"], item["changed"]) for item in result["kept"]] == [
        (item["last_good"], True) for item in files
    ]
    for item in files:
        assert Path(item["last_good"]).read_bytes() == Path(item["path"]).read_bytes()
        assert mode_of(item["last_good"]) == int(item["mode"], 8)
    assert order[0][0] == "state.json", "the copies are kept only once the verdict is written"
    assert ("t.env.last-good", 0o600) in order and all(mode in (0o600, 0o644) for _name, mode in order)
    again = act(host, "mark_good", details={"mean_acceptance_length": 3.2}, keep_files=files)
    assert again["changed"] is False and not any(item["changed"] for item in again["kept"])


def test_a_copy_with_another_content_or_mode_is_replaced(host, served):
    etc, files = served
    act(host, "keep", keep_files=files)
    (etc / "t.yaml").write_text("port: 9000\n")
    os.chmod(etc / "t.env.last-good", 0o644)
    result = act(host, "keep", keep_files=files)
    assert [item["changed"] for item in result["kept"]] == [True, True, False]
    assert (etc / "t.yaml.last-good").read_text() == "port: 9000\n"
    assert mode_of(etc / "t.env.last-good") == 0o600


def test_keep_marks_nothing_and_leaves_state_json_alone(host, served):
    etc, files = served
    act(host, "activate", release=name_of(1))
    state = (host / "state.json").read_bytes()
    result = act(host, "keep", keep_files=files)
    assert result["changed"] is True and dict(statuses(result))[name_of(1)] == "active"
    assert (host / "state.json").read_bytes() == state
    assert (etc / "t.env.last-good").read_text() == (etc / "t.env").read_text()


def test_a_missing_file_fails_before_anything_is_written(host, served):
    etc, files = served
    act(host, "activate", release=name_of(1))
    (etc / "t.env").unlink()
    before = snapshot(host), sorted(os.listdir(etc))
    with pytest.raises(ReleaseError, match=r"cannot keep .*t\.env as the last good copy: it does not exist"):
        act(host, "mark_good", keep_files=files)
    assert (snapshot(host), sorted(os.listdir(etc))) == before
    assert dict(statuses(act(host, "status")))[name_of(1)] == "active", "marked good without its copies"


def test_a_missing_optional_file_leaves_its_earlier_copy(host, served):
    etc, files = served
    act(host, "keep", keep_files=files)
    (etc / "vllm-t.service").unlink()
    (etc / "t.yaml").write_text("port: 9000\n")
    result = act(host, "keep", keep_files=files)
    assert [item["path"] for item in result["kept"]] == [files[0]["path"], files[1]["path"]]
    assert (etc / "vllm-t.service.last-good").read_text() == "[Service]\n"


def test_keep_files_in_check_and_diff_mode(host, served):
    etc, files = served
    act(host, "activate", release=name_of(1))
    act(host, "keep", keep_files=files)
    (etc / "t.env").write_text("VLLM_API_KEY=new-secret\n")
    before = snapshot(host), {name: (etc / name).read_bytes() for name in os.listdir(etc)}
    predicted = act(host, "mark_good", keep_files=files, check_mode=True)
    assert (snapshot(host), {name: (etc / name).read_bytes() for name in os.listdir(etc)}) == before
    assert [item["changed"] for item in predicted["kept"]] == [False, True, False]
    diff = predicted["diff"]
    assert f"{files[1]['last_good']}: differs from {files[1]['path']} (0600)" in diff["before"]
    assert f"{files[1]['last_good']}: same as {files[1]['path']} (0600)" in diff["after"]
    assert "secret" not in diff["before"] + diff["after"]
    real = act(host, "mark_good", keep_files=files)
    for key in ("changed", "kept", "diff"):
        assert predicted[key] == real[key], key


@pytest.mark.parametrize(
    ("action", "kwargs", "message"),
    [
        ("activate", {"release": name_of(1)}, "keep_files goes with action=mark_good or action=keep"),
        ("mark_failed", {}, "keep_files goes with action=mark_good or action=keep"),
        ("keep", {"keep_files": []}, "action=keep needs keep_files"),
        ("keep", {"keep_files": [{"path": "/x", "last_good": "/y", "mode": "rw-r--r--"}]}, "not an octal mode"),
    ],
)
def test_keep_files_refused_where_it_does_not_belong(host, served, action, kwargs, message):
    files = served[1]
    act(host, "activate", release=name_of(1))
    kwargs.setdefault("keep_files", files)
    with pytest.raises(ReleaseError, match=message):
        act(host, action, **kwargs)
