"""The build core against a real git repo and real pip builds (shared via session fixtures)."""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils import _build, _build_decision, _builder, _wheel_overlay
from ansible_collections.vllm_ops.dflash.plugins.module_utils._build import (
    BuildError,
    BuildOptions,
    build,
    inputs_hash,
    prune_after_build,
    release_name,
)
from ansible_collections.vllm_ops.dflash.plugins.module_utils._common import read_json, sha256_file, write_json_atomic
from ansible_collections.vllm_ops.dflash.plugins.module_utils._deadline import Deadline
from ansible_collections.vllm_ops.dflash.plugins.module_utils._git import ensure_mirror, mirror_path
from ansible_collections.vllm_ops.dflash.tests.helpers.tiny_repo import (
    add_commit,
    installed_version,
    make_tiny_repo,
    process_alive,
    uv_bin_dir,
)

# Tests that run real pip/uv builds (`-m "not slow_build"` leaves them out).
SLOW = pytest.mark.slow_build
# ref -> label of the commit it must build; the short SHA is filled in from the repo.
REFS = {"main": "c3", "v1.0.0": "c1", "short": "c2", "refs/pull/1/head": "p1"}


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("build-repo") / "repo"
    return path, make_tiny_repo(path)


def options(tiny, root, ref, pip_args, **kwargs) -> BuildOptions:
    kwargs.setdefault("keep_releases", 10)
    return BuildOptions(str(tiny[0]), ref, root=str(root), python=sys.executable, pip_args=pip_args, **kwargs)


def ref_of(tiny, key: str) -> str:
    return tiny[1]["c2"][:7] if key == "short" else key


@pytest.fixture(scope="session")
def fleet(tiny, pip_args, tmp_path_factory):
    """One root with a release built from each kind of ref."""
    root = tmp_path_factory.mktemp("fleet") / "opt-vllm"
    results = {key: build(options(tiny, root, ref_of(tiny, key), pip_args)) for key in REFS}
    return root, results


@SLOW
@pytest.mark.parametrize("key", list(REFS))
def test_each_kind_of_ref_builds_its_commit(tiny, fleet, key):
    shas = tiny[1]
    root, results = fleet
    result = results[key]
    commit = shas[REFS[key]]
    assert (result["changed"], result["built"], result["commit"]) == (True, True, commit)
    assert result["release_name"] == f"{commit[:12]}-{result['inputs_hash'][:8]}"
    release = Path(result["release"])
    assert release == root / "releases" / result["release_name"]

    version = installed_version(str(release / "venv"))
    if key == "v1.0.0":
        assert version == "1.0.0"
    else:  # setuptools-scm: <next>.devN+g<abbrev sha> from the full history
        local = re.fullmatch(r"[\d.]+\.dev\d+\+g([0-9a-f]{7,})", version)
        assert local and commit.startswith(local.group(1)), version

    manifest = json.loads((release / "manifest.json").read_text())
    assert manifest["schema"] == 1
    assert (manifest["commit"], manifest["requested_ref"], manifest["source"]) == (commit, ref_of(tiny, key), "build")
    assert manifest["inputs_hash"] == result["inputs_hash"] == inputs_hash(manifest["inputs"])
    assert manifest["version"] == version
    assert manifest["wheel"] == {"path": result["wheel"], "sha256": result["wheel_sha256"]}
    assert sha256_file(result["wheel"]) == result["wheel_sha256"]
    assert Path(result["wheel"]).parent == root / "wheels" / result["release_name"]
    assert Path(result["log_path"]).is_file() and manifest["log_path"] == result["log_path"]
    assert not (root / "build" / result["release_name"]).exists()
    assert not (root / "current").exists()


@SLOW
def test_rerun_is_a_no_op_without_any_build_step(tiny, fleet, pip_args, monkeypatch):
    root, results = fleet

    def no_build(*args, **kwargs):
        raise AssertionError("a re-run must not start a build")

    monkeypatch.setattr(_builder, "Builder", no_build)  # imported where a build starts
    monkeypatch.setattr(_build, "ensure_mirror", no_build)
    monkeypatch.setattr(_build_decision, "ensure_mirror", no_build)
    logs = sorted(os.listdir(root / "logs"))
    for key, first in results.items():
        manifest = Path(first["release"], "manifest.json")
        stamp = manifest.stat().st_mtime_ns
        again = build(options(tiny, root, ref_of(tiny, key), pip_args))
        assert (again["changed"], again["built"]) == (False, False)
        for field in ("commit", "release", "release_name", "wheel", "wheel_sha256", "log_path", "inputs_hash"):
            assert again[field] == first[field], field
        assert manifest.stat().st_mtime_ns == stamp
    assert sorted(os.listdir(root / "logs")) == logs


@SLOW
def test_check_mode_on_a_built_root_reports_no_change(tiny, fleet, pip_args):
    root, results = fleet
    result = build(options(tiny, root, "main", pip_args), check_mode=True)
    assert (result["changed"], result["release_name"]) == (False, results["main"]["release_name"])


