"""The model staging core: the hub path against the fake hub (test equipment), the local path for real."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
from ansible_collections.vllm_ops.dflash.plugins.module_utils._models import ModelSpec, StageError, stage_models
from ansible_collections.vllm_ops.dflash.tests.helpers.fake_hub import FakeHub, git_blob_sha1, serve

CONFIG = json.dumps({"architectures": ["DFlashDraftModel"], "num_hidden_layers": 1}).encode()
WEIGHTS = bytes(range(256)) * 64  # a small safetensors-like binary, stored as LFS


@functools.lru_cache(maxsize=None)  # one import of huggingface_hub (a second of CPU) per python, not per stage()
def _has_hub(python: str) -> bool:
    return subprocess.run([python, "-c", "import huggingface_hub"], capture_output=True, check=False).returncode == 0


def hub_python() -> str:
    """A python with huggingface_hub: this one, or VLLM_OPS_HF_PYTHON (requirements-test.txt pins it for CI)."""
    for candidate in (os.environ.get("VLLM_OPS_HF_PYTHON"), sys.executable):
        if candidate and _has_hub(candidate):
            return candidate
    pytest.skip("no python with huggingface_hub: pip install -r requirements-test.txt or set VLLM_OPS_HF_PYTHON")


@pytest.fixture
def hub():
    hub = FakeHub()
    hub.first = hub.add_commit(
        "org/drafter",
        {"config.json": CONFIG, "model.safetensors": WEIGHTS, "README.md": b"not staged"},
        lfs=("model.safetensors",),
    )
    with serve(hub) as url:
        hub.url = url
        yield hub


def stage(hub, tmp_path, revision, check_mode=False, **spec):
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_TOKEN="s3cr3t-hub-token")
    model = ModelSpec("drafter", "org/drafter", revision, allow_patterns=["*.json", "*.safetensors"], **spec)
    return stage_models(
        [model],
        str(tmp_path / "hub"),
        record=str(tmp_path / "models.json"),
        python=hub_python(),
        env=env,
        timeout=120,
        check_mode=check_mode,
    )


@pytest.mark.slow
def test_a_pinned_commit_is_downloaded_verified_and_recorded(hub, tmp_path):
    planned = stage(hub, tmp_path, hub.first, check_mode=True)
    assert planned["changed"] is True and not (tmp_path / "hub").exists() and not (tmp_path / "models.json").exists()
    result = stage(hub, tmp_path, hub.first)
    model = result["models"]["drafter"]
    snapshot = tmp_path / "hub" / "models--org--drafter" / "snapshots" / hub.first
    assert (model["commit"], model["snapshot"], model["moving_revision"]) == (hub.first, str(snapshot), False)
    assert sorted(os.listdir(snapshot)) == ["config.json", "model.safetensors"]  # allow_patterns kept README out
    assert model["files"]["model.safetensors"] == {
        "sha256": hashlib.sha256(WEIGHTS).hexdigest(),
        "size": len(WEIGHTS),
        "verified_by": "sha256 (LFS oid)",
    }
    assert model["files"]["config.json"]["verified_by"] == "git blob sha1"
    record = json.loads((tmp_path / "models.json").read_text())
    assert record["files"][str(snapshot / "config.json")] == hashlib.sha256(CONFIG).hexdigest()
    assert record["models"]["drafter"]["commit"] == hub.first
    assert "s3cr3t-hub-token" not in json.dumps(result)
    assert any(auth for method, path, auth in hub.requests if "/resolve/" in path)  # the token reached the hub
    # A re-run hashes what is staged and downloads nothing.
    downloads = dict(hub.downloads)
    again = stage(hub, tmp_path, hub.first)
    assert (again["changed"], hub.downloads) == (False, downloads)


@pytest.mark.slow
def test_a_new_revision_stages_beside_the_old_one_and_changes_the_record(hub, tmp_path):
    stage(hub, tmp_path, hub.first)
    second = hub.add_commit(
        "org/drafter", {"config.json": CONFIG, "model.safetensors": WEIGHTS[::-1]}, lfs=("model.safetensors",)
    )
    result = stage(hub, tmp_path, second)
    assert result["changed"] and result["record_changed"]
    assert result["diff"]["before"]["models"]["drafter"]["commit"] == hub.first
    assert os.path.isdir(result["models"]["drafter"]["snapshot"].replace(second, hub.first))  # old one kept


@pytest.mark.slow
def test_a_branch_is_refused_unless_opted_in_and_then_flagged(hub, tmp_path):
    with pytest.raises(StageError, match=r"revision 'main' of org/drafter is not a 40-hex commit.*allow_moving"):
        stage(hub, tmp_path, "main")
    result = stage(hub, tmp_path, "main", allow_moving_revision=True)
    assert (result["models"]["drafter"]["commit"], result["models"]["drafter"]["moving_revision"]) == (hub.first, True)


def test_an_unknown_revision_is_refused_before_anything_is_written(hub, tmp_path):
    with pytest.raises(StageError) as refused:
        stage(hub, tmp_path, "f" * 40)
    assert "org/drafter at revision " + "f" * 40 in str(refused.value) and "Fix:" in str(refused.value)
    assert not (tmp_path / "hub").exists() and not (tmp_path / "models.json").exists()


@pytest.mark.slow
def test_a_download_that_differs_from_the_listing_is_refused_and_removed(hub, tmp_path):
    hub.repos["org/drafter"].tamper[(hub.first, "model.safetensors")] = b"\x00" * len(WEIGHTS)
    with pytest.raises(StageError) as refused:
        stage(hub, tmp_path, hub.first)
    message = str(refused.value)
    assert f"org/drafter at revision {hub.first}" in message and "model.safetensors has sha256 (LFS oid)" in message
    snapshot = tmp_path / "hub" / "models--org--drafter" / "snapshots" / hub.first
    assert not (snapshot / "model.safetensors").exists() and not (tmp_path / "models.json").exists()


@pytest.mark.slow
def test_a_tampered_git_file_is_caught_by_its_blob_sha1(hub, tmp_path):
    hub.repos["org/drafter"].tamper[(hub.first, "config.json")] = CONFIG.replace(b"1", b"2")
    with pytest.raises(StageError, match=r"config.json has git blob sha1 .* the listing says " + git_blob_sha1(CONFIG)):
        stage(hub, tmp_path, hub.first)


VERIFY = """
import json, sys
import huggingface_hub
from huggingface_hub import HfApi
if not hasattr(HfApi, "verify_repo_checksums"):  # huggingface_hub < 1.1.0
    print(json.dumps({"version": huggingface_hub.__version__}))
    sys.exit(0)
