# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The disk budget on real temporary trees: bytes (each inode once), what may go, oldest first."""

from __future__ import annotations

import json
import os

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._disk_budget import (
    GIB,
    NEED_FACTOR,
    BudgetError,
    Usage,
    apply,
    plan,
    prune_within,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import load_state, run_action

MIB = 1024**2


def name_of(index):
    return f"{index:x}" * 12 + f"-{index:08x}"


def blob(path, mib, mtime=None):
    """A file of `mib` MiB of real blocks (random-free but non-sparse) at `path`, with that mtime."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * int(mib * MIB))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
        os.utime(path.parent, (mtime, mtime))
    return path


def release(root, index, mib=1, mtime=None, wheel_mib=0):
    name = name_of(index)
    path = root / "releases" / name
    blob(path / "venv" / "lib" / "big.so", mib, mtime)
    manifest = {"schema": 1, "name": name, "commit": f"{index:x}" * 40, "built_at": f"2026-11-{index:02d}T00:00:00Z"}
    (path / "manifest.json").write_text(json.dumps(manifest))
    if wheel_mib:
        blob(root / "wheels" / name / "vllm-0.1-py3-none-any.whl", wheel_mib, mtime)
    if mtime is not None:
        for item in (path / "manifest.json", path / "venv", path):
            os.utime(item, (mtime, mtime))
    return name


def gb(mib):
    return mib * MIB / GIB


def freed_paths(disk):
    return [os.path.basename(item["path"]) for item in disk["freed"]]


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "vllm"
    root.mkdir()
    return root


def test_hard_links_count_once_and_a_shared_cache_frees_only_what_no_release_links(root):
    cache = blob(root / "cache" / "uv" / "archive-v0" / "torch.so", 8)
    blob(root / "cache" / "uv" / "archive-v0" / "unused.so", 2)
    name = release(root, 1, mib=1)
    os.link(cache, root / "releases" / name / "venv" / "lib" / "torch.so")
    run_action(str(root), "activate", release=name)
    usage = Usage(str(root))
    # 8 + 2 + 1 MiB of file blocks (the linked 8 once), plus small directories and files.
    assert 11 * MIB <= usage.used < 11 * MIB + 200 * 1024
    (uv,) = [part for part in usage.parts if part.kind == "uv_cache"]
    assert uv.size >= 10 * MIB  # it holds both files
    budget = plan(str(root), gb(usage.used / MIB) - gb(1), need=0)
    assert [(item["kind"], item["bytes"] // MIB) for item in budget.result()["freed"]] == [("uv_cache", 2)]


def test_a_symlink_out_of_the_root_is_neither_followed_nor_freed(root, tmp_path):
    outside = blob(tmp_path / "elsewhere" / "data.bin", 5)
    blob(root / "cache" / "ccache" / "a.o", 1)
    os.symlink(outside.parent, root / "cache" / "ccache" / "elsewhere")
    os.symlink(outside.parent, root / "cache" / "pip")  # a linked part itself is no part
    usage = Usage(str(root))
    assert usage.used < 2 * MIB
    assert [part.kind for part in usage.parts] == ["compile_cache"]
    disk = apply(plan(str(root), gb(0.5), need=0), 3, "the root", check_mode=False)
    assert freed_paths(disk) == ["ccache"]
    assert outside.read_bytes() == b"x" * 5 * MIB and (root / "cache" / "pip").is_symlink()


def test_serving_last_good_and_rollback_releases_are_kept_and_the_rest_go_oldest_first(root):
    now = 1_800_000_000
    names = [release(root, index, mib=2, mtime=now + index * 100) for index in range(1, 6)]
    for name in names[:3]:
        run_action(str(root), "activate", release=name)
    run_action(str(root), "mark_good", release=names[1])
    run_action(str(root), "mark_failed", release=names[2])
    # current = 3 (failed), previous = 2 = last good = rollback target; 1, 4, 5 may go, 1 oldest.
    blob(root / "cache" / "sccache" / "x.o", 2, mtime=now + 250)
    with pytest.raises(BudgetError) as failure:
        plan(str(root), gb(1), need=0).check("the root")
    message = str(failure.value)
    assert "disk_budget_gb" in message and "Nothing was changed" in message
    assert all((root / "releases" / name).is_dir() for name in names)
    disk = apply(plan(str(root), gb(8.5), need=0), 3, "the root", check_mode=False)
    assert freed_paths(disk) == [names[0], "sccache"]
    assert disk["used_bytes_after"] <= disk["budget_bytes"] < disk["used_bytes_before"]
    assert sorted(disk["kept"]) == sorted(names[1:3])
    left = sorted(os.listdir(root / "releases"))
    assert left == sorted(names[1:])
    assert names[0] not in load_state(str(root))["releases"]
    # However small the budget, never below the kept releases: it fails, freeing nothing.
    with pytest.raises(BudgetError, match=names[1]):
        apply(plan(str(root), gb(2), need=0), 3, "the root", check_mode=False)
    assert sorted(os.listdir(root / "releases")) == left


def test_check_mode_predicts_and_frees_nothing(root):
    blob(root / "src" / "vllm.git" / "objects" / "pack.pack", 3, mtime=1_700_000_000)
    blob(root / "cache" / "uv" / "w.whl", 1, mtime=1_800_000_000)
    disk = apply(plan(str(root), gb(2), need=0), 3, "the root", check_mode=True)
    assert freed_paths(disk) == ["vllm.git"]
    assert disk["freed"][0]["bytes"] >= 3 * MIB
    assert (root / "src" / "vllm.git" / "objects" / "pack.pack").is_file()


def test_a_build_needs_the_newest_release_times_the_factor_and_protects_its_mirror(root):
    name = release(root, 1, mib=4)
    run_action(str(root), "activate", release=name)
    blob(root / "src" / "vllm.git" / "pack", 3, mtime=1_700_000_000)
    blob(root / "cache" / "uv" / "w.whl", 3, mtime=1_800_000_000)
    budget = plan(str(root), gb(16), paths=[str(root / "src" / "vllm.git")])
    assert budget.reference == name and budget.need >= int(4 * MIB * NEED_FACTOR)
    assert freed_paths(budget.result()) == ["uv"]  # the mirror is older but the build reads it
    with pytest.raises(BudgetError, match=r"raise disk_budget_gb") as failure:
        plan(str(root), gb(10), paths=[str(root / "src" / "vllm.git")]).check("the build")
    assert str(root / "src" / "vllm.git") in str(failure.value)  # named among the biggest parts


def test_the_prune_within_a_budget_goes_beyond_keep_and_reports_it(root):
    names = [release(root, index, mib=2, mtime=1_800_000_000 + index) for index in range(1, 5)]
    run_action(str(root), "activate", release=names[3])
    predicted = prune_within(str(root), 3, gb(5), check_mode=True)
    assert predicted["pruned"] == names[:2] and predicted["changed"]
    assert sorted(os.listdir(root / "releases")) == names
    done = prune_within(str(root), 3, gb(5))
    assert done["pruned"] == names[:2]
    assert freed_paths(done["disk"]) == names[:2]
    assert sorted(os.listdir(root / "releases")) == names[2:]
    assert done["disk"]["used_bytes_after"] == pytest.approx(Usage(str(root)).used, abs=64 * 1024)


def test_a_killed_builds_debris_goes_first_and_only_when_over(root):
    blob(root / "cache" / "uv" / "w.whl", 2, mtime=1_600_000_000)  # older than the debris
    blob(root / "build" / name_of(9) / "tmp" / "torch.whl", 2, mtime=1_900_000_000)
    assert plan(str(root), gb(8), need=0).result()["freed"] == []
    disk = apply(plan(str(root), gb(3), need=0), 3, "the root", check_mode=False)
    assert [item["kind"] for item in disk["freed"]] == ["build_debris"]
    assert not (root / "build" / name_of(9)).exists() and (root / "cache" / "uv" / "w.whl").is_file()


def test_a_failed_release_the_prune_removes_along_is_reported_freed(root):
    names = [release(root, index, mib=2, mtime=1_800_000_000 + index) for index in range(1, 4)]
    run_action(str(root), "activate", release=names[2])
    run_action(str(root), "mark_failed", release=names[1])
    # Over by 1 MiB: the oldest (names[0]) is dropped; the prune takes the failed names[1] along.
    disk = apply(plan(str(root), gb(5), need=0), 3, "the root", check_mode=False)
    assert freed_paths(disk) == [names[0], names[1]]
    assert os.listdir(root / "releases") == [names[2]]
    assert disk["used_bytes_after"] == pytest.approx(Usage(str(root)).used, abs=64 * 1024)


def test_after_a_build_the_oldest_go_but_never_the_release_made(root):
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_budget import (
        fit_after_build,
        fit_before_build,
    )
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._build_options import BuildOptions

    old = release(root, 1, mib=2, mtime=1_700_000_000)
    run_action(str(root), "activate", release=old)
    opts = BuildOptions("https://example.invalid/vllm.git", "main", root=str(root), disk_budget_gb=gb(5.5))
    before = fit_before_build(opts, name_of(2), check_mode=False)  # 2 MiB + 3 MiB need: fits as is
    assert before is not None and before["freed"] == [] and before["need_bytes"] >= 3 * MIB
    made = release(root, 2, mib=4, mtime=1_600_000_000)  # the oldest file times, yet just made
    blob(root / "cache" / "uv" / "w.whl", 1, mtime=1_650_000_000)
    after = fit_after_build(opts, made, before)
    # Over by ~2 MiB: the uv cache goes, then the serving release is kept, the one made too: it cannot fit.
    assert after is not None and freed_paths(after) == ["uv"] and after["fits"] is False
    assert after["used_bytes_before"] == before["used_bytes_before"]
    assert sorted(os.listdir(root / "releases")) == sorted([old, made])
    assert fit_after_build(BuildOptions("r", "main", root=str(root)), made, None) is None