@SLOW
def test_branch_bump_builds_exactly_one_new_release(tiny, fleet, pip_args):
    repo = tiny[0]
    root, results = fleet
    # A new branch name on an already built commit is the same release.
    same = build(options(tiny, root, "bump", pip_args))
    assert (same["changed"], same["release_name"]) == (False, results["main"]["release_name"])

    before = set(os.listdir(root / "releases"))
    mirror = Path(mirror_path(str(root), str(repo)))
    (mirror / "vllm-ops-test-marker").write_text("the mirror of the first build")
    bumped = add_commit(repo, "bump", "bumped")
    result = build(options(tiny, root, "bump", pip_args))
    assert (result["changed"], result["built"], result["commit"]) == (True, True, bumped)
    assert set(os.listdir(root / "releases")) - before == {result["release_name"]}
    assert installed_version(os.path.join(result["release"], "venv")).endswith("+g" + bumped[:9])
    assert build(options(tiny, root, "bump", pip_args))["changed"] is False
    # The bump fetched into the existing mirror: no new clone (the marker survived), no `git init`.
    assert (mirror / "vllm-ops-test-marker").exists()
    git_lines = [line for line in Path(result["log_path"]).read_text().splitlines() if "$ git" in line]
    assert f"$ git --git-dir {mirror} fetch" in git_lines[0]
    assert not [line for line in git_lines if " init " in line]
    assert [line for line in git_lines if " clone " in line] == [  # only the build's checkout, from the mirror
        line for line in git_lines if f" clone --quiet --shared --no-checkout {mirror} " in line
    ]
    # Python-only bump: the compiled parts come from main's release (tinypkg ignores them, vLLM does not).
    assert result["precompiled"] is True
    assert f"precompiled from the wheel of release {results['main']['release_name']}" in result["precompiled_reason"]
    manifest = json.loads(Path(result["release"], "manifest.json").read_text())
    assert manifest["added_env"]["VLLM_PRECOMPILED_WHEEL_LOCATION"] == results["main"]["wheel"]
    assert manifest["inputs"]["precompiled"] is True and manifest["precompiled_reason"] == result["precompiled_reason"]


def _fake_current(root: Path) -> None:
    old = root / "releases" / "000000000000-00000000"
    old.mkdir(parents=True)
    write_json_atomic(str(old / "manifest.json"), {"schema": 1, "name": old.name})
    os.symlink("releases/" + old.name, root / "current")


def _assert_nothing_left(root: Path, name_prefix: str) -> None:
    assert [n for n in os.listdir(root / "releases") if n.startswith(name_prefix)] == []
    assert os.listdir(root / "build") == []
    assert os.readlink(root / "current") == "releases/000000000000-00000000"