found = HfApi(endpoint=sys.argv[1]).verify_repo_checksums("org/drafter", revision=sys.argv[2], cache_dir=sys.argv[3])
print(json.dumps({"missing": found.missing_paths, "mismatches": found.mismatches, "checked": found.checked_count}))
"""


@pytest.mark.slow
def test_why_not_verify_repo_checksums_it_checks_the_whole_repo_and_returns_no_digests(hub, tmp_path):
    """_models' top comment: huggingface_hub's verify_repo_checksums (1.1.0+) has no allow_patterns - a
    staged subset is reported incomplete - and returns mismatches only, not the sha256 of each file that
    the record needs; stage_models verifies the subset and records every file's sha256."""
    result = stage(hub, tmp_path, hub.first)
    files = result["models"]["drafter"]["files"]
    assert sorted(files) == ["config.json", "model.safetensors"]
    assert files["config.json"]["sha256"] == hashlib.sha256(CONFIG).hexdigest()  # a git file: no LFS sha256
    argv = [hub_python(), "-c", VERIFY, hub.url, hub.first, str(tmp_path / "hub")]
    env = dict(os.environ, HF_TOKEN="s3cr3t-hub-token")
    found = json.loads(subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout)
    if "version" in found:
        pytest.skip(f"huggingface_hub {found['version']} has no verify_repo_checksums (1.1.0 added it)")
    assert (found["missing"], found["mismatches"], found["checked"]) == (["README.md"], [], 2)


# --- the local path source, for real ------------------------------------------------------------------------
def local_model(tmp_path):
    source = tmp_path / "copied"
    source.mkdir()
    (source / "config.json").write_bytes(CONFIG)
    (source / "model.safetensors").write_bytes(WEIGHTS)
    (source / ".cache").mkdir()
    (source / ".cache" / "junk").write_text("x")
    return source