@SLOW
def _setup_seconds(tmp_path: Path) -> float:
    """How long the steps before the wheel build take on this machine now (they are mostly the venv)."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "probe-venv")], check=True, capture_output=True)
    return time.monotonic() - started


def _build_until_timeout(tiny, pip_args, root: Path, marker: Path, budget: int):
    """A build of `slow` (its setup.py writes the marker, then sleeps) under `budget` seconds, with the
    statuses a poller saw, and how long it took."""
    _fake_current(root)
    env = {"TINY_SLOW_MARKER": str(marker)}
    opts = options(tiny, root, "slow", pip_args, build_timeout=budget, build_isolation=False, build_env=env)
    opts.run_id = "slow-run"
    seen = []
    stop = threading.Event()

    def watch() -> None:  # what the role's poll loop sees while the build runs
        while not stop.wait(0.4):
            with contextlib.suppress(OSError, ValueError):
                seen.append(json.loads((root / "build-status.json").read_text()))

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.monotonic()
    try:
        with pytest.raises(BuildError) as info:
            build(opts)
    finally:
        stop.set()
        watcher.join()
    return info, seen, time.monotonic() - started


@SLOW
def test_timeout_kills_the_build_and_leaves_no_release(tiny, pip_args, tmp_path):
    """The deadline must strike while the wheel builds. The steps before it (venv ...) take what the machine
    gives them, so the budget is derived from a measured venv, and doubled when the build did not start."""
    shas = tiny[1]
    budget = max(12, int(3 * _setup_seconds(tmp_path) + 6))
    for attempt in range(4):
        root = tmp_path / f"opt-vllm-{attempt}"
        marker = tmp_path / f"slow-{attempt}.pid"
        info, seen, took = _build_until_timeout(tiny, pip_args, root, marker, budget)
        if marker.exists():  # the sleeping setup.py did start: the deadline struck during the build
            break
        budget *= 2
    assert marker.exists(), f"the wheel build never started within {budget // 2}s"
    building = [status for status in seen if status["stage"] == "build"]
    assert {status["run_id"] for status in seen} == {"slow-run"}
    assert len({status["elapsed"] for status in building}) >= 2  # rewritten while the command runs
    assert any(status["last_line"].startswith("[") and "$ " in status["last_line"] for status in building)
    final = json.loads((root / "build-status.json").read_text())
    assert final["stage"] == "failed" and "timed out" in final["last_line"]
    assert set(final["stage_seconds"]) == {"resolve", "fetch", "build"}
    assert budget <= took < budget + _builder.KILL_GRACE + 30  # the deadline, not the 600 s sleep
    message = str(info.value)
    pid, tmpdir = marker.read_text().split()
    assert not process_alive(int(pid))
    assert f"timed out: build_timeout={budget}s" in message
    logs = list((root / "logs").glob(f"build-{shas['slow'][:12]}-*.log"))
    assert len(logs) == 1 and str(logs[0]) in message
    assert "TIMEOUT after" in message  # the log's last lines are in the message
    assert "TIMEOUT after" in logs[0].read_text()
    # pip's build environments were under the build directory, and went with it
    assert Path(tmpdir).parent.parent == root / "build" and Path(tmpdir).name == "tmp"
    _assert_nothing_left(root, shas["slow"][:12])
    assert not (root / "wheels" / shas["slow"][:12]).exists()


@SLOW
def test_compile_error_names_the_cause_and_keeps_the_log(tiny, pip_args, tmp_path):
    shas = tiny[1]
    root = tmp_path / "opt-vllm"
    _fake_current(root)
    with pytest.raises(BuildError) as info:
        build(options(tiny, root, "broken", pip_args, build_isolation=False))
    message = str(info.value)
    assert "building the wheel failed with exit code 1" in message
    assert "fake compiler error" in message
    log = re.search(r"Full log: (\S+)", message)
    assert log and Path(log.group(1)).is_file()
    _assert_nothing_left(root, shas["broken"][:12])


@pytest.mark.parametrize(
    ("ref", "extra", "expected"),
    [
        ("main", {"expected_commit": "deadbeef"}, "not the expected_commit deadbeef"),
        ("no-such-branch", {}, "ref 'no-such-branch' not found"),
        ("refs/pull/7/head", {}, "ref 'refs/pull/7/head' does not exist"),
        ("main", {"repo": "https://ci:hunter22@127.0.0.1:9/vllm.git"}, "cannot reach repository https://127.0.0.1:9/"),
        ("main", {"python": "python-that-does-not-exist"}, "python 'python-that-does-not-exist' not found"),
    ],
)
def test_fails_before_building_and_writes_only_the_status(tiny, pip_args, tmp_path, ref, extra, expected):
    opts = options(tiny, tmp_path / "root", ref, pip_args, run_id="run-1")
    for key, value in extra.items():
        setattr(opts, key, value)
    with pytest.raises(BuildError, match=re.escape(expected)) as info:
        build(opts)
    assert "hunter22" not in str(info.value)
    assert os.listdir(tmp_path / "root") == ["build-status.json"]  # a poller learns of the failure at once
    status_text = (tmp_path / "root" / "build-status.json").read_text()
    status = json.loads(status_text)
    assert (status["run_id"], status["stage"]) == ("run-1", "failed")
    assert expected in status["last_line"] and "hunter22" not in status_text


def test_unknown_full_sha_fails_before_the_venv(tiny, pip_args, tmp_path):
    root = tmp_path / "root"
    with pytest.raises(BuildError, match=f"commit {'ab' * 20} does not exist in {tiny[0]}"):
        build(options(tiny, root, "ab" * 20, pip_args))
    assert not (root / "releases").exists() and not (root / "wheels").exists()
    assert list((root / "logs").glob("build-abababababab-*.log"))  # the log says what was tried


def test_expected_commit_prefix_that_matches_passes(tiny, pip_args, tmp_path):
    shas = tiny[1]
    opts = options(tiny, tmp_path / "root", "main", pip_args, expected_commit=shas["c3"][:10].upper())
    assert build(opts, check_mode=True)["commit"] == shas["c3"]


@pytest.mark.parametrize("key", ["main", "short", "refs/pull/1/head"])
def test_check_mode_writes_nothing(tiny, pip_args, tmp_path, key):
    shas = tiny[1]
    root = tmp_path / "root"
    result = build(options(tiny, root, ref_of(tiny, key), pip_args), check_mode=True)
    assert (result["changed"], result["built"], result["wheel"], result["log_path"]) == (True, False, None, None)
    if key == "short":  # no mirror yet, and check mode may not create one
        assert result["commit"] is None and "would fetch" in result["msg"]
    else:
        commit = shas[REFS[key]]
        assert result["commit"] == commit and result["release_name"].startswith(commit[:12])
        assert result["msg"] == f"would build {result['release_name']}"
    assert not root.exists()


@SLOW
def test_check_mode_uses_an_existing_mirror_for_a_short_sha(tiny, fleet, pip_args):
    root, results = fleet
    result = build(options(tiny, root, ref_of(tiny, "short"), pip_args), check_mode=True)
    assert (result["changed"], result["commit"]) == (False, results["short"]["commit"])


@SLOW
def test_wheel_option_installs_without_building(tiny, fleet, pip_args, tmp_path):
    """Build once, distribute: another host installs the wheel and names the release the same."""
    results = fleet[1]
    built = results["main"]
    root = tmp_path / "other-host"
    # As the role does: the wheel's own decision (a full build here), so nothing has to be fetched to name it.
    assert built["precompiled"] is False
    result = build(options(tiny, root, "main", pip_args, wheel=built["wheel"], precompiled="never"))
    assert (result["changed"], result["built"]) == (True, False)
    assert result["release_name"] == built["release_name"]
    assert result["wheel_sha256"] == built["wheel_sha256"]
    assert Path(result["wheel"]).parent == root / "wheels" / built["release_name"]
    manifest = json.loads(Path(result["release"], "manifest.json").read_text())
    assert manifest["source"] == "wheel" and manifest["commit"] == built["commit"]
    assert installed_version(os.path.join(result["release"], "venv")) == manifest["version"]
    assert not (root / "src").exists()  # nothing fetched


@SLOW
def test_a_given_wheel_with_another_sha256_than_its_build_is_refused_before_anything_changes(
    tiny, fleet, pip_args, tmp_path
):
    """Issue 28 case 2: a wheel altered after its build reached a host (the controller path) and was installed."""
    built = fleet[1]["main"]
    tampered = tmp_path / "incoming" / Path(built["wheel"]).name
    tampered.parent.mkdir()
    tampered.write_bytes(Path(built["wheel"]).read_bytes() + b"appended by someone")
    root = tmp_path / "other-host"
    sha = built["wheel_sha256"]
    opts = options(tiny, root, "main", pip_args, wheel=str(tampered), precompiled="never", wheel_sha256=sha)
    with pytest.raises(BuildError, match=f"not {built['wheel_sha256']} \\(wheel_sha256, the build's\\)"):
        build(opts)
    assert not list(root.glob("releases/*/manifest.json"))
    assert not list(root.glob("wheels/*/*.whl")), "the altered wheel was kept for a later run to reuse"
    # the same sha256 in capitals, as another tool may print it
    opts = options(tiny, root, "main", pip_args, wheel=built["wheel"], precompiled="never", wheel_sha256=sha.upper())
    assert build(opts)["wheel_sha256"] == built["wheel_sha256"]


@SLOW
@pytest.mark.parametrize("used", [True, False], ids=["builder-precompiled", "builder-full"])
def test_a_wheel_under_auto_takes_the_builders_decision_and_a_later_lookup_accepts_it(
    tiny, fleet, pip_args, tmp_path, used
):
    """The fleet's wheel hosts: auto with the building host's decision names the release as that host did,
    fetches nothing, and records an auto decision, so the deploy's next look (auto, no wheel) finds it."""
    built = fleet[1]["main"]
    root = tmp_path / "wheel-host"
    variant = "always" if used else "never"
    expected = build(options(tiny, tmp_path / "empty", "main", pip_args, precompiled=variant), check_mode=True)
    carried = {"wheel_precompiled": used, "wheel_precompiled_reason": built["precompiled_reason"]}
    result = build(options(tiny, root, "main", pip_args, wheel=built["wheel"], **carried))
    assert (result["changed"], result["built"], result["precompiled"]) == (True, False, used)
    assert result["release_name"] == expected["release_name"]
    manifest = json.loads(Path(result["release"], "manifest.json").read_text())
    assert manifest["precompiled_details"]["mode"] == "auto"
    assert "decided where the wheel was built" in manifest["precompiled_reason"]
    assert manifest["precompiled_reason"].endswith(": " + built["precompiled_reason"])  # the builder's, carried
    assert not (root / "src").exists()  # nothing fetched
    again = build(options(tiny, root, "main", pip_args), check_mode=True)
    assert (again["changed"], again["release_name"]) == (False, result["release_name"])