def stage_path(tmp_path, source, check_mode=False, checksums=None, revision="a" * 40):
    spec = ModelSpec("target", "org/target", revision, source="path", path=str(source), checksums=checksums)
    return stage_models([spec], str(tmp_path / "hub"), record=str(tmp_path / "models.json"), check_mode=check_mode)


def test_a_local_copy_is_laid_out_as_the_hf_cache_and_checked(tmp_path):
    source = local_model(tmp_path)
    sums = {"model.safetensors": hashlib.sha256(WEIGHTS).hexdigest()}
    assert stage_path(tmp_path, source, check_mode=True, checksums=sums)["changed"]
    assert not (tmp_path / "hub").exists()
    result = stage_path(tmp_path, source, checksums=sums)
    snapshot = tmp_path / "hub" / "models--org--target" / "snapshots" / ("a" * 40)
    assert sorted(os.listdir(snapshot)) == ["config.json", "model.safetensors"]
    assert os.path.islink(snapshot / "model.safetensors")
    assert os.readlink(snapshot / "model.safetensors") == "../../blobs/" + sums["model.safetensors"]
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS
    assert result["models"]["target"]["files"]["config.json"]["verified_by"] == "sha256 (checksums)"
    assert stage_path(tmp_path, source, checksums=sums)["changed"] is False
    shutil.rmtree(source)  # the staged copy stands alone
    assert (snapshot / "config.json").read_bytes() == CONFIG


def test_a_local_copy_with_a_wrong_checksum_is_refused_naming_the_file(tmp_path):
    source = local_model(tmp_path)
    with pytest.raises(StageError, match=r"org/target at revision a{40} .*model.safetensors has sha256"):
        stage_path(tmp_path, source, checksums={"model.safetensors": "0" * 64})
    with pytest.raises(StageError, match=r"tokenizer.json is not in the source path"):
        stage_path(tmp_path, source, checksums={"tokenizer.json": "0" * 64})
    assert not (tmp_path / "hub").exists() and not (tmp_path / "models.json").exists()


def test_a_changed_local_file_restages_and_changes_the_record(tmp_path):
    source = local_model(tmp_path)
    stage_path(tmp_path, source)
    (source / "config.json").write_bytes(CONFIG + b"\n")
    result = stage_path(tmp_path, source)
    assert result["changed"] and result["record_changed"]
    assert (
        tmp_path / "hub" / "models--org--target" / "snapshots" / ("a" * 40) / "config.json"
    ).read_bytes() == CONFIG + b"\n"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"repo_id": "not a repo", "revision": "a" * 40}, "is not a Hugging Face repo id"),
        ({"repo_id": "org/x", "revision": ""}, "has no revision"),
        (
            {"repo_id": "org/x", "revision": "v1.0", "source": "path", "path": "/x", "allow_moving_revision": True},
            "a local copy is named by the commit",
        ),
        ({"repo_id": "org/x", "revision": "a" * 40, "source": "path", "path": "relative"}, "absolute 'path'"),
        ({"repo_id": "org/x", "revision": "a" * 40, "checksums": {"f": "nope"}}, "is not a sha256"),
    ],
)
def test_bad_specs_are_refused_with_the_fix(kwargs, match):
    with pytest.raises(StageError, match=match) as refused:
        ModelSpec("m", **kwargs)
    assert "Fix:" in str(refused.value)


def test_a_python_without_huggingface_hub_is_named(tmp_path):
    spec = ModelSpec("m", "org/x", "a" * 40)
    with pytest.raises(StageError, match="huggingface_hub"):
        stage_models([spec], str(tmp_path / "hub"), python=sys.executable if _no_hub() else "/nonexistent/python")


def _no_hub() -> bool:
    return not _has_hub(sys.executable)


@pytest.mark.slow
def test_a_refused_drafter_leaves_the_target_unstaged_too(hub, tmp_path):
    target = hub.add_commit(
        "org/target", {"config.json": CONFIG, "model.safetensors": WEIGHTS}, lfs=("model.safetensors",)
    )
    env = dict(os.environ, HF_ENDPOINT=hub.url)
    specs = [ModelSpec("target", "org/target", target), ModelSpec("drafter", "org/drafter", "d" * 40)]
    with pytest.raises(StageError, match="org/drafter at revision " + "d" * 40):
        stage_models(specs, str(tmp_path / "hub"), record=str(tmp_path / "models.json"), python=hub_python(), env=env)
    assert not (tmp_path / "hub").exists() and hub.downloads == {}


def test_check_mode_plans_a_directory_the_role_has_not_copied_yet(tmp_path):
    spec = ModelSpec("drafter", "org/drafter", "a" * 40, source="path", path=str(tmp_path / "not-yet"))
    planned = stage_models([spec], str(tmp_path / "hub"), check_mode=True)
    assert planned["changed"] and planned["models"]["drafter"]["files"] == {}
    with pytest.raises(StageError, match=r"is not a directory\. Fix: copy the model there first"):
        stage_models([spec], str(tmp_path / "hub"))


# --- issue 28, case 16: a path source that reaches out of its directory ---------------------------------------
ROOT_ONLY = b"root-only content 0123456789"


@pytest.mark.parametrize("link", ["file", "directory"])
def test_a_link_out_of_the_source_path_is_refused_and_nothing_is_staged(tmp_path, link):
    # At 4893f05 a link to a root-only file was copied into the HF cache as a 0644 blob.
    source = local_model(tmp_path)
    secret = tmp_path / "elsewhere" / "shadow"
    secret.parent.mkdir()
    secret.write_bytes(ROOT_ONLY)
    secret.chmod(0o600)
    name = "tokenizer.json" if link == "file" else "extra"
    (source / name).symlink_to(secret if link == "file" else secret.parent)
    with pytest.raises(StageError) as error:
        stage_path(tmp_path, source)
    expected = f"tokenizer.json is a link out of the source path (to {secret})" if link == "file" else (
        f"extra is a link out of the source path (to {secret.parent})")  # fmt: skip
    assert expected in str(error.value) and "cp -L" in str(error.value)
    assert not (tmp_path / "hub").exists() and not (tmp_path / "models.json").exists()


def test_a_file_others_may_not_read_is_refused_not_published_0644(tmp_path):
    source = local_model(tmp_path)
    (source / "private.json").write_bytes(ROOT_ONLY)
    (source / "private.json").chmod(0o600)
    with pytest.raises(StageError, match=r"private.json may not be read by others \(mode 0600\)"):
        stage_path(tmp_path, source)
    assert not (tmp_path / "hub").exists()


def test_a_fifo_in_the_source_path_is_refused_not_read(tmp_path):
    # At 4893f05 hashing it blocked in open() for good: the module hung.
    import threading

    source = local_model(tmp_path)
    os.mkfifo(source / "pipe")
    box = {}

    def target():
        try:
            stage_path(tmp_path, source)
        except StageError as exc:
            box["error"] = str(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "staging hung on a FIFO in the source path"
    assert "pipe is not a regular file" in box["error"]


def test_a_link_inside_the_source_path_is_staged_and_blobs_are_0644(tmp_path):
    source = local_model(tmp_path)
    (source / "weights").mkdir()
    (source / "weights" / "model.safetensors").write_bytes(WEIGHTS)
    (source / "model.safetensors").unlink()
    (source / "model.safetensors").symlink_to("weights/model.safetensors")
    old = os.umask(0o077)  # a restrictive umask must not leave blobs the service cannot read
    try:
        stage_path(tmp_path, source)
    finally:
        os.umask(old)
    blobs = tmp_path / "hub" / "models--org--target" / "blobs"
    assert {stat.S_IMODE(p.stat().st_mode) for p in blobs.iterdir()} == {0o644}
    snapshot = tmp_path / "hub" / "models--org--target" / "snapshots" / ("a" * 40)
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS


def test_a_file_swapped_for_a_link_after_the_check_is_not_copied(tmp_path, monkeypatch):
    from ansible_collections.vllm_ops.dflash.plugins.module_utils import _models

    source = local_model(tmp_path)
    secret = tmp_path / "shadow"
    secret.write_bytes(ROOT_ONLY)
    secret.chmod(0o600)
    real_copy = _models._copy

    def swap_then_copy(*args, **kwargs):
        (source / "config.json").unlink()
        (source / "config.json").symlink_to(secret)
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(_models, "_copy", swap_then_copy)
    with pytest.raises(StageError, match=r"config.json is a link out of the source path"):
        stage_path(tmp_path, source)
    blobs = tmp_path / "hub" / "models--org--target" / "blobs"
    assert not blobs.exists() or all(p.read_bytes() != ROOT_ONLY for p in blobs.iterdir())