@SLOW
def test_uv_installer_builds_the_same_commit_as_its_own_release(tiny, fleet, pip_args, uv_on_path):
    root, results = fleet
    result = build(options(tiny, root, "main", pip_args, installer="auto"))  # auto: uv is on PATH now
    assert (result["changed"], result["built"], result["commit"]) == (True, True, results["main"]["commit"])
    assert result["release_name"] != results["main"]["release_name"]  # the installer is a build input
    manifest = json.loads(Path(result["release"], "manifest.json").read_text())
    assert manifest["inputs"]["installer"] == "uv"
    assert "PEP 517 build_wheel of setuptools.build_meta in the same process" in Path(result["log_path"]).read_text()
    assert installed_version(os.path.join(result["release"], "venv")) == manifest["version"]


def test_uv_requested_but_missing(tiny, pip_args, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BuildError, match="installer 'uv' requested but `uv` is not on PATH nor at"):
        build(options(tiny, tmp_path / "root", "main", pip_args, installer="uv"), check_mode=True)


@SLOW
@pytest.mark.engine
def test_fixture_engine_python_only_pull_request_is_built_precompiled(pip_args, tmp_path, monkeypatch):
    """The fixture engine (a vLLM stand-in with real C extensions): main in full, then its PR head (a
    Python-only change, installed from a PR head like z-lab's) with main's compiled modules."""
    monkeypatch.setattr(_wheel_overlay, "MIN_SIZE", 1)  # the engine's .so files are small: overlay them all
    engine_repo = pytest.importorskip("ansible_collections.vllm_ops.dflash.tests.helpers.engine_repo")
    repo = tmp_path / "engine"
    refs = engine_repo.create_engine_repo(repo)
    root = tmp_path / "root"

    def engine_options(ref: str, **kwargs) -> BuildOptions:
        kwargs.setdefault("root", str(root))
        return BuildOptions(str(repo), ref, python=sys.executable, pip_args=pip_args, **kwargs)

    main = build(engine_options("main"))
    assert (main["built"], main["precompiled"]) == (True, False)
    assert "but no base wheel" in main["precompiled_reason"]
    pull = build(engine_options("refs/pull/1/head"))
    assert (pull["built"], pull["commit"], pull["precompiled"]) == (True, refs["refs/pull/1/head"], True)
    merge_base = refs["refs/heads/main"][:12]
    assert pull["precompiled_reason"] == (
        f"1 file changed since the base wheel's commit {merge_base} (the manifest of release {main['release_name']}),"
        f" none under vLLM's compiled paths: precompiled from the wheel of release {main['release_name']} "
        "(same compiled sources)"
    )
    log = Path(pull["log_path"]).read_text()
    # The engine's setup.py copied the .so placeholders out of the stub; the overlay put main's back.
    stub = re.search(r"wheel overlay: setup.py extracts from the stub (\S+)", log)
    assert stub and f"Using precompiled extensions from {stub.group(1)}" in log
    assert re.search(rf"wheel overlay: 3 members \(\d+ bytes\) copied from {re.escape(main['wheel'])}", log)
    assert f"precompiled: yes: {pull['precompiled_reason']}" in log
    venv_python = os.path.join(pull["release"], "venv", "bin", "python")
    code = "import vllm, vllm._C, vllm._moe_C, vllm.cumem_allocator; print(vllm.__version__, vllm._C.add(2, 3))"
    out = subprocess.run([venv_python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [engine_repo.scm_version(repo, pull["commit"]), "5"]
    manifest = json.loads(Path(pull["release"], "manifest.json").read_text())
    assert manifest["version"] == out[0] and manifest["precompiled_details"]["base_release"] == main["release_name"]
    _assert_linked_install(pull, manifest, log)
    assert manifest["wheel_tags"]["retagged"] is False  # main's wheel was built here: the same tags
    assert manifest["wheel_tags"]["reason"].startswith("the build's tags are the base wheel's")
    # A base wheel of other tags (vLLM's releases are manylinux_2_28; a precompiled build of real vLLM is
    # tagged for the build host's interpreter): the PR's wheel holds only its libraries, so takes its tags.
    tags = f"cp38-abi3-manylinux_2_28_{platform.machine()}"
    portable = build(
        engine_options(
            "refs/pull/1/head",
            precompiled_wheel=str(_tagged_copy(Path(main["wheel"]), tmp_path / "base", tags)),
            root=str(tmp_path / "portable"),
        )
    )
    assert Path(portable["wheel"]).name.endswith(f"-{tags}.whl")
    assert (
        f"wheel tags: tagged {tags} like the base wheel (was cp38-abi3-linux_" in Path(portable["log_path"]).read_text()
    )
    portable_manifest = json.loads(Path(portable["release"], "manifest.json").read_text())
    _assert_linked_install(portable, portable_manifest, Path(portable["log_path"]).read_text())
    installed_wheel = next(Path(portable["release"], "venv").glob("lib/python*/site-packages/vllm-*.dist-info/WHEEL"))
    assert f"Tag: {tags}" in installed_wheel.read_text()  # the installed WHEEL is the kept wheel's
    venv_python = os.path.join(portable["release"], "venv", "bin", "python")
    assert (
        subprocess.run([venv_python, "-c", code], capture_output=True, text=True, check=True).stdout.split()[1] == "5"
    )
    # A linked install that is refused installs the overlaid wheel over it: same release, slower.
    refused = _wheel_overlay.OverlayError("the installed vllm/_C.so is not the placeholder of vllm/_C.so")

    def refuse(*args, **kwargs):
        raise refused

    monkeypatch.setattr(_builder, "link_installed", refuse)
    for kept in (pull["release"], os.path.dirname(pull["wheel"])):
        shutil.rmtree(kept)  # built again from scratch
    forced = build(engine_options("refs/pull/1/head"))
    assert forced["release_name"] == pull["release_name"]
    forced_manifest = json.loads(Path(forced["release"], "manifest.json").read_text())
    assert forced_manifest["install"] == {"how": "wheel", "linked_install_refused": str(refused)}
    forced_python = os.path.join(forced["release"], "venv", "bin", "python")
    out = subprocess.run([forced_python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [engine_repo.scm_version(repo, pull["commit"]), "5"]
    assert (
        f"linked install refused ({refused}); installing {forced['wheel']} over it"
        in Path(forced["log_path"]).read_text()
    )
    # The same commit built in full is another release; a C change is never built precompiled.
    assert build(engine_options("refs/pull/1/head", precompiled="never"), check_mode=True)["release_name"] not in (
        pull["release_name"],
        None,
    )
    broken = build(engine_options("fault/broken-ext"), check_mode=True)
    assert broken["precompiled"] is False and "1 under vLLM's compiled paths" in broken["precompiled_reason"]
    assert "(csrc/ops.c)" in broken["precompiled_reason"] and broken["precompiled_reason"].endswith(": full build")


def _tagged_copy(wheel: Path, directory: Path, tags: str) -> Path:
    """`wheel` with other tags (WHEEL's Tag line, RECORD and the file name), every member else the same."""
    directory.mkdir()
    dest = directory / ("-".join([*wheel.name[: -len(".whl")].split("-")[:-3], tags]) + ".whl")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as out:
        members = {name: source.read(name) for name in source.namelist()}
        record = next(name for name in members if name.endswith(".dist-info/RECORD"))
        wheel_file = record[: -len("RECORD")] + "WHEEL"
        lines = [line for line in members[wheel_file].decode().splitlines() if not line.startswith("Tag:")]
        members[wheel_file] = ("\n".join([*lines, f"Tag: {tags}"]) + "\n").encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(members[wheel_file]).digest()).rstrip(b"=").decode()
        rows = [row for row in csv.reader(io.StringIO(members[record].decode())) if row]
        rows = [
            [wheel_file, f"sha256={digest}", str(len(members[wheel_file]))] if r[0] == wheel_file else r for r in rows
        ]
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        members[record] = text.getvalue().encode()
        for name, data in members.items():
            out.writestr(name, data)
    return dest


def _assert_linked_install(result, manifest, log) -> None:
    """The release holds the wheel built from the stub, its placeholders hard links to the base wheel's
    members (shared by every release of that base wheel); RECORD and direct_url.json as the kept wheel's."""
    install = manifest["install"]
    assert (install["how"], install["linked"], install["copied"]) == ("linked", 3, 0)
    assert f"linked install: 3 members hard-linked (0 copied, {install['linked_bytes']} bytes)" in log
    dist_info = next(Path(result["release"], "venv").glob("lib/python*/site-packages/*.dist-info/direct_url.json"))
    site = dist_info.parent.parent
    linked = [p for p in (site / "vllm").rglob("*.so") if p.samefile(Path(install["members"], p.relative_to(site)))]
    assert len(linked) == 3
    for path, digest, size in (line.split(",") for line in (dist_info.parent / "RECORD").read_text().splitlines()):
        if digest:  # the installed files are what RECORD says, the linked ones included
            data = (site / path).read_bytes()
            assert (digest, int(size)) == (_wheel_overlay.record_hash(hashlib.sha256(data).digest()), len(data))
    direct = json.loads(dist_info.read_text())
    assert direct["url"] == f"file://{result['wheel']}"
    assert direct["archive_info"].get("hashes", {"sha256": result["wheel_sha256"]}) == {
        "sha256": result["wheel_sha256"]
    }


def test_inputs_hash_and_name():
    base = {"python": "/usr/bin/python3", "python_version": "3.11.2", "installer": "pip", "build_env": {"A": "1"}}
    assert inputs_hash(base) == inputs_hash(dict(reversed(list(base.items()))))
    for key, value in [("python_version", "3.12.0"), ("installer", "uv"), ("build_env", {"A": "2"})]:
        assert inputs_hash({**base, key: value}) != inputs_hash(base)
    assert release_name("a" * 40, "0123456789" * 6) == "aaaaaaaaaaaa-01234567"


def _release(root: Path, name: str, built_at: str) -> None:
    write_json_atomic(str(root / "releases" / name / "manifest.json"), {"name": name, "built_at": built_at})
    (root / "wheels" / name).mkdir(parents=True)


def test_prune_keeps_newest_current_previous_and_the_release_made(tmp_path):
    root = tmp_path
    names = [f"{i:012x}-00000000" for i in range(6)]
    for i, name in enumerate(names):
        _release(root, name, f"2026-01-0{i + 1}T00:00:00Z")
    (root / "releases" / "ffffffffffff-0000dead").mkdir()
    state = {"schema": 1, "current": names[0], "previous": names[1], "releases": {}}
    write_json_atomic(str(root / "state.json"), state)
    os.symlink("releases/" + names[0], root / "current")
    # keep 2: names[5] and names[4] (newest by built_at), plus current, previous and the one just made
    removed = prune_after_build(str(root), 2, made=names[2])
    assert sorted(removed) == sorted([names[3], "ffffffffffff-0000dead"])
    kept = sorted([names[0], names[1], names[2], names[4], names[5]])
    assert sorted(os.listdir(root / "releases")) == kept
    assert sorted(os.listdir(root / "wheels")) == kept
    # vllm_release's rule: state.json adopts what is left and forgets what went
    assert sorted(read_json(str(root / "state.json"), {})["releases"]) == kept


def test_prune_keeps_the_rollback_target_and_spends_no_place_on_failed_releases(tmp_path):
    names = [f"{i:012x}-00000000" for i in range(6)]
    for i, name in enumerate(names):
        _release(tmp_path, name, f"2026-01-0{i + 1}T00:00:00Z")
    # names[0] served and passed its gate; then names[1..4] were tried and failed; names[5] serves now,
    # and `previous` points at a failed try (a rollback after it re-activated names[5]).
    failed = {name: {"status": "failed"} for name in names[1:5]}
    state = {
        "schema": 1,
        "current": names[5],
        "previous": names[4],
        "releases": {names[0]: {"status": "good"}, names[5]: {"status": "good"}, **failed},
        "history": [{"action": "activate", "release": n} for n in (names[0], names[5], names[4], names[5])],
    }
    write_json_atomic(str(tmp_path / "state.json"), state)
    os.symlink("releases/" + names[5], tmp_path / "current")
    removed = prune_after_build(str(tmp_path), 1, made=names[5])
    # the failed ones go (but `previous`), and the good one a rollback would go to stays
    assert sorted(removed) == sorted(names[1:4])
    assert sorted(os.listdir(tmp_path / "releases")) == sorted([names[0], names[4], names[5]])


def test_prune_trusts_the_current_link_and_can_be_disabled(tmp_path):
    names = [f"{i:012x}-00000000" for i in range(3)]
    for i, name in enumerate(names):
        _release(tmp_path, name, f"2026-01-0{i + 1}T00:00:00Z")
    os.symlink("releases/" + names[0], tmp_path / "current")
    assert prune_after_build(str(tmp_path), 0, made=names[2]) == []
    assert prune_after_build(str(tmp_path), 1, made=names[2]) == [names[1]]


@SLOW
def test_inputs_cover_torch_arch_list_and_the_precompiled_decision(tiny, fleet, pip_args, monkeypatch):
    root, results = fleet
    manifest = json.loads(Path(results["main"]["release"], "manifest.json").read_text())
    assert {"torch", "torch_cuda_arch_list", "precompiled"} <= set(manifest["inputs"])
    assert manifest["max_jobs"]["source"].startswith("derived: ")
    assert manifest["added_env"]["PIP_CACHE_DIR"] == str(root / "cache" / "pip")
    names = {results["main"]["release_name"]}
    for env in ({"TORCH_CUDA_ARCH_LIST": "9.0"}, {"TORCH_CUDA_ARCH_LIST": "9.0 10.0"}):
        names.add(build(options(tiny, root, "main", pip_args, build_env=env), check_mode=True)["release_name"])
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")  # set on the host, not in build_env: still an input
    names.add(build(options(tiny, root, "main", pip_args), check_mode=True)["release_name"])
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    names.add(build(options(tiny, root, "main", pip_args, precompiled="always"), check_mode=True)["release_name"])
    assert len(names) == 5


def test_precompiled_env_belongs_to_the_option(tiny, pip_args, tmp_path):
    opts = options(tiny, tmp_path / "root", "main", pip_args, build_env={"VLLM_USE_PRECOMPILED": "1"})
    with pytest.raises(BuildError, match="build_env sets VLLM_USE_PRECOMPILED; the `precompiled` option decides"):
        build(opts, check_mode=True)
    with pytest.raises(BuildError, match="precompiled_base 'x#' is not a ref"):
        build(options(tiny, tmp_path / "root", "main", pip_args, precompiled_base="x#"), check_mode=True)


def test_auto_reuses_only_releases_whose_compiled_modules_were_checked(tiny, pip_args, tmp_path):
    root = tmp_path / "root"
    forced = build(options(tiny, root, "main", pip_args, precompiled="always"), check_mode=True)
    manifest_path = root / "releases" / forced["release_name"] / "manifest.json"
    for mode, reused in (("always", False), ("auto", True)):
        write_json_atomic(str(manifest_path), {"precompiled": True, "precompiled_details": {"mode": mode}})
        again = build(options(tiny, root, "main", pip_args), check_mode=True)
        assert (again["changed"], again["release_name"] == forced["release_name"]) == (not reused, reused), mode


def test_a_separate_upstream_is_fetched_into_the_mirror_for_the_decision(tiny, tmp_path):
    repo, shas = tiny
    upstream = tmp_path / "upstream"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(upstream)], check=True)
    mirror = mirror_path(str(tmp_path / "root"), str(repo))
    log = str(tmp_path / "fetch.log")
    deadline = Deadline(60)
    ensure_mirror(str(repo), mirror, 60, log, ["refs/pull/1/head"])
    base = _build_decision.fetch_base(str(repo), mirror, f"{upstream}#v1.0.0", deadline, log)
    assert base == shas["c1"]
    opts = BuildOptions(str(repo), "main", root=str(tmp_path / "root"), precompiled_base=f"{upstream}#main")
    decision = _build_decision.fetch_base_and_decide(opts, str(repo), mirror, shas["p1"], {}, deadline, log)
    assert decision.reason.startswith(f"1 file changed since merge-base {shas['c2'][:12]} with {upstream}#main")
    gone = f"{tmp_path / 'gone'}#main"
    opts.precompiled_base = gone  # auto never fails a build over its base
    decision = _build_decision.fetch_base_and_decide(opts, str(repo), mirror, shas["p1"], {}, deadline, log)
    assert decision.use is False and decision.reason.startswith(f"precompiled_base {gone} is unusable")
    assert decision.reason.endswith(": full build")


def test_pip_args_credentials_become_netrc_entries_and_leave_the_urls():
    args = ["-i", "https://ci:p%40ss@pypi.example.com/simple", "--find-links=https://tok@wheels.example.com/x/"]
    args += ["pkg @ https://ci:p%40ss@pypi.example.com/pkg.whl", "--no-index", "ssh://git@host/x.git"]
    cleaned, netrc = _builder._credentials_off_argv(args)
    assert cleaned == [
        "-i", "https://pypi.example.com/simple", "--find-links=https://wheels.example.com/x/",
        "pkg @ https://pypi.example.com/pkg.whl", "--no-index", "ssh://git@host/x.git",
    ]  # fmt: skip
    assert netrc == "machine pypi.example.com login ci password p@ss\nmachine wheels.example.com login tok\n"
    assert _builder._credentials_off_argv(["--no-index"]) == (["--no-index"], "")
    with pytest.raises(_build.BuildError, match=r"two different credentials for h\.example"):
        _builder._credentials_off_argv(["https://a:1@h.example/s", "https://b:2@h.example/s"])
    with pytest.raises(_build.BuildError, match="cannot be handed over without the command line"):
        _builder._credentials_off_argv(["https://a:b%20c@h.example/s"])


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_pip_and_uv_take_the_pip_args_credentials_from_the_netrc(tmp_path, installer):
    """The other half of issue 28 case 9's fix: the installers do authenticate with what NETRC holds, so an
    index URL without its credentials on the argv still gets them (an index that answers 401 without)."""
    import http.server

    headers = []

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            headers.append(self.headers.get("Authorization"))
            if not self.headers.get("Authorization"):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="index"')
            else:
                self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://ci:s3cr3t@127.0.0.1:{server.server_address[1]}/simple"
        args, netrc_text = _builder._credentials_off_argv(["--index-url", url])
        netrc = tmp_path / "netrc"
        netrc.write_text(netrc_text)
        env = dict(os.environ, NETRC=str(netrc), PIP_NO_INPUT="1", UV_CACHE_DIR=str(tmp_path / "uv-cache"))
        if installer == "pip":
            argv = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp_path), *args, "absent-pkg"]
        else:
            bin_dir = uv_bin_dir()
            if bin_dir is None:
                pytest.skip("no uv binary (could not install it into .cache/uv)")
            argv = [str(bin_dir / "uv"), "pip", "install", "--dry-run", "--python", sys.executable, *args, "absent-pkg"]
        subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False)  # absent-pkg: 404, fails
    finally:
        server.shutdown()
    assert "s3cr3t" not in " ".join(argv)
    assert "Basic " + base64.b64encode(b"ci:s3cr3t").decode() in headers


@SLOW
def test_a_real_build_within_a_disk_budget_frees_the_oldest_cache_first(tiny, pip_args, tmp_path):
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._disk_budget import NEED_FACTOR, Usage
    from ansible_collections.vllm_ops.dflash.plugins.module_utils._releases import run_action

    root = tmp_path / "opt-vllm"
    first = build(options(tiny, root, "main", pip_args, disk_budget_gb=50.0))
    disk = first["disk"]
    assert disk["freed"] == [] and disk["fits"] is True and disk["used_bytes_after"] > disk["used_bytes_before"]
    run_action(str(root), "activate", release=first["release_name"])
    stale = root / "cache" / "pip" / "stale.bin"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"x" * 20 * 1024**2)
    os.utime(stale, (1_000_000_000, 1_000_000_000))
    os.utime(stale.parent, (1_000_000_000, 1_000_000_000))
    usage = Usage(str(root))
    (release,) = [part for part in usage.kept if part.kind == "release"]
    budget = usage.used + int(release.size * NEED_FACTOR) - 10 * 1024**2  # over by 10 MiB before the build
    result = build(options(tiny, root, "v1.0.0", pip_args, disk_budget_gb=budget / 1024**3))
    assert result["built"] is True
    freed = result["disk"]["freed"]
    assert freed[0]["path"] == str(root / "cache" / "pip") and freed[0]["bytes"] >= 20 * 1024**2, freed
    assert (root / "releases" / first["release_name"] / "manifest.json").is_file()  # serving: never freed
    assert (Path(result["release"]) / "manifest.json").is_file()
    assert not stale.exists()
